"""The ledger file's layout: its SQL schema and version, the columns each older version lacks
(an older ledger is migrated on a writable open and read as it is on a read-only one), and
opening a path as a ledger, refusing with a named error what is not one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rowgrove.errors import InputError, NotFound

SCHEMA_VERSION = 4  # 2: calls.history_drift; 3: calls.weight_versions; 4: media tables (older ledgers are migrated on open)
# how the error of a call that completed but whose response did not reach the client begins
UNDELIVERED = "not delivered to the client"

# columns later versions added to `calls`, with the DDL that adds them and the value an older
# ledger's calls read as: every call such a ledger holds predates what the column records
ADDED_CALL_COLUMNS = {
    "history_drift": ("history_drift INTEGER NOT NULL DEFAULT 0", "0"),
    "weight_versions": ("weight_versions BLOB", "NULL"),
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
    id          TEXT PRIMARY KEY,
    group_id    TEXT,
    api_key     TEXT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'open',      -- open | finished
    metadata    BLOB,                              -- JSON
    reward      REAL,
    valid       INTEGER NOT NULL DEFAULT 1,
    record      BLOB,                              -- JSON {"messages": [...]} | {"conversations": [...]}
    created_at  REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS calls (
    id            TEXT PRIMARY KEY,
    rollout_id    TEXT NOT NULL REFERENCES rollouts(id),
    ordinal       INTEGER NOT NULL,                -- 1-based within the rollout
    parent_id     TEXT REFERENCES calls(id),
    root          INTEGER NOT NULL,
    status        TEXT NOT NULL,                   -- pending | completed | failed | aborted
    prompt_ids    BLOB NOT NULL,                   -- int32: full prompt (root) | new part (continuation)
    prompt_len    INTEGER NOT NULL,                -- full prompt length the engine saw
    sampled_ids   BLOB,                            -- int32
    logprobs      BLOB,                            -- float32, one per sampled id
    weight_versions BLOB,                          -- int32, one per sampled id; NULL = unknown
    finish_reason TEXT,
    request_hash  TEXT NOT NULL,
    summary_hash  TEXT,
    response_hash TEXT,
    request_key   TEXT,
    history_drift INTEGER NOT NULL DEFAULT 0,      -- continuation whose history the template re-renders differently
    response      BLOB,                            -- JSON body sent to the harness
    error         TEXT,
    created_at    REAL NOT NULL,
    completed_at  REAL,
    UNIQUE (rollout_id, ordinal)
);
CREATE TABLE IF NOT EXISTS media (                 -- each image once, named by its pixels (rowgrove.media)
    digest      TEXT PRIMARY KEY,                  -- pixels:<sha256 of size + RGB bytes>
    mime        TEXT NOT NULL,
    width       INTEGER NOT NULL,
    height      INTEGER NOT NULL,
    data        BLOB NOT NULL,                     -- the bytes it first came as (decode to the same pixels)
    processor   TEXT REFERENCES processors(id)     -- what makes the model's processed form from the bytes
);
CREATE TABLE IF NOT EXISTS processors (
    id          TEXT PRIMARY KEY,                  -- sha256 of config
    config      BLOB NOT NULL                      -- JSON: processor class, image processor settings, transformers version
);
CREATE TABLE IF NOT EXISTS call_media (            -- the images of a call's full prompt, in order
    call_id     TEXT NOT NULL REFERENCES calls(id),
    position    INTEGER NOT NULL,
    digest      TEXT NOT NULL REFERENCES media(digest),
    message     INTEGER,                           -- where the request held it: messages[message].content[part]
    part        INTEGER,
    PRIMARY KEY (call_id, position)
);
CREATE TABLE IF NOT EXISTS call_image_summaries (  -- the kept-image check's evidence (gateway.images)
    call_id       TEXT PRIMARY KEY REFERENCES calls(id),
    blind_summary TEXT NOT NULL                    -- summary hash with image parts counted without pixels
);
CREATE INDEX IF NOT EXISTS rollouts_by_status ON rollouts (status, created_at);
CREATE INDEX IF NOT EXISTS rollouts_by_key ON rollouts (api_key);  -- a call at the plain /v1 names its rollout by key
"""

CALL_COLUMNS = (
    "id, rollout_id, ordinal, parent_id, root, status, prompt_ids, prompt_len, sampled_ids, "
    "logprobs, finish_reason, request_hash, summary_hash, response_hash, request_key, response, "
    "error, created_at, completed_at, history_drift, weight_versions"
)
OLD_VERSIONS = ("1", "2", "3")  # migrated on a writable open, read as they are on a read-only one
ROLLOUT_COLUMNS = (
    "id, group_id, api_key, status, metadata, reward, valid, record, created_at, finished_at"
)


def call_columns(present: set[str] | frozenset[str]) -> str:
    """`CALL_COLUMNS` for a calls table that has the columns `present`: a column an older schema
    lacks reads as its default (see `ADDED_CALL_COLUMNS`), so old ledgers stay readable."""
    out = []
    for name in (c.strip() for c in CALL_COLUMNS.split(",")):
        if name in ADDED_CALL_COLUMNS and name not in present:
            out.append(ADDED_CALL_COLUMNS[name][1])
        else:
            out.append(name)
    return ", ".join(out)


def table_columns(db: sqlite3.Connection, table: str) -> set[str]:
    """The column names of `table` in the database `db`."""
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def _not_a_ledger(path: Path, why: str, readonly: bool) -> InputError:
    fix = ("pass the ledger file `rowgrove serve --ledger` wrote" if readonly
           else "pass a ledger that `rowgrove serve --ledger` wrote, or a new path to start a new one")
    return InputError(f"{path} is not a rowgrove ledger ({why}): {fix}")


def _cannot_open(path: Path, e: Exception, readonly: bool) -> InputError:
    why = getattr(e, "strerror", None) or str(e)
    return InputError(f"cannot open ledger {path} ({why}): pass a path you can read"
                      + ("" if readonly else " and write"))


def open_ledger_db(path: Path, readonly: bool) -> sqlite3.Connection:
    """A connection to the ledger at `path`, checked to be one before anything is written: a new
    path, or an existing empty file, is a new ledger (writable opens only); a directory, a file
    that is not SQLite and an SQLite database without rowgrove's `meta` table are refused with
    InputError (NotFound for a read-only open of a missing path)."""
    from urllib.parse import quote

    if path.is_dir():
        raise _not_a_ledger(path, "it is a directory", readonly)
    try:
        if readonly:
            if not path.exists():
                raise NotFound(f"ledger {path} does not exist: pass the file `rowgrove serve --ledger` wrote")
            uri = f"file:{quote(str(path.resolve()))}?mode=ro"
            db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    except (OSError, sqlite3.Error) as e:
        raise _cannot_open(path, e, readonly) from None
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables and readonly:
            empty = path.stat().st_size == 0
            raise _not_a_ledger(path, "it is empty" if empty else "an SQLite database with no tables", readonly)
        if tables and "meta" not in tables:
            raise _not_a_ledger(path, "an SQLite database without rowgrove's tables", readonly)
        if tables and db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() is None:
            raise _not_a_ledger(path, "its meta table has no schema_version", readonly)
    except sqlite3.DatabaseError as e:
        db.close()
        if "not a database" in str(e):
            raise _not_a_ledger(path, "not an SQLite database", readonly) from None
        if "unable to open" in str(e):
            raise _cannot_open(path, e, readonly) from None
        raise _not_a_ledger(path, f"SQLite: {e}", readonly) from None
    except BaseException:
        db.close()
        raise
    return db


def prepare_ledger_db(db: sqlite3.Connection, path: str, readonly: bool, synchronous: str) -> None:
    """Make the ledger `open_ledger_db` opened ready for use: a writable one gets WAL mode,
    `synchronous`, foreign keys and the schema, loses the indexes earlier versions made, and is
    migrated from an older version in place; a read-only one is read as it is. InputError (the
    connection closed) when a writable file cannot be written; InputError for a schema version
    this rowgrove does not read."""
    if not readonly:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous}")
            db.execute("PRAGMA foreign_keys=ON")
            db.executescript(SCHEMA)
            # indexes earlier ledgers were made with, paid for at every call insert: a copy of
            # UNIQUE (rollout_id, ordinal)'s own, and one for retries, which are rare and find
            # their call among the rollout's own calls through that same index
            db.execute("DROP INDEX IF EXISTS calls_by_rollout")
            db.execute("DROP INDEX IF EXISTS calls_by_request_key")
            db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            db.execute("BEGIN IMMEDIATE")  # proves the file and its folder take writes
            db.execute("ROLLBACK")
        except sqlite3.OperationalError as e:  # a read-only file or folder, a full disk, a lock
            db.close()
            raise InputError(f"cannot write ledger {path} ({e}): pass a ledger file you can "
                             "write (check its and its folder's permissions), or read it with "
                             "`rowgrove rows` / `rowgrove show`, which only read") from None
    version = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    old = version is not None and version[0] in OLD_VERSIONS
    if old and not readonly:
        # an older ledger gains the columns it lacks; its calls read as the columns' defaults
        # (no drift detected, weight versions unknown)
        cols = table_columns(db, "calls")
        db.execute("BEGIN IMMEDIATE")
        try:
            for name, (ddl, _) in ADDED_CALL_COLUMNS.items():
                if name not in cols:
                    db.execute(f"ALTER TABLE calls ADD COLUMN {ddl}")
            db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        version = (str(SCHEMA_VERSION),)
    if version is None or (version[0] != str(SCHEMA_VERSION) and not (old and readonly)):
        raise InputError(
            f"ledger {path} has schema version {version and version[0]}, this rowgrove "
            f"reads versions {', '.join(OLD_VERSIONS)} and {SCHEMA_VERSION}: use a fresh ledger file"
            + (" or a newer rowgrove" if version is not None and version[0].isdigit()
               and int(version[0]) > SCHEMA_VERSION else "")
        )


DURABILITY = {"normal": "NORMAL", "full": "FULL"}


def synchronous_for(durability: str) -> str:
    """SQLite's `synchronous` for a `Ledger(durability=...)`. In WAL mode "normal" (NORMAL) loses
    no committed call when the process dies (kill -9 included): the WAL reaches the OS at every
    commit; a power loss or OS crash may lose the last commits (never corrupting the file).
    "full" (FULL) syncs the WAL to disk at every commit, so a commit also survives a power loss,
    at about 4x the commit cost (measured 72 vs 273 µs per call)."""
    if durability not in DURABILITY:
        raise InputError(f"durability must be one of {', '.join(DURABILITY)}, got {durability!r}")
    return DURABILITY[durability]


__all__ = ["ADDED_CALL_COLUMNS", "CALL_COLUMNS", "DURABILITY", "OLD_VERSIONS", "ROLLOUT_COLUMNS", "SCHEMA",
           "SCHEMA_VERSION", "UNDELIVERED", "call_columns", "open_ledger_db", "prepare_ledger_db", "synchronous_for", "table_columns"]
