"""The event log's tables, functions and triggers in PostgreSQL: what each schema version
adds, as SQL for a given schema."""

from __future__ import annotations

from collections.abc import Callable

from pulse_core._principals import PERSON_KINDS

SCHEMA_VERSION = 5
APPLICATION = "pulse event log"
COLUMNS = "seq, id, kind, key, version, ts, origin, cause, tx, idem, data, hash"

# {s} is the quoted schema name. The writer_lock row serialises appends: each append
# transaction locks it first and holds it to its commit, so seq order is commit order and a
# reader following the log never passes over a seq that a slower transaction commits later.
# `data` is bytea: the JSON bytes exactly as encoded, so hashes and bytes round-trip.
SCHEMA = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE {s}.meta (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {s}.writer_lock (one boolean PRIMARY KEY DEFAULT true CHECK (one));
INSERT INTO {s}.writer_lock VALUES (true);
CREATE TABLE {s}.events (
    seq     bigint PRIMARY KEY,
    id      text NOT NULL,
    kind    text NOT NULL,
    key     text NOT NULL,
    version bigint NOT NULL,
    ts      bigint NOT NULL,
    origin  text NOT NULL,
    cause   bigint,
    tx      text NOT NULL,
    idem    text,
    data    bytea,
    hash    text
);
CREATE UNIQUE INDEX events_idem ON {s}.events (idem) WHERE idem IS NOT NULL;
CREATE INDEX events_key ON {s}.events (key, seq);
CREATE TABLE {s}.heads (key text PRIMARY KEY, version bigint NOT NULL);
CREATE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pulse events are append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER events_refuse_update_delete BEFORE UPDATE OR DELETE ON {s}.events
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change();
CREATE TRIGGER events_refuse_truncate BEFORE TRUNCATE ON {s}.events
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change();
REVOKE UPDATE, DELETE, TRUNCATE ON {s}.events FROM PUBLIC;
REVOKE UPDATE, DELETE, TRUNCATE ON {s}.events FROM CURRENT_USER;
"""

# Version 2: principals the database enforces. Each role that writes the log is listed in
# {s}.principals as a person's (human), an engine's or an agent's (with its name); the
# schema's owner always counts as a person's. Every inserted row is checked against the
# inserting role, as pulse_core._principals checks drafts in the process.
PRINCIPALS = """
CREATE TABLE {s}.principals (
    role  text PRIMARY KEY,
    kind  text NOT NULL CHECK (kind IN ('human', 'engine', 'agent')),
    agent text NOT NULL DEFAULT '' CHECK (kind <> 'agent' OR agent <> '')
);
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON {s}.principals FROM PUBLIC;
GRANT SELECT ON {s}.principals TO PUBLIC;
CREATE FUNCTION {s}.check_principal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    who record;
    head text := split_part(NEW.origin, ':', 1);
BEGIN
    SELECT kind, agent INTO who FROM {s}.principals WHERE role = current_user::text;
    IF NOT FOUND THEN
        IF current_user = (SELECT pg_get_userbyid(nspowner) FROM pg_namespace
                           WHERE nspname = TG_TABLE_SCHEMA) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'role % is not a pulse principal of schema %', current_user,
            TG_TABLE_SCHEMA USING ERRCODE = 'insufficient_privilege',
            HINT = 'the schema''s owner lists it in principals (docs/security.md)';
    END IF;
    IF who.kind = 'human' THEN
        RETURN NEW;
    END IF;
    IF NEW.kind IN ({person_kinds}) THEN
        RAISE EXCEPTION 'role % (%) may not write an event of kind %: only a person does',
            current_user, who.kind, NEW.kind USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF who.kind = 'engine' AND head IN ('human', 'cli') THEN
        RAISE EXCEPTION 'role % (engine) may not write origin %: only a person does',
            current_user, NEW.origin USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF who.kind = 'agent' AND NOT (
            NEW.origin = 'agent' OR NEW.origin = 'agent:' || who.agent
            OR starts_with(NEW.origin, 'agent:' || who.agent || '-')
            OR starts_with(NEW.origin, 'agent:' || who.agent || ':')) THEN
        RAISE EXCEPTION 'role % (agent %) may not write origin %', current_user, who.agent,
            NEW.origin USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER events_check_principal BEFORE INSERT ON {s}.events
    FOR EACH ROW EXECUTE FUNCTION {s}.check_principal();
"""


# Version 3: indexes for the events page's filters, so that reading the newest events of a
# rare kind, or of an origin (a prefix: text_pattern_ops matches `LIKE 'agent:%'` whatever
# the database's collation), reads only those rows instead of walking the log backwards.
INDEXES = """
CREATE INDEX IF NOT EXISTS events_kind ON {s}.events (kind, seq);
CREATE INDEX IF NOT EXISTS events_origin ON {s}.events (origin text_pattern_ops, seq);
"""

# Version 4: an append in one statement, and the principals checked once per statement.
# `commit_if_heads` is the one-round-trip commit of a writer that staged its group against
# the heads it assumes (`assumed`: {key: version} for every key the group reads or writes).
# Under the writer lock, `base` is the newest seq; unless it is `last` (the writer knows every
# assumed head as of that seq, and none has moved since), the assumed heads are checked: if
# one differs, nothing is stored and `actual` holds those keys' heads as they are (without
# `last`, they are first read before the lock, so that a claim another engine already won is
# refused without queueing for it: `base` is then NULL). Otherwise
# the rows go in after `base` (their seqs in `rows` count from 1), stamped with `stamp` or,
# if later, the newest row's ts (`stamped`: ts follows seq), the heads of their keys move
# and the channel is notified. The rows come as one JSON document (see `ROWS_OF_JSON`): one
# parameter, encoded and parsed in C. The statements are planned once per session and the
# call is one prepared statement: the round trip of a raw INSERT, the writer lock held only
# while the server works.
# The principals trigger reads a statement's new rows at once rather than once per row.
COMMIT_IF_HEADS = """
CREATE OR REPLACE FUNCTION {s}.commit_if_heads(rows jsonb, assumed jsonb, stamp bigint,
    last bigint, OUT base bigint, OUT stamped bigint, OUT actual jsonb) LANGUAGE plpgsql AS $$
BEGIN
    IF last IS NULL THEN  -- a head already moved refuses without waiting for the lock
        SELECT jsonb_object_agg(a.key, {head}) INTO actual FROM jsonb_each(assumed) a{join};
        IF actual <> assumed THEN
            RETURN;
        END IF;
        actual := NULL;
    END IF;
    PERFORM FROM {s}.writer_lock FOR UPDATE;
    SELECT e.seq, e.ts INTO base, stamped FROM {s}.events e ORDER BY e.seq DESC LIMIT 1;
    base := coalesce(base, 0);
    IF last IS DISTINCT FROM base THEN
        SELECT jsonb_object_agg(a.key, {head}) INTO actual FROM jsonb_each(assumed) a{join};
        IF actual <> assumed THEN
            stamped := NULL;
            RETURN;
        END IF;
        actual := NULL;
    END IF;
    stamped := greatest(stamp, stamped);
    {write};
    PERFORM pg_notify({channel}, (base + jsonb_array_length(rows))::text);
END $$;
"""
"""`commit_if_heads` (versions 4 and 5): `head` is the expression of the head of `a.key`
(an assumed key) after `join`, `write` the statement storing the rows."""

APPEND_IN_ONE = """
{commit_if_heads}
DROP TRIGGER events_check_principal ON {s}.events;
DROP FUNCTION {s}.check_principal();
CREATE FUNCTION {s}.check_principals() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    who record;
    bad record;
BEGIN
    IF NOT EXISTS (SELECT FROM added) THEN
        RETURN NULL;
    END IF;
    SELECT kind, agent INTO who FROM {s}.principals WHERE role = current_user::text;
    IF NOT FOUND THEN
        IF current_user = (SELECT pg_get_userbyid(nspowner) FROM pg_namespace
                           WHERE nspname = TG_TABLE_SCHEMA) THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'role % is not a pulse principal of schema %', current_user,
            TG_TABLE_SCHEMA USING ERRCODE = 'insufficient_privilege',
            HINT = 'the schema''s owner lists it in principals (docs/security.md)';
    END IF;
    IF who.kind = 'human' THEN
        RETURN NULL;
    END IF;
    SELECT a.kind, a.origin INTO bad FROM added a
    WHERE a.kind IN ({person_kinds})
       OR (who.kind = 'engine' AND split_part(a.origin, ':', 1) IN ('human', 'cli'))
       OR (who.kind = 'agent' AND NOT (
            a.origin = 'agent' OR a.origin = 'agent:' || who.agent
            OR starts_with(a.origin, 'agent:' || who.agent || '-')
            OR starts_with(a.origin, 'agent:' || who.agent || ':')))
    ORDER BY a.seq LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF bad.kind IN ({person_kinds}) THEN
        RAISE EXCEPTION 'role % (%) may not write an event of kind %: only a person does',
            current_user, who.kind, bad.kind USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF who.kind = 'engine' THEN
        RAISE EXCEPTION 'role % (engine) may not write origin %: only a person does',
            current_user, bad.origin USING ERRCODE = 'insufficient_privilege';
    END IF;
    RAISE EXCEPTION 'role % (agent %) may not write origin %', current_user, who.agent,
        bad.origin USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER events_check_principals AFTER INSERT ON {s}.events
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION {s}.check_principals();
"""

# Version 5: no heads table. A key's head is the version of its newest event, read through
# the `events_key (key, seq)` index as cheaply as a row of `heads` was; an append no longer
# moves a row of `heads` per key it writes (on the server, as much again as inserting the
# events). A log at version 4 loses the table and gains the function that does without it.
HEADS_OF_EVENTS = """
{commit_if_heads}
DROP TABLE {s}.heads;
"""
HEAD_OF_EVENTS = ("coalesce((SELECT e.version FROM {s}.events e WHERE e.key = {key} "
                  "ORDER BY e.seq DESC LIMIT 1), 0)")
"""The head of the key `{key}` (an SQL expression): its newest event's version, else 0."""


def _person_kinds() -> str:
    return ", ".join(f"'{kind}'" for kind in sorted(PERSON_KINDS))


def channel_of(schema: str) -> str:
    """The channel every commit to the log in `schema` NOTIFYs."""
    return f"pulse:{schema}"


ROWS_OF_JSON = (
    "SELECT {seq}, r->>1, r->>2, r->>3, (r->>4)::bigint, {ts}, r->>6, (r->>7)::bigint, "
    "r->>8, r->>9, decode(r->>10, 'base64'), r->>11 FROM jsonb_array_elements({rows}) r")
"""A SELECT of log rows (COLUMNS order) from `rows`, a jsonb array holding each row as an
array of its values, data in base64 (as msgspec encodes bytes): the cheapest way found to
send many rows as one parameter (psycopg dumps arrays element by element in Python). `seq`
and `ts` are the expressions of those columns."""


def rows_of_json(rows: str, *, seq: str = "(r->>0)::bigint", ts: str = "(r->>5)::bigint"
                 ) -> str:
    """`ROWS_OF_JSON` for the jsonb expression `rows`."""
    return ROWS_OF_JSON.format(rows=rows, seq=seq, ts=ts)


def _commit_if_heads(schema: str, *, head: str, join: str, write: str) -> str:
    """`COMMIT_IF_HEADS` for `schema`."""
    rows = rows_of_json("rows", seq="base + (r->>0)::bigint", ts="stamped")
    return COMMIT_IF_HEADS.format(
        s=quoted(schema), head=head, join=join, channel=quoted_text(channel_of(schema)),
        write=write.format(s=quoted(schema), columns=COLUMNS, rows_of_json=rows))


def append_in_one_sql(schema: str) -> str:
    """The version-4 statements for `schema`."""
    s = quoted(schema)
    function = _commit_if_heads(
        schema, head="coalesce(h.version, 0)", join=f" LEFT JOIN {s}.heads h ON h.key = a.key",
        write="""WITH added AS (
        INSERT INTO {s}.events ({columns}) {rows_of_json} RETURNING key, version)
    INSERT INTO {s}.heads (key, version)
        SELECT DISTINCT ON (key) key, version FROM added ORDER BY key, version DESC
        ON CONFLICT (key) DO UPDATE SET version = excluded.version""")
    return APPEND_IN_ONE.format(commit_if_heads=function, s=s, person_kinds=_person_kinds())


def heads_of_events_sql(schema: str) -> str:
    """The version-5 statements for `schema`."""
    s = quoted(schema)
    function = _commit_if_heads(
        schema, head=HEAD_OF_EVENTS.format(s=s, key="a.key"), join="",
        write="INSERT INTO {s}.events ({columns}) {rows_of_json}")
    return HEADS_OF_EVENTS.format(commit_if_heads=function, s=s)


def quoted_text(text: str) -> str:
    """`text` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def principals_sql(s: str) -> str:
    """The version-2 statements for the quoted schema `s`."""
    return PRINCIPALS.format(s=s, person_kinds=_person_kinds())


def quoted(name: str) -> str:
    """`name` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


UPGRADES: list[tuple[str, Callable[[str], str]]] = [
    ("version 2's principals table", lambda schema: principals_sql(quoted(schema))),
    # Building the indexes reads the whole table and holds back appends meanwhile (seconds
    # per million events).
    ("version 3's indexes", lambda schema: INDEXES.format(s=quoted(schema))),
    ("version 4's append function and principals trigger", append_in_one_sql),
    ("version 5's heads read from the events", heads_of_events_sql),
]
"""What each version adds (from version 2 on, in order) and its statements for a schema."""
