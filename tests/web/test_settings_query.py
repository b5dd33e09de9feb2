"""The web layer's settings and files, and the Events page's query."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_adapters.web import (
    TokenMissing,
    WebSettings,
    WebSettingsError,
    _query,
    ensure_token,
    layer,
    load_settings,
    read_token,
    served_address,
)
from pulse_adapters.web._query import BadQuery, EventFilter, newest, parse_filter
from pulse_core import EventDraft, LayerContext, SqliteEventStore, SystemClock, register_kind


def test_no_settings_serve_loopback_on_8421() -> None:
    assert load_settings(None) == WebSettings(host="127.0.0.1", port=8421)
    assert load_settings({}) == WebSettings()


@pytest.mark.parametrize(("given", "names"), [
    ({"prot": 1}, ["unknown field `prot`", "did you mean `port`", "allowed: host, port"]),
    ({"port": 70000}, ["`port`", "0..65535"]),
    ({"port": "80"}, ["`port`", "Expected `int`"]),
    ({"host": "localhost"}, ["`host`", "IP address"]),
    ({"allowed_hosts": ["a b"]}, ["`allowed_hosts`", "'a b'"]),
    ({"live_every_s": 0}, ["`live_every_s`", "0.1..60"]),
    ({"request_timeout_s": 0}, ["`request_timeout_s`", "0.5..300"]),
    ([], ["JSON object"]),
])
def test_a_bad_setting_is_named(given: object, names: list[str]) -> None:
    with pytest.raises(WebSettingsError) as caught:
        load_settings(given)
    for name in names:
        assert name in str(caught.value)
    assert "layer 'web'" in str(caught.value)


def test_the_layer_refuses_bad_settings_when_built(tmp_path: Path) -> None:
    with pytest.raises(WebSettingsError, match="port"):
        layer({"port": -1}, LayerContext(tmp_path, SystemClock()))


def test_the_token_is_made_once_private_and_long(tmp_path: Path) -> None:
    first = ensure_token(tmp_path)
    assert ensure_token(tmp_path) == first == read_token(tmp_path)
    assert len(first) >= 43  # 256 bits, URL-safe base64
    assert stat.S_IMODE((tmp_path / "ui.token").stat().st_mode) == 0o600
    assert ensure_token(Path(tempfile.mkdtemp())) != first


def test_a_missing_or_damaged_token_is_a_clear_error_and_is_not_replaced(tmp_path: Path
                                                                         ) -> None:
    with pytest.raises(TokenMissing, match="upulse init"):
        read_token(tmp_path)
    (tmp_path / "ui.token").write_text("short\n")
    with pytest.raises(TokenMissing, match="does not hold a token"):
        ensure_token(tmp_path)
    assert (tmp_path / "ui.token").read_text() == "short\n"


def test_the_served_address_needs_a_live_process(tmp_path: Path) -> None:
    assert served_address(tmp_path) is None
    (tmp_path / "web.json").write_text(json.dumps({"url": "http://127.0.0.1:1/",
                                                   "pid": os.getpid()}))
    assert served_address(tmp_path) == "http://127.0.0.1:1/"
    (tmp_path / "web.json").write_text(json.dumps({"url": "http://127.0.0.1:1/",
                                                   "pid": 2**22 + 12345}))
    assert served_address(tmp_path) is None
    (tmp_path / "web.json").write_text("{not json")
    assert served_address(tmp_path) is None


@pytest.mark.parametrize(("params", "named"), [
    ({"since": ["yesterday"]}, "since='yesterday'"),
    ({"before": ["-3"]}, "before='-3'"),
    ({"limit": ["0"]}, "limit='0'"),
    ({"limit": ["501"]}, "1..500"),
    ({"limit": ["²"]}, "limit='²'"),
    ({"since": ["²"]}, "since='²'"),
    ({"before": ["٣"]}, "before='٣'"),
    ({"before": ["99999999999999999999999"]}, "before='9"),
])
def test_a_bad_query_parameter_is_named(params: dict[str, list[str]], named: str) -> None:
    with pytest.raises(BadQuery, match=named.replace("(", r"\(").replace(".", r"\.")):
        parse_filter(params, 500)


async def test_a_before_past_the_head_reads_from_the_head(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        await store.append([EventDraft("tick", "k", {"n": n}, origin="engine")
                            for n in range(5)])
        found, older = await newest(store, EventFilter(origin="engine", before=10**17, limit=3))
        assert [e.seq for e in found] == [5, 4, 3] and older == 3
    finally:
        await store.close()


def test_query_parameters_are_read() -> None:
    f = parse_filter({"kind": ["tick", "", "error"], "key": ["k"], "origin": ["engine"],
                      "since": ["12"], "before": ["40"], "limit": ["5"]}, 500)
    assert f == EventFilter(("tick", "error"), "k", "engine", 12, None, 40, 5)
    assert parse_filter({"since": ["10m"]}, 500).since_ms is not None


register_kind("note-a", "a note the Events page's query tests write")
KINDS = ["tick", "error", "note-a"]
ORIGINS = ["engine", "engine:tick", "human"]
HISTORY = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(["a", "b", "c"]),
                             st.sampled_from(ORIGINS)), min_size=0, max_size=60)
FILTERS = st.builds(
    EventFilter,
    kinds=st.lists(st.sampled_from(KINDS), max_size=2, unique=True).map(tuple),
    key=st.none() | st.sampled_from(["a", "b"]),
    origin=st.none() | st.sampled_from(["engine", "hu"]),
    after_seq=st.integers(0, 20),
    limit=st.integers(1, 7),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=HISTORY, f=FILTERS, window=st.sampled_from([3, 8, 1000]),
       windows=st.sampled_from([1, 2, 200]))
def test_paging_back_yields_every_match_once_newest_first(
        history: list[tuple[str, str, str]], f: EventFilter, window: int, windows: int) -> None:
    async def run() -> None:
        folder = Path(tempfile.mkdtemp())
        store = await SqliteEventStore.open(folder / "events.db")
        try:
            if history:
                await store.append([EventDraft(kind, key, {"n": n}, origin=origin)
                                    for n, (kind, key, origin) in enumerate(history)])
            every = await store.read()
            expected = [e.seq for e in reversed(every) if e.seq > f.after_seq
                        and (not f.kinds or e.kind in f.kinds)
                        and (f.key is None or e.key == f.key)
                        and (f.origin is None or e.origin.startswith(f.origin))]
            seen: list[int] = []
            page, before = f, None
            for _ in range(100):
                found, before = await newest(store, page)
                assert len(found) <= f.limit
                seen += [e.seq for e in found]
                if before is None:
                    break
                page = EventFilter(f.kinds, f.key, f.origin, f.after_seq, None, before, f.limit)
            assert seen == expected
        finally:
            await store.close()

    saved, _query.WINDOW = _query.WINDOW, window
    saved_windows, _query.MAX_WINDOWS = _query.MAX_WINDOWS, windows
    try:
        asyncio.run(run())
    finally:
        _query.WINDOW = saved
        _query.MAX_WINDOWS = saved_windows

