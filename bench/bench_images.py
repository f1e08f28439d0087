"""Ledger bytes of a screenshot agent: images stored once, by pixels, against storing every image
with every call that carries it.

Workload: one rollout of `turns` calls through a real gateway (`tiny-vl`, scripted engine, real
HTTP, the openai SDK). Every turn sends a new screenshot (drawn on the spot: 320x200 PNG with
noise, so it does not compress to nothing) and the harness keeps only the newest `keep` images
(older ones are dropped: compaction, a new root each time). Then the rollout is finished with its
conversations.

Measured: the ledger's image bytes (media table) against (a) the unique images' bytes (goal:
<= 1.05x) and (b) the baseline of storing every image of every call's prompt with that call
(what a ledger without a media table would hold), built from the same ledger (its media table
replaced by a table of every call's image bytes) and measured the same way: both files after a
checkpoint and VACUUM, in the same run.

    python bench/bench_images.py [--turns 30] [--keep 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "images.json"


def screenshot(k: int) -> bytes:
    """A 320x200 PNG with a seeded noise band (incompressible) and a counter box."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(k)
    arr = np.full((200, 320, 3), 235, np.uint8)
    arr[20:60, :, :] = rng.integers(0, 256, (40, 320, 3), dtype=np.uint8)
    arr[100:140, 20 + 8 * k: 60 + 8 * k] = (200, 30, 30)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def run(turns: int, keep: int) -> dict:
    import openai

    from rowgrove.gateway.testing import start_gateway

    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-images-") as tmp:
        path = Path(tmp) / "ledger.db"
        shots = [screenshot(k) for k in range(turns)]
        urls = ["data:image/png;base64," + base64.b64encode(s).decode() for s in shots]
        t0 = time.perf_counter()
        with start_gateway("tiny-vl", engine="scripted", ledger=path) as gw:
            ro = gw.create_rollout("bench")
            cli = openai.OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
            history: list[dict] = []
            conversations: list[list[dict]] = []
            per_call_image_bytes = 0
            for k in range(turns):
                history.append({"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": urls[k]}},
                    {"type": "text", "text": f"step {k}: what changed?"}]})
                # keep the newest `keep` images: older user turns lose their image (a rewrite)
                kept = sum(1 for m in history if isinstance(m.get("content"), list))
                if kept > keep:
                    conversations.append(list(history[:-1]))
                    for m in history:
                        if isinstance(m.get("content"), list) and kept > keep:
                            m["content"] = m["content"][1]["text"] + " (screenshot dropped)"
                            kept -= 1
                r = cli.chat.completions.create(model="tiny-vl", messages=history,
                                                extra_body={"script": f"moved {k}"})
                history.append({"role": "assistant", "content": r.choices[0].message.content})
                per_call_image_bytes += sum(len(shots[j]) for j in range(max(0, k - keep + 1), k + 1))
            conversations.append(list(history))
            gw.finish(ro["rollout_id"], conversations=conversations, reward=1.0)
            n_rows = len(gw.rows(ro["rollout_id"])["rows"])
            calls = gw.ledger.calls(ro["rollout_id"])
        wall = time.perf_counter() - t0
        db = sqlite3.connect(path)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("VACUUM")
        media_bytes = db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM media").fetchone()[0]
        n_media = db.execute("SELECT COUNT(*) FROM media").fetchone()[0]
        refs = db.execute("SELECT COUNT(*) FROM call_media").fetchone()[0]
        db.close()
        file_bytes = path.stat().st_size
        # the baseline, built from the same ledger: every call stores the bytes of every image
        # its prompt carried (no media table), measured as a file the same way
        base = Path(tmp) / "per_call.db"
        base.write_bytes(path.read_bytes())
        db = sqlite3.connect(base)
        db.execute("PRAGMA foreign_keys=OFF")
        db.execute("CREATE TABLE call_images AS SELECT c.call_id, c.position, m.data FROM call_media c "
                   "JOIN media m ON m.digest = c.digest")
        db.execute("DROP TABLE media")
        db.commit()
        db.execute("VACUUM")
        baseline_stored = db.execute("SELECT SUM(LENGTH(data)) FROM call_images").fetchone()[0]
        db.close()
        baseline_file_bytes = base.stat().st_size
    unique = sum(len(s) for s in shots)
    ratio = media_bytes / unique
    return {
        "turns": turns, "keep": keep, "calls": len(calls), "roots": sum(c.root for c in calls), "rows": n_rows,
        "unique_image_bytes": unique, "ledger_image_bytes": media_bytes, "images_stored": n_media,
        "image_references": refs, "per_call_baseline_image_bytes": per_call_image_bytes,
        "ledger_file_bytes": file_bytes, "per_call_baseline_file_bytes": baseline_file_bytes,
        "per_call_baseline_stored_image_bytes": baseline_stored,
        "baseline_vs_ledger_file_ratio": round(baseline_file_bytes / file_bytes, 3),
        "ledger_vs_unique_ratio": round(ratio, 4),
        "ledger_file_vs_unique_ratio": round(file_bytes / unique, 3),   # the rest: token arrays, records, indexes
        "baseline_vs_ledger_ratio": round(per_call_image_bytes / max(media_bytes, 1), 3),
        "wall_s": round(wall, 2),
        "goals": {"ledger_image_bytes_vs_unique": {"value": round(ratio, 4), "goal": "<= 1.05", "met": ratio <= 1.05}},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="8 turns: a smoke check, no results file")
    p.add_argument("--out", default=None, help=f"results file (default {RESULTS}; with --quick, none unless given)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    result = run(8 if args.quick else args.turns, args.keep)
    out = args.out or (None if args.quick else RESULTS)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
