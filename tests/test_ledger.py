"""The SQLite ledger: a real file, WAL, packed token blobs, states that only move forward."""

import re
import sqlite3

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.assemble import iter_finished, read_calls
from rowgrove.errors import Conflict, InputError, NotFound
from rowgrove.ledger import Ledger
from rowgrove.ledger.store import SCHEMA_VERSION, pack_floats, pack_ids


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.sqlite") as led:
        yield led


def test_wal_mode_and_schema_version(tmp_path):
    Ledger(tmp_path / "l.sqlite").close()
    db = sqlite3.connect(tmp_path / "l.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="schema version 99"):
        Ledger(tmp_path / "l.sqlite")


@settings(max_examples=25, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 2**31 - 1), max_size=50),
    sampled=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.floats(-50, 0, width=32)), max_size=50),
)
def test_call_tokens_round_trip_exactly(tmp_path_factory, prompt, sampled):
    with Ledger(tmp_path_factory.mktemp("l") / "l.sqlite") as led:
        ro = led.create_rollout("g")
        call = led.begin_call(ro.id, parent_id=None, prompt_ids=prompt, prompt_len=len(prompt), request_hash="h")
        ids = [s for s, _ in sampled]
        lps = [lp for _, lp in sampled]
        led.complete_call(call.id, sampled_ids=ids, logprobs=lps, finish_reason="stop",
                          summary_hash="s", response_hash="r", response={"id": call.id})
        got = led.get_call(call.id)
        assert got.prompt_ids.tolist() == prompt
        assert got.sampled_ids.tolist() == ids
        assert np.array_equal(got.logprobs, np.asarray(lps, np.float32))
        assert got.status == "completed" and got.response == {"id": call.id}


def test_ordinals_parents_and_states(ledger):
    ro = ledger.create_rollout("g", {"task": 1})
    c1 = ledger.begin_call(ro.id, parent_id=None, prompt_ids=[1, 2], prompt_len=2, request_hash="a")
    c2 = ledger.begin_call(ro.id, parent_id=c1.id, prompt_ids=[3], prompt_len=5, request_hash="b", request_key="k")
    assert (c1.ordinal, c2.ordinal, c1.root, c2.root) == (1, 2, True, False)
    ledger.end_call(c2.id, "aborted", "client went away", sampled_ids=[7], logprobs=[-0.5])
    with pytest.raises(Conflict, match="not pending"):
        ledger.complete_call(c2.id, sampled_ids=[1], logprobs=[0.0], finish_reason="stop",
                             summary_hash="s", response_hash="r", response=None)
    assert [c.status for c in ledger.calls(ro.id)] == ["pending", "aborted"]
    assert ledger.find_retry(ro.id, "k").id == c2.id
    assert ledger.abort_pending() == 1
    assert ledger.get_call(c1.id).status == "aborted"
    with pytest.raises(InputError, match="3 sampled ids but 2 logprobs"):
        ledger.complete_call(c1.id, sampled_ids=[1, 2, 3], logprobs=[0, 0], finish_reason="stop",
                             summary_hash="s", response_hash="r", response=None)


def test_finish_once_and_survive_reopen(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        ro = led.create_rollout("g1")
        led.finish_rollout(ro.id, {"messages": [{"role": "user", "content": "x"}]}, 0.5)
        with pytest.raises(Conflict, match="already finished"):
            led.finish_rollout(ro.id, None, 1.0)
    with Ledger(path, readonly=True) as led:
        back = led.get_rollout(ro.id)
        assert (back.status, back.reward, back.api_key, back.group_id) == ("finished", 0.5, ro.api_key, "g1")
        assert [r.id for r, _ in led.iter_finished()] == [ro.id]
        with pytest.raises(NotFound, match="rollout nope not found"):
            led.get_rollout("nope")
    with pytest.raises(NotFound, match="does not exist"):
        Ledger(tmp_path / "missing.sqlite", readonly=True)


def test_calls_need_an_existing_rollout_and_ordinals_survive_reopen(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        with pytest.raises(NotFound, match="rollout ghost not found"):
            led.begin_call("ghost", parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
        ro = led.create_rollout("g")
        led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
    with Ledger(path) as led:
        again = led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
        assert again.ordinal == 2


# -- weight versions (schema 3) -------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(sampled=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)), max_size=40),
       known=st.booleans())
def test_weight_versions_round_trip_exactly(tmp_path_factory, sampled, known):
    ids = [s for s, _ in sampled]
    versions = [v for _, v in sampled] if known else None
    with Ledger(tmp_path_factory.mktemp("l") / "l.sqlite") as led:
        ro = led.create_rollout("g")
        call = led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
        led.complete_call(call.id, sampled_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop",
                          summary_hash="s", response_hash="r", response=None, weight_versions=versions)
        for got in (led.get_call(call.id), led.calls(ro.id)[0], read_calls(led, ro.id)[0]):
            if known:
                assert got.weight_versions.dtype == np.int32
                assert got.weight_versions.tolist() == versions
            else:
                assert got.weight_versions is None



def _outline_of(c) -> tuple:
    """What `call_outlines` must say of the full `Call` c."""
    vs = c.weight_versions
    dropped = (c.response or {}).get("hosted_tools_dropped") if isinstance(c.response, dict) else None
    return (c.id, c.ordinal, c.parent_id, c.root, c.status, c.prompt_len, len(c.sampled_ids), c.finish_reason,
            c.history_drift, None if vs is None or len(vs) == 0 else (int(vs.min()), int(vs.max())), dropped or None)


@settings(max_examples=25, deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from(["pending", "completed", "failed"]),
                                st.lists(st.integers(0, 2**31 - 1), max_size=5), st.booleans(),
                                st.sampled_from([None, {}, {"x": "hosted_tools_dropped"}, {"hosted_tools_dropped": []},
                                                 {"hosted_tools_dropped": ["web_search"]}])), max_size=5))
def test_call_outlines_say_what_the_full_calls_say(tmp_path_factory, calls):
    with Ledger(tmp_path_factory.mktemp("l") / "l.sqlite") as led:
        ro = led.create_rollout("g")
        parent = None
        for status, versions, drift, response in calls:
            c = led.begin_call(ro.id, parent_id=parent, prompt_ids=[1, 2], prompt_len=7, request_hash="h",
                               history_drift=drift)
            n = len(versions)
            if status == "completed":
                led.complete_call(c.id, sampled_ids=list(range(n)), logprobs=[0.0] * n, finish_reason="stop",
                                  summary_hash="s", response_hash="r", response=response,
                                  weight_versions=versions if n % 2 else None)
            elif status == "failed":
                led.end_call(c.id, "failed", "boom", sampled_ids=list(range(n)), logprobs=[0.0] * n)
            parent = c.id
        outlines = [(o.id, o.ordinal, o.parent_id, o.root, o.status, o.prompt_len, o.sampled, o.finish_reason,
                     o.history_drift, o.weight_range, o.hosted_tools_dropped) for o in led.call_outlines(ro.id)]
        assert outlines == [_outline_of(c) for c in led.calls(ro.id)]

def test_weight_versions_must_match_the_sampled_ids(ledger):
    ro = ledger.create_rollout("g")
    call = ledger.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
    kw = dict(sampled_ids=[5, 6, 7], logprobs=[0.0] * 3, finish_reason="stop", summary_hash="s",
              response_hash="r", response=None)
    with pytest.raises(InputError, match="3 sampled ids but 2 weight versions"):
        ledger.complete_call(call.id, **kw, weight_versions=[0, 0])
    with pytest.raises(InputError, match=r"integers in \[0, 2\*\*31\)"):
        ledger.complete_call(call.id, **kw, weight_versions=[0, -1, 0])
    with pytest.raises(InputError, match="1 sampled ids but 3 weight versions"):
        ledger.end_call(call.id, "failed", "boom", sampled_ids=[5], logprobs=[0.0], weight_versions=[1, 2, 3])
    assert ledger.get_call(call.id).status == "pending"  # nothing was written by the refusals
    ledger.end_call(call.id, "failed", "boom", sampled_ids=[5, 6], logprobs=[0.0, 0.0], weight_versions=[4, 5])
    got = ledger.get_call(call.id)
    assert got.status == "failed" and got.weight_versions.tolist() == [4, 5]
    other = ledger.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
    ledger.end_call(other.id, "aborted", "gone")
    assert ledger.get_call(other.id).weight_versions is None


# The calls table exactly as schema version 2 declared it (before weight_versions), and version 1
# (before history_drift), to build old ledger files by hand.
_V2_CALLS = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE rollouts (
    id TEXT PRIMARY KEY, group_id TEXT, api_key TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'open',
    metadata BLOB, reward REAL, valid INTEGER NOT NULL DEFAULT 1, record BLOB, created_at REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE calls (
    id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL REFERENCES rollouts(id), ordinal INTEGER NOT NULL,
    parent_id TEXT REFERENCES calls(id), root INTEGER NOT NULL, status TEXT NOT NULL,
    prompt_ids BLOB NOT NULL, prompt_len INTEGER NOT NULL, sampled_ids BLOB, logprobs BLOB,
    finish_reason TEXT, request_hash TEXT NOT NULL, summary_hash TEXT, response_hash TEXT,
    request_key TEXT, {drift}response BLOB, error TEXT, created_at REAL NOT NULL, completed_at REAL,
    UNIQUE (rollout_id, ordinal)
);
"""


def _old_ledger(path, version: int):
    """A ledger file of schema `version` (1 or 2) holding one finished rollout with one completed call."""
    db = sqlite3.connect(path)
    drift = "history_drift INTEGER NOT NULL DEFAULT 0, " if version == 2 else ""
    db.executescript(_V2_CALLS.replace("{drift}", drift))
    db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
    db.execute("INSERT INTO rollouts(id, group_id, api_key, status, record, reward, created_at) "
               "VALUES ('ro_old', 'g', 'k', 'finished', NULL, 1.0, 1.0)")
    db.execute("INSERT INTO calls(id, rollout_id, ordinal, root, status, prompt_ids, prompt_len, sampled_ids, "
               "logprobs, finish_reason, request_hash, created_at) "
               "VALUES ('c_old', 'ro_old', 1, 1, 'completed', ?, 2, ?, ?, 'stop', 'h', 1.0)",
               (pack_ids([1, 2]), pack_ids([7, 8]), pack_floats([-0.5, -0.25])))
    db.commit()
    db.close()


def _schema(path):
    db = sqlite3.connect(path)
    try:
        version = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
        cols = {r[1] for r in db.execute("PRAGMA table_info(calls)")}
    finally:
        db.close()
    return version, cols


@pytest.mark.parametrize("version", [1, 2])
def test_old_ledger_reads_read_only_and_migrates_on_writable_open(tmp_path, version):
    path = tmp_path / "old.sqlite"
    _old_ledger(path, version)
    with Ledger(path, readonly=True) as led:  # read-only: read as it is, file untouched
        (old,) = led.calls("ro_old")
        assert old.sampled_ids.tolist() == [7, 8] and old.weight_versions is None and not old.history_drift
        assert [_outline_of(c) for c in led.calls("ro_old")] == [
            (o.id, o.ordinal, o.parent_id, o.root, o.status, o.prompt_len, o.sampled, o.finish_reason,
             o.history_drift, o.weight_range, o.hosted_tools_dropped) for o in led.call_outlines("ro_old")]
        assert read_calls(led, "ro_old")[0].weight_versions is None
    assert [c.weight_versions for _, calls in iter_finished(path) for c in calls] == [None]
    before, cols = _schema(path)
    assert before == str(version) and "weight_versions" not in cols

    with Ledger(path) as led:  # writable: migrated in place, old calls keep NULL, new ones record
        (old,) = led.calls("ro_old")
        assert old.weight_versions is None and old.sampled_ids.tolist() == [7, 8]
        ro = led.create_rollout("g")
        c = led.begin_call(ro.id, parent_id=None, prompt_ids=[3], prompt_len=1, request_hash="h", history_drift=True)
        led.complete_call(c.id, sampled_ids=[9], logprobs=[0.0], finish_reason="stop", summary_hash="s",
                          response_hash="r", response=None, weight_versions=[6])
    version_now, cols = _schema(path)
    assert version_now == str(SCHEMA_VERSION) == "4"
    assert {"weight_versions", "history_drift"} <= cols
    with Ledger(path, readonly=True) as led:
        got = led.get_call(c.id)
        assert got.weight_versions.tolist() == [6] and got.history_drift
        assert led.get_call("c_old").weight_versions is None


def test_a_newer_ledger_is_refused_even_read_only(tmp_path):
    path = tmp_path / "new.sqlite"
    Ledger(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="schema version 5.*newer rowgrove"):
        Ledger(path, readonly=True)


# -- group commit (the gateway's abegin_call / acomplete_call) --------------------------------------


def _committed(path, call_id: str):
    """(status) of a call as another connection reads it: only what was committed."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        r = db.execute("SELECT status FROM calls WHERE id=?", (call_id,)).fetchone()
    finally:
        db.close()
    return None if r is None else r[0]


def _count_commits(led: Ledger) -> list[str]:
    seen: list[str] = []
    led._db.set_trace_callback(lambda sql: seen.append(sql) if sql.strip().upper() == "COMMIT" else None)
    return seen


def test_concurrent_calls_share_commits_and_each_returns_only_once_committed(tmp_path):
    import asyncio

    path = tmp_path / "l.sqlite"

    async def one(led: Ledger, ro_id: str, k: int) -> str:
        call = await led.abegin_call(ro_id, parent_id=None, prompt_ids=[k], prompt_len=1, request_hash=f"h{k}")
        assert _committed(path, call.id) == "pending"  # on the WAL before the engine would be asked
        await led.acomplete_call(call.id, sampled_ids=[k, k], logprobs=[-0.5, -0.25], finish_reason="stop",
                                 summary_hash="s", response_hash="r", response={"k": k})
        assert _committed(path, call.id) == "completed"  # on the WAL before the harness would be answered
        return call.id

    with Ledger(path) as led:
        ros = [led.create_rollout("g").id for _ in range(8)]
        commits = _count_commits(led)

        async def all_of_them():
            return await asyncio.wait_for(asyncio.gather(*(one(led, r, k) for k, r in enumerate(ros))), 10)

        ids = asyncio.run(all_of_them())
        # 8 concurrent calls, 16 writes: one commit for the 8 pending rows, one for the 8 completions
        assert len(commits) == 2
        for k, cid in enumerate(ids):
            c = led.get_call(cid)
            assert (c.status, c.prompt_ids.tolist(), c.sampled_ids.tolist(), c.response) == (
                "completed", [k], [k, k], {"k": k})


def test_a_failed_group_commit_fails_every_caller_in_it_and_keeps_none_of_their_writes(tmp_path):
    import asyncio

    class FailingCommit:
        """The connection, with COMMIT failing as a full disk would make it."""

        def __init__(self, db):
            self.db = db

        def execute(self, sql, *args):
            if sql == "COMMIT":
                raise sqlite3.OperationalError("database or disk is full")
            return self.db.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.db, name)

    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        ro = led.create_rollout("g")
        real = led._db
        led._db = FailingCommit(real)

        async def begin(k: int):
            return await led.abegin_call(ro.id, parent_id=None, prompt_ids=[k], prompt_len=1, request_hash="h")

        async def both():
            return await asyncio.gather(begin(1), begin(2), return_exceptions=True)

        results = asyncio.run(both())
        assert all(isinstance(r, sqlite3.OperationalError) and "disk is full" in str(r) for r in results)
        led._db = real
        assert led.calls(ro.id) == []  # rolled back: no row of a caller that was told it failed
        # the ledger goes on: ordinals are re-read from the file, a new call commits
        call = led.begin_call(ro.id, parent_id=None, prompt_ids=[3], prompt_len=1, request_hash="h")
        assert call.ordinal == 1 and _committed(path, call.id) == "pending"


def test_a_write_of_its_own_commits_the_open_group_first(tmp_path):
    import asyncio

    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        ro = led.create_rollout("g")

        async def go():
            task = asyncio.ensure_future(
                led.abegin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h"))
            await asyncio.sleep(0)  # the pending row is in the open group, not yet committed
            (pending,) = led.calls(ro.id)
            assert _committed(path, pending.id) is None
            led.end_call(pending.id, "aborted", "test")  # BEGIN-free write: commits the group, then its own
            assert _committed(path, pending.id) == "aborted"
            return await task

        call = asyncio.run(go())
        assert led.get_call(call.id).status == "aborted"


def test_a_caller_cancelled_while_its_completion_commits_leaves_the_call_undelivered(tmp_path):
    import asyncio

    from rowgrove.ledger.store import UNDELIVERED

    with Ledger(tmp_path / "l.sqlite") as led:
        ro = led.create_rollout("g")
        call = led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")

        async def go():
            task = asyncio.ensure_future(led.acomplete_call(
                call.id, sampled_ids=[2], logprobs=[0.0], finish_reason="stop", summary_hash="s",
                response_hash="r", response=None))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(go())
        got = led.get_call(call.id)
        assert got.status == "aborted" and got.error.startswith(UNDELIVERED)
        assert got.sampled_ids.tolist() == [2]


def test_ids_made_later_sort_later_and_stay_unique(tmp_path):
    """Call and rollout ids keep their shapes (chatcmpl- + 24 hex, ro_ + 21 hex) and sort in the
    order they were made, so the ledger's id indexes grow at their ends; none repeats."""
    with Ledger(tmp_path / "l.db") as led:
        ros = [led.create_rollout("g") for _ in range(50)]
        calls = [led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
                 for ro in ros for _ in range(4)]
    rids, cids = [ro.id for ro in ros], [c.id for c in calls]
    assert all(re.fullmatch(r"ro_[0-9a-f]{21}", r) for r in rids)
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", c) for c in cids)
    assert rids == sorted(rids) and cids == sorted(cids)
    assert len(set(rids)) == len(rids) and len(set(cids)) == len(cids)


def test_a_writable_open_drops_the_indexes_inserts_paid_for_and_reads_still_search_one(tmp_path):
    """Ledgers made before kept calls_by_rollout (a copy of UNIQUE (rollout_id, ordinal)'s index)
    and calls_by_request_key (for retries), both updated at every call insert; a writable open
    drops them. Reading a rollout's calls in order and finding a retry's original still search
    an index, never scan the table, and find the same calls."""
    path = tmp_path / "l.db"
    with Ledger(path) as led:
        led.create_rollout("g", rollout_id="ro_a")
    db = sqlite3.connect(path)
    db.execute("CREATE INDEX calls_by_rollout ON calls (rollout_id, ordinal)")
    db.execute("CREATE INDEX calls_by_request_key ON calls (rollout_id, request_key)")
    db.commit()
    db.close()
    with Ledger(path) as led:
        made = [led.begin_call("ro_a", parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h",
                               request_key=k) for k in ("k1", "k2", "k1", "k3")]
        assert [x.id for x in led.calls("ro_a")] == [c.id for c in made]
        assert led.find_retry("ro_a", "k1").id == made[2].id
        assert led.find_retry("ro_a", "k2").id == made[1].id and led.find_retry("ro_a", "k9") is None
    db = sqlite3.connect(path)
    try:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        plans = [" ".join(r[-1] for r in db.execute("EXPLAIN QUERY PLAN " + q, args)) for q, args in (
            ("SELECT id FROM calls WHERE rollout_id=? ORDER BY ordinal", ("ro_a",)),
            ("SELECT id FROM calls WHERE rollout_id=? AND request_key=? ORDER BY ordinal DESC LIMIT 1",
             ("ro_a", "k1")))]
    finally:
        db.close()
    assert not names & {"calls_by_rollout", "calls_by_request_key"}
    for plan in plans:
        assert "USING INDEX" in plan and "TEMP B-TREE" not in plan, plan


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(-(2**31), 2**31 - 1) | st.booleans(), max_size=50),
       xs=st.lists(st.floats(width=32, allow_nan=False) | st.floats(allow_nan=False, allow_infinity=True)
                   | st.integers(-(2**24), 2**24), max_size=50))
def test_packing_a_list_gives_the_bytes_numpy_gives(ids, xs):
    """A list packs without numpy (`array`); the bytes are numpy's little-endian int32/float32."""
    assert pack_ids(ids) == np.asarray(ids, dtype="<i4").tobytes()
    with np.errstate(over="ignore"):
        expected = np.asarray(xs, dtype="<f4").tobytes()
    assert pack_floats(xs) == expected


def test_packing_what_array_refuses_falls_back_to_numpy():
    assert pack_ids([1.7, 2]) == np.asarray([1.7, 2], dtype="<i4").tobytes()  # numpy truncates
    with pytest.raises(OverflowError):
        pack_ids([2**40])  # out of int32: numpy's error, as before
    with np.errstate(over="ignore"):
        assert pack_floats([1e300]) == np.asarray([1e300], dtype="<f4").tobytes()  # inf, as before
