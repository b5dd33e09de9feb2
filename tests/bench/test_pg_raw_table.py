"""The PostgreSQL benchmarks' raw limit writes into a table like pulse's own events table: the
same columns and the same indexes (bench.common.RAW_TABLE beside pulse's schema), so a raw
figure never understates what pulse's log costs to write."""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg

from pulse_core.store import open_event_store

REPO = Path(__file__).resolve().parents[2]


def shape(conn: psycopg.Connection[tuple[object, ...]], schema: str, table: str
          ) -> tuple[list[tuple[object, ...]], set[str]]:
    """A table's columns (name, type, nullable) in order, and its index definitions with
    the index's and the table's names left out."""
    columns = conn.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table)).fetchall()
    indexes = {("UNIQUE " if " UNIQUE " in f" {d} " else "") + d.partition(" USING ")[2]
               for (d,) in conn.execute("SELECT indexdef FROM pg_indexes "
                                        "WHERE schemaname = %s AND tablename = %s",
                                        (schema, table)).fetchall()}
    return columns, indexes


async def test_the_raw_table_has_the_columns_and_indexes_of_pulses_events_table(
        pg_url: str) -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.common import RAW_TABLE

    store = await open_event_store(pg_url)  # creates pulse's schema, at its newest version
    await store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(RAW_TABLE)
        pulse_columns, pulse_indexes = shape(conn, "pulse", "events")
        row = conn.execute("SELECT current_schema()").fetchone()
        assert row is not None
        raw_columns, raw_indexes = shape(conn, str(row[0]), "raw_events")
    assert raw_columns == pulse_columns
    assert raw_indexes == pulse_indexes
    assert any("text_pattern_ops" in d for d in raw_indexes)  # schema 3's origin index
