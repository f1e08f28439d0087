"""SQLite store for rollouts and calls (WAL mode; the file's layout is `rowgrove.ledger.schema`,
how its values are stored `rowgrove.ledger.codec`).

Token arrays are packed little-endian int32 blobs (logprobs float32, weight versions int32, one
per sampled id): 2× smaller and ~30× faster to read than JSON. A root stores its full prompt; a
continuation stores only the part it added after its parent's sampled tokens, so a 100-turn
rollout stores each token about once.

A call is written as `pending` before the engine is asked and completed, failed or aborted after;
the gateway answers the harness only after the completion is committed, and moves a completed call
to aborted when its response did not reach the client in full (`mark_undelivered`). Nothing is
deleted. `durability` chooses SQLite's `synchronous` (see `synchronous_for`).

Group commit. The gateway writes calls with `abegin_call` / `acomplete_call`, and new rollouts
with `acreate_rollout`: each statement joins the one open transaction, opened by the first of them
and committed once after the event loop's next turn, so the writes of two turns share it; each
caller resumes only after that commit. Concurrent calls thus share a commit (at 32 concurrent
rollouts, one commit serves several calls) while every caller keeps the guarantee it had with a
commit of its own: a pending row is on the WAL before the engine is asked, a completion before
the harness is answered, a rollout before its key is handed out. Every other write first commits
the open group.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rowgrove.errors import Conflict, InputError, NotFound
from rowgrove.ledger.codec import (call_from_row, check_versions, from_json, ordered_hex, pack_floats, pack_ids,
                                    rollout_from_row, to_json, unpack_ids, unpack_versions)
from rowgrove.ledger.schema import (ROLLOUT_COLUMNS, SCHEMA, SCHEMA_VERSION, UNDELIVERED, call_columns, open_ledger_db,
                                     prepare_ledger_db, synchronous_for, table_columns)
from rowgrove.types import Call, CallOutline, Rollout

class Ledger:
    """One SQLite file holding rollouts and their calls. Safe to share between threads.

    A writable open migrates a ledger of an older schema version (1, 2) in place; a read-only one
    reads it as it is, the columns it lacks reading as their defaults. `call_table_columns` names
    the columns the file's calls table has."""

    def __init__(self, path: str | Path, *, readonly: bool = False, durability: str = "normal"):
        synchronous = synchronous_for(durability)  # InputError before anything is opened
        self.path = str(path)
        # refuses (InputError, connection closed) a directory, a file that is not SQLite and an
        # SQLite file without rowgrove's tables, before anything is written to it
        self._db = open_ledger_db(Path(self.path), readonly)
        prepare_ledger_db(self._db, self.path, readonly, synchronous)
        # read-only on an older version: the columns it lacks read as their defaults
        self.call_table_columns = frozenset(table_columns(self._db, "calls"))
        self._call_columns = call_columns(self.call_table_columns)
        self._lock = threading.RLock()
        self._next_ordinal: dict[str, int] = {}
        self._group_open = False  # a transaction of grouped writes is open on self._db
        self._group_waiters: list[asyncio.Future] = []  # resolved when that transaction commits

    def close(self) -> None:
        with self._lock:
            self._commit_group()
            self._db.close()

    # -- group commit ---------------------------------------------------------------------

    def _join_group(self) -> asyncio.Future:
        """Open the group transaction if none is (its commit scheduled two turns of the running
        loop ahead) and return a future resolved once it is committed. Under self._lock."""
        loop = asyncio.get_running_loop()
        if not self._group_open:
            self._db.execute("BEGIN")
            self._group_open = True
            # committed after the next turn, not this one's end: the writes of two turns share
            # it (measured +10% calls/s at 32 concurrent rollouts; a turn costs microseconds)
            loop.call_soon(loop.call_soon, self._commit_group)
        fut = loop.create_future()
        self._group_waiters.append(fut)
        return fut

    def _commit_group(self) -> None:
        """Commit the open group transaction (nothing when none is open) and resolve its waiters:
        with None, or with the error when the commit failed (then it is rolled back, and the
        in-memory ordinals are re-read from the file)."""
        with self._lock:
            if not self._group_open:
                return
            waiters, self._group_waiters, self._group_open = self._group_waiters, [], False
            error: BaseException | None = None
            try:
                self._db.execute("COMMIT")
            except BaseException as e:  # a full disk, an I/O error: no grouped write is kept
                error = e
                self._next_ordinal.clear()
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
        for fut in waiters:
            _resolve(fut, error)

    async def _await_group(self, fut: asyncio.Future) -> None:
        """Wait for the group commit that holds this caller's write. A cancelled caller stops
        waiting, but the commit still happens: it is left to the caller to record what that means.
        The future is this caller's alone (a cancelled one is skipped when the group settles), so
        it is awaited as it is, without a shield's second future."""
        await fut

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rollouts -------------------------------------------------------------------------

    def create_rollout(
        self,
        group_id: str | None,
        metadata: dict[str, Any] | None = None,
        *,
        rollout_id: str | None = None,
        api_key: str | None = None,
    ) -> Rollout:
        """A new open rollout with its own id and API key."""
        return self._create_rollout(group_id, metadata, rollout_id, api_key, grouped=False)[0]

    async def acreate_rollout(
        self,
        group_id: str | None,
        metadata: dict[str, Any] | None = None,
        *,
        rollout_id: str | None = None,
        api_key: str | None = None,
    ) -> Rollout:
        """`create_rollout` in the group commit (module docstring): returns once the rollout is
        committed, its insert sharing the transaction of this loop turn's calls."""
        ro, fut = self._create_rollout(group_id, metadata, rollout_id, api_key, grouped=True)
        assert fut is not None
        await self._await_group(fut)
        return ro

    def _create_rollout(self, group_id: str | None, metadata: dict[str, Any] | None, rollout_id: str | None,
                        api_key: str | None, *, grouped: bool) -> tuple[Rollout, asyncio.Future | None]:
        ro = Rollout(
            id=rollout_id or "ro_" + ordered_hex(21),
            group_id=group_id,
            api_key=api_key or "rk_" + secrets.token_urlsafe(24),
            metadata=dict(metadata or {}),
            created_at=time.time(),
        )
        fut = None
        with self._lock:
            if grouped:
                fut = self._join_group()
            else:
                self._commit_group()  # a write of its own: the open group commits first
            try:
                self._db.execute(
                    "INSERT INTO rollouts(id, group_id, api_key, status, metadata, created_at) "
                    "VALUES (?, ?, ?, 'open', ?, ?)",
                    (ro.id, ro.group_id, ro.api_key, to_json(ro.metadata), ro.created_at),
                )
            except sqlite3.IntegrityError:
                if fut is not None:
                    fut.cancel()  # nobody waits for it: the group commits the others' writes
                raise Conflict(f"rollout {ro.id} already exists: choose another id") from None
        return ro, fut

    def get_rollout(self, rollout_id: str) -> Rollout:
        with self._lock:
            r = self._db.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id=?", (rollout_id,)
            ).fetchone()
        if r is None:
            raise NotFound(f"rollout {rollout_id} not found: create it with POST /v1/rollouts")
        return rollout_from_row(r)

    def rollout_by_key(self, api_key: str) -> Rollout | None:
        """The rollout whose api_key is `api_key`, or None."""
        with self._lock:
            r = self._db.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE api_key=?", (api_key,)).fetchone()
        return rollout_from_row(r) if r is not None else None

    def rollouts(self, status: str | None = None) -> list[Rollout]:
        sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts"
        args: tuple = ()
        if status is not None:
            sql += " WHERE status=?"
            args = (status,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY created_at, id", args).fetchall()
        return [rollout_from_row(r) for r in rows]

    def finish_rollout(
        self, rollout_id: str, record: dict[str, Any] | None, reward: float | None, valid: bool = True
    ) -> Rollout:
        """Store the harness's accepted conversation(s) and reward; a rollout finishes once."""
        with self._lock:
            self._commit_group()  # a write of its own: the open group commits first
            self._db.execute("BEGIN IMMEDIATE")
            try:
                ro = self.get_rollout(rollout_id)
                if ro.status == "finished":
                    raise Conflict(f"rollout {rollout_id} is already finished: start a new rollout")
                now = time.time()
                self._db.execute(
                    "UPDATE rollouts SET status='finished', record=?, reward=?, valid=?, finished_at=? "
                    "WHERE id=?",
                    (to_json(record), reward, int(bool(valid)), now, rollout_id),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return self.get_rollout(rollout_id)

    # -- calls ----------------------------------------------------------------------------

    def begin_call(
        self,
        rollout_id: str,
        *,
        parent_id: str | None,
        prompt_ids: Sequence[int] | np.ndarray,
        prompt_len: int,
        request_hash: str,
        request_key: str | None = None,
        call_id: str | None = None,
        history_drift: bool = False,
    ) -> Call:
        """Record a call as pending before the engine is asked (committed on return); assigns its
        ordinal. `history_drift`: a continuation that kept its parent's tokens where the template
        renders the history differently."""
        call, _ = self._begin_call(rollout_id, parent_id, prompt_ids, prompt_len, request_hash, request_key,
                                   call_id, history_drift, grouped=False)
        return call

    async def abegin_call(
        self,
        rollout_id: str,
        *,
        parent_id: str | None,
        prompt_ids: Sequence[int] | np.ndarray,
        prompt_len: int,
        request_hash: str,
        request_key: str | None = None,
        call_id: str | None = None,
        history_drift: bool = False,
    ) -> Call:
        """`begin_call` in the group commit (module docstring): returns once the pending row is
        committed, so the engine may be asked. A caller cancelled while waiting leaves the call
        aborted, never pending."""
        call, fut = self._begin_call(rollout_id, parent_id, prompt_ids, prompt_len, request_hash, request_key,
                                     call_id, history_drift, grouped=True)
        assert fut is not None
        try:
            await self._await_group(fut)
        except asyncio.CancelledError:
            self.end_call(call.id, "aborted", "request cancelled before the engine was asked")
            raise
        return call

    def _begin_call(self, rollout_id: str, parent_id: str | None, prompt_ids: Sequence[int] | np.ndarray,
                    prompt_len: int, request_hash: str, request_key: str | None, call_id: str | None,
                    history_drift: bool, *, grouped: bool) -> tuple[Call, asyncio.Future | None]:
        now = time.time()
        cid = call_id or "chatcmpl-" + ordered_hex(24)
        blob = pack_ids(prompt_ids)
        fut = None
        with self._lock:
            if grouped:
                fut = self._join_group()
            else:
                self._commit_group()
            # Ordinals are counted in memory after the first call of a rollout: this process is
            # the ledger's only writer, and UNIQUE(rollout_id, ordinal) guards the assumption.
            ordinal = self._next_ordinal.get(rollout_id)
            if ordinal is None:
                (ordinal,) = self._db.execute(
                    "SELECT COALESCE(MAX(ordinal), 0) + 1 FROM calls WHERE rollout_id=?", (rollout_id,)
                ).fetchone()
            try:
                self._db.execute(
                    "INSERT INTO calls(id, rollout_id, ordinal, parent_id, root, status, prompt_ids, "
                    "prompt_len, request_hash, request_key, created_at, history_drift) "
                    "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
                    (cid, rollout_id, ordinal, parent_id, int(parent_id is None), blob, prompt_len,
                     request_hash, request_key, now, int(history_drift)),
                )
            except sqlite3.IntegrityError as e:
                self._next_ordinal.pop(rollout_id, None)
                if fut is not None:  # the statement was undone; the group goes on without it
                    self._group_waiters.remove(fut)
                if "FOREIGN KEY" in str(e):
                    raise NotFound(f"rollout {rollout_id} not found: create it with POST /v1/rollouts") from None
                raise Conflict(
                    f"call {cid} of rollout {rollout_id} could not be recorded (ordinal {ordinal} taken): "
                    "only one process may write a ledger"
                ) from None
            self._next_ordinal[rollout_id] = ordinal + 1
        return Call(
            id=cid, rollout_id=rollout_id, ordinal=ordinal, parent_id=parent_id,
            root=parent_id is None, status="pending", prompt_ids=unpack_ids(blob),
            prompt_len=prompt_len, request_hash=request_hash, request_key=request_key, created_at=now,
            history_drift=history_drift,
        ), fut

    def complete_call(
        self,
        call_id: str,
        *,
        sampled_ids: Sequence[int] | np.ndarray,
        logprobs: Sequence[float] | np.ndarray,
        finish_reason: str,
        summary_hash: str,
        response_hash: str,
        response: dict[str, Any] | None,
        weight_versions: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Commit the engine's answer; only after this may the harness see it.
        `weight_versions`: the weight version that sampled each id (one per sampled id, >= 0);
        None stores them as unknown."""
        self._complete_call(call_id, sampled_ids, logprobs, finish_reason, summary_hash, response_hash, response,
                            weight_versions, grouped=False)

    async def acomplete_call(
        self,
        call_id: str,
        *,
        sampled_ids: Sequence[int] | np.ndarray,
        logprobs: Sequence[float] | np.ndarray,
        finish_reason: str,
        summary_hash: str,
        response_hash: str,
        response: dict[str, Any] | None,
        weight_versions: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """`complete_call` in the group commit (module docstring): returns once the completion is
        committed, so the harness may see it. A caller cancelled while waiting (its client left)
        leaves the call aborted as undelivered: it was committed, but no answer went out."""
        fut = self._complete_call(call_id, sampled_ids, logprobs, finish_reason, summary_hash, response_hash,
                                  response, weight_versions, grouped=True)
        assert fut is not None
        try:
            await self._await_group(fut)
        except asyncio.CancelledError:
            self.mark_undelivered(call_id, "the request was cancelled while its completion was committed")
            raise

    def _complete_call(self, call_id: str, sampled_ids: Sequence[int] | np.ndarray,
                       logprobs: Sequence[float] | np.ndarray, finish_reason: str, summary_hash: str,
                       response_hash: str, response: dict[str, Any] | None,
                       weight_versions: Sequence[int] | np.ndarray | None, *, grouped: bool) -> asyncio.Future | None:
        if len(sampled_ids) != len(logprobs):
            raise InputError(
                f"call {call_id}: {len(sampled_ids)} sampled ids but {len(logprobs)} logprobs"
            )
        versions = check_versions(call_id, sampled_ids, weight_versions)
        args = (pack_ids(sampled_ids), pack_floats(logprobs), versions, finish_reason, summary_hash,
                response_hash, to_json(response), time.time(), call_id)
        with self._lock:
            fut = self._join_group() if grouped else None
            if fut is None:
                self._commit_group()
            try:
                cur = self._db.execute(
                    "UPDATE calls SET status='completed', sampled_ids=?, logprobs=?, weight_versions=?, "
                    "finish_reason=?, summary_hash=?, response_hash=?, response=?, completed_at=? "
                    "WHERE id=? AND status='pending'", args)
                if cur.rowcount != 1:
                    raise Conflict(f"call {call_id} is not pending: it was completed or ended already")
            except BaseException:
                if fut is not None:  # nothing of this caller's is in the group
                    self._group_waiters.remove(fut)
                raise
            return fut

    def end_call(
        self,
        call_id: str,
        status: str,
        error: str,
        *,
        sampled_ids: Sequence[int] | np.ndarray = (),
        logprobs: Sequence[float] | np.ndarray = (),
        weight_versions: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Mark a pending call failed or aborted, keeping whatever the engine had sampled (and,
        when given, the weight version of each sampled id, as in `complete_call`)."""
        if status not in ("failed", "aborted"):
            raise InputError(f"end_call status must be 'failed' or 'aborted', not {status!r}")
        versions = check_versions(call_id, sampled_ids, weight_versions)
        with self._lock:
            self._commit_group()  # a write of its own: the open group commits first
            self._db.execute(
                "UPDATE calls SET status=?, error=?, sampled_ids=?, logprobs=?, weight_versions=?, completed_at=? "
                "WHERE id=? AND status='pending'",
                (status, error, pack_ids(sampled_ids), pack_floats(logprobs), versions, time.time(), call_id),
            )

    def abort_pending(self, reason: str = "server restarted while the call was in flight") -> int:
        """Mark every pending call aborted (after a crash); returns how many."""
        with self._lock:
            self._commit_group()  # a write of its own: the open group commits first
            cur = self._db.execute(
                "UPDATE calls SET status='aborted', error=?, completed_at=? WHERE status='pending'",
                (reason, time.time()),
            )
        return cur.rowcount

    def mark_undelivered(self, call_id: str, why: str) -> bool:
        """Move a completed call whose response did not reach the client in full (a stream cut, a
        connection closed before the body was sent) to `aborted`, with an error that says so and
        why; its sampled ids, logprobs and response stay for inspection. Such a call is never
        trained and is never a parent. Returns False (nothing changed) unless it was completed."""
        with self._lock:
            self._commit_group()  # a write of its own: the open group commits first
            cur = self._db.execute(
                "UPDATE calls SET status='aborted', error=? WHERE id=? AND status='completed'",
                (f"{UNDELIVERED}: {why}", call_id),
            )
        return cur.rowcount == 1

    def get_call(self, call_id: str) -> Call:
        with self._lock:
            r = self._db.execute(f"SELECT {self._call_columns} FROM calls WHERE id=?", (call_id,)).fetchone()
        if r is None:
            raise NotFound(f"call {call_id} not found")
        return call_from_row(r)

    def calls(self, rollout_id: str) -> list[Call]:
        """The rollout's calls in ordinal order."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {self._call_columns} FROM calls WHERE rollout_id=? ORDER BY ordinal", (rollout_id,)
            ).fetchall()
        return [call_from_row(r) for r in rows]

    def call_outlines(self, rollout_id: str) -> list[CallOutline]:
        """The rollout's calls in ordinal order, each without its token and logprob arrays or its
        response: what a lineage shows, read without decoding what it does not show (a response
        is decoded only when it records hosted tools dropped)."""
        cols = self.call_table_columns
        drift = "history_drift" if "history_drift" in cols else "0"
        versions = "weight_versions" if "weight_versions" in cols else "NULL"
        with self._lock:
            rows = self._db.execute(
                "SELECT id, ordinal, parent_id, root, status, prompt_len, COALESCE(length(sampled_ids), 0) / 4, "
                f"finish_reason, {drift}, {versions}, "
                "CASE WHEN instr(response, 'hosted_tools_dropped') > 0 THEN response END "
                "FROM calls WHERE rollout_id=? ORDER BY ordinal", (rollout_id,)).fetchall()
        out = []
        for r in rows:
            vs = unpack_versions(r[9])
            dropped = (from_json(r[10]) or {}).get("hosted_tools_dropped") if r[10] is not None else None
            out.append(CallOutline(
                id=r[0], ordinal=r[1], parent_id=r[2], root=bool(r[3]), status=r[4], prompt_len=r[5],
                sampled=int(r[6]), finish_reason=r[7], history_drift=bool(r[8]),
                weight_range=None if vs is None or len(vs) == 0 else (int(vs.min()), int(vs.max())),
                hosted_tools_dropped=list(dropped) if isinstance(dropped, list) and dropped else None))
        return out

    def find_retry(self, rollout_id: str, request_key: str) -> Call | None:
        """The most recent call of this rollout made from the same request body, if any."""
        with self._lock:
            r = self._db.execute(
                f"SELECT {self._call_columns} FROM calls WHERE rollout_id=? AND request_key=? "
                "ORDER BY ordinal DESC LIMIT 1",
                (rollout_id, request_key),
            ).fetchone()
        return None if r is None else call_from_row(r)

    def iter_finished(self) -> Iterator[tuple[Rollout, list[Call]]]:
        """Every finished rollout with its calls, in creation order, read in one pass."""
        with self._lock:
            ros = self._db.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE status='finished' ORDER BY created_at, id"
            ).fetchall()
        for r in ros:
            ro = rollout_from_row(r)
            yield ro, self.calls(ro.id)

    # -- media (images, stored once; rowgrove.ledger.media reads them back) ------------------

    def put_images(self, images: Sequence[Any], processor: dict[str, Any] | None = None) -> None:
        """Store each image (`rowgrove.media.Image`) once, by pixel digest, with the processor
        settings that make its processed form; an image already stored is left as it is."""
        import hashlib

        pid = None
        blob = None
        if processor is not None:
            blob = orjson.dumps(processor, option=orjson.OPT_SORT_KEYS)
            pid = hashlib.sha256(blob).hexdigest()[:32]
        with self._lock:
            self._commit_group()  # a write of its own: the open group commits first
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if pid is not None:
                    self._db.execute("INSERT OR IGNORE INTO processors(id, config) VALUES (?, ?)", (pid, blob))
                self._db.executemany(
                    "INSERT OR IGNORE INTO media(digest, mime, width, height, data, processor) VALUES (?, ?, ?, ?, ?, ?)",
                    [(im.digest, im.mime, im.width, im.height, im.data, pid) for im in images])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def link_images(self, call_id: str, digests: Sequence[str],
                    places: Sequence[tuple[int, int]] | None = None) -> None:
        """Record the images of call `call_id`'s full prompt, in order (stored with put_images),
        and where its request held each one ((message, part) pairs, when given)."""
        at = list(places) if places is not None else [(None, None)] * len(digests)
        with self._lock:
            self._commit_group()  # a write of its own: the open group commits first
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO call_media(call_id, position, digest, message, part) VALUES (?, ?, ?, ?, ?)",
                    [(call_id, k, d, i, j) for k, (d, (i, j)) in enumerate(zip(digests, at, strict=True))])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def call_images(self, rollout_id: str) -> dict[str, list[str]]:
        """{call id: its full prompt's image digests in order} for the rollout's calls that had images."""
        if "call_media" not in self._tables():
            return {}
        with self._lock:
            rows = self._db.execute(
                "SELECT m.call_id, m.digest FROM call_media m JOIN calls c ON c.id = m.call_id "
                "WHERE c.rollout_id=? ORDER BY m.call_id, m.position", (rollout_id,)).fetchall()
        out: dict[str, list[str]] = {}
        for cid, digest in rows:
            out.setdefault(cid, []).append(digest)
        return out

    def set_image_summary(self, call_id: str, blind_summary: str) -> None:
        """Record a completed call's image-blind summary (`gateway.images.blind_summary`)."""
        with self._lock:
            self._commit_group()  # a write of its own: the open group commits first
            self._db.execute("INSERT OR REPLACE INTO call_image_summaries(call_id, blind_summary) VALUES (?, ?)",
                             (call_id, blind_summary))

    def image_summaries(self, rollout_id: str) -> dict[str, tuple[str, list[tuple[int, int, str]]]]:
        """{call id: (image-blind summary, [(message, part, digest), ...])} of the rollout's calls
        that recorded one: what the gateway's kept-image check rebuilds after a restart."""
        if "call_image_summaries" not in self._tables():
            return {}
        with self._lock:
            rows = self._db.execute(
                "SELECT s.call_id, s.blind_summary, m.message, m.part, m.digest FROM call_image_summaries s "
                "JOIN calls c ON c.id = s.call_id JOIN call_media m ON m.call_id = s.call_id "
                "WHERE c.rollout_id=? AND m.message IS NOT NULL ORDER BY s.call_id, m.position",
                (rollout_id,)).fetchall()
        out: dict[str, tuple[str, list[tuple[int, int, str]]]] = {}
        for cid, blind, i, k, digest in rows:
            out.setdefault(cid, (blind, []))[1].append((int(i), int(k), digest))
        return out

    def get_image_record(self, digest: str) -> tuple[str, int, int, bytes, Any] | None:
        """(mime, width, height, bytes, processor config or None) of a stored image, or None."""
        if "media" not in self._tables():
            return None
        with self._lock:
            r = self._db.execute(
                "SELECT m.mime, m.width, m.height, m.data, p.config FROM media m "
                "LEFT JOIN processors p ON p.id = m.processor WHERE m.digest=?", (digest,)).fetchone()
        if r is None:
            return None
        return r[0], int(r[1]), int(r[2]), bytes(r[3]), from_json(r[4])

    def _tables(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def count(self, status: str | None = None) -> int:
        """Number of rollouts (optionally with this status)."""
        sql, args = "SELECT COUNT(*) FROM rollouts", ()
        if status is not None:
            sql, args = sql + " WHERE status=?", (status,)
        with self._lock:
            return int(self._db.execute(sql, args).fetchone()[0])


def _resolve(fut: asyncio.Future, error: BaseException | None) -> None:
    """Settle a group-commit waiter from any thread: directly on its loop's thread, else through
    the loop (a future is not thread-safe)."""
    loop = fut.get_loop()
    try:
        here = asyncio.get_running_loop() is loop
    except RuntimeError:
        here = False
    if here:
        _settle(fut, error)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(_settle, fut, error)


def _settle(fut: asyncio.Future, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)

__all__ = ["SCHEMA", "SCHEMA_VERSION", "UNDELIVERED", "Ledger", "pack_floats", "pack_ids", "unpack_ids"]
