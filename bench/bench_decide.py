"""Cost of `decide` for call 200 vs call 1 of one conversation (goal for the gateway's whole per-call
overhead: ratio <= 1.2; this measures decide alone), with the baseline of hashing every message of
every request from scratch (no memo) measured in the same run.

    .venv/bin/python bench/bench_decide.py [--model tiny | --family qwen3] [--calls 200] [--reps 5]

`--family NAME` runs on a tiny model built around a real model's chat template (the catalog in
tests/families.py, templates read from ../shared/templates): `--family qwen3` is the real Qwen3
template, whose continuations are found in its rendering of the whole request (O(history) Jinja
per call, the price of exactness for templates that look at the whole conversation).

Also reported: call 200 vs call 2 (the first continuation), since a root's cost (call 1) includes
rendering the system prompt and tools, which continuations never do.

Each repetition is a new conversation to the renderer: its cache of tokenized text pieces is
emptied first (a rollout's first call meets text it has not seen). The root render of the last
request is reported cold (pieces not yet tokenized) and again (the same request rendered whole a
second time, e.g. a rollout that restarts from the same history: every piece seen), medians of
five, in wall time and, for the cold one, also in CPU time (all threads: the tokenizer tokenizes a
large prompt's pieces as one threaded batch).

`--before PATH` also runs this benchmark, in a subprocess, against the source tree at PATH (e.g.
`git worktree add /tmp/rowgrove-before <commit>`), alternating with this tree, and prints the two
side by side; both land in the results file.

One agent conversation: a system prompt, two tools, then per call an assistant tool call answered
by a ~600-byte tool result (every fifth round a user message too). Each call is decided exactly as
the gateway does (fresh per-rollout index per repetition, so each request meets the memo the way a
live rollout does: all but its newest messages already hashed). Prints medians and ratios; writes
bench/results/decide.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search", "description": "Search the repository for text",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},
]
SYSTEM = "You are a careful coding agent. " * 16
RESULT = "def f(x):\n    return x + 1  # the value of the file line\n" * 11


def conversation(calls: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(all messages, the assistant replies in order); request k = messages before reply k."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix the bug in f"}]
    replies = []
    for k in range(calls):
        reply = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [{
            "id": f"call_{k}", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/module_{k}.py"})}}]}
        replies.append(reply)
        msgs.append(reply)
        msgs.append({"role": "tool", "tool_call_id": f"call_{k}", "content": f"{k}\n{RESULT}"})
        if k % 5 == 4:
            msgs.append({"role": "user", "content": f"keep going, round {k}"})
    return msgs, replies


def run_once(renderer: Any, msgs: list[dict[str, Any]], replies: list[dict[str, Any]], *, memo: bool) -> list[float]:
    """Seconds spent in decide for each call of one rollout."""
    D = _decide_module()
    from rowgrove.toolcalls import format_assistant_text

    index = D.RolloutIndex() if memo else _no_memo_index()
    _forget_pieces(renderer)  # a new conversation: none of its text tokenized yet
    times = []
    ends = [msgs.index(r) for r in replies]
    tok = renderer.tokenizer
    for k, (reply, end) in enumerate(zip(replies, ends, strict=True)):
        request = msgs[:end]
        t0 = time.perf_counter()
        d = D.decide(index, request, renderer, tools=TOOLS)
        times.append(time.perf_counter() - t0)
        if k > 0 and d.parent_id is None:
            raise SystemExit(f"call {k + 1} was a root ({d.reason}): the benchmark conversation is wrong")
        fn = reply["tool_calls"][0]["function"]
        body = format_assistant_text(None, [(fn["name"], json.loads(fn["arguments"]))])
        sampled = tok.encode(body, add_special_tokens=False) + [renderer.end_of_turn_id]
        summary, _ = D.summary_hashes(d, reply)
        extra = {"window": d.window} if hasattr(d, "window") else {}  # the window path's facts (absent before)
        index.add_call(f"c{k}", summary, d.full_prompt_ids + sampled, parent_id=d.parent_id,
                       context_text=d.context_text + renderer.decode(sampled), **extra)
    return times


def _no_memo_index() -> Any:
    D = _decide_module()
    from rowgrove.hashing import chain_hashes

    class NoMemo(D.RolloutIndex):
        """The naive baseline: every message of every request validated and hashed again."""

        def chain(self, messages: Any, h0: bytes, *_images: Any) -> list[bytes]:
            D.validate_messages(messages)
            return chain_hashes(messages, h0)

    return NoMemo()



def measure(args: argparse.Namespace) -> dict:
    """One measurement of this process's rowgrove (see the module docstring)."""
    Renderer = _decide_module("render").Renderer
    from rowgrove.model.load import load_tokenizer

    model = args.model
    if args.family:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from families import family_model_dir

        model = str(family_model_dir(args.family))
    renderer = Renderer(load_tokenizer(model))
    msgs, replies = conversation(args.calls)
    run_once(renderer, msgs, replies, memo=True)  # warm-up (template compile, probe caches)

    def per_call(memo: bool) -> list[float]:
        runs = [run_once(renderer, msgs, replies, memo=memo) for _ in range(args.reps)]
        return [statistics.median(r[k] for r in runs) for k in range(args.calls)]

    with_memo = per_call(True)
    without = per_call(False)
    last = slice(args.calls - 5, args.calls)   # calls 196..200: the median of five, less noise
    first_us = with_memo[0] * 1e6
    late_us = statistics.median(with_memo[last]) * 1e6
    late_nomemo_us = statistics.median(without[last]) * 1e6
    second_us = with_memo[1] * 1e6
    n_msgs = msgs.index(replies[-1])
    D = _decide_module()
    idx = D.RolloutIndex()
    final = D.decide(idx, msgs[:n_msgs], renderer, tools=TOOLS)
    assert final.root  # a fresh index: the same request rendered whole, for scale
    result = {
        "model": args.family or args.model,
        "calls": args.calls,
        "reps": args.reps,
        "messages_in_last_request": n_msgs,
        "request_bytes_last": len(json.dumps(msgs[:n_msgs])),
        "context_tokens_last": len(final.prompt_ids),
        "decide_us_call_1_root": round(first_us, 1),
        "decide_us_call_2": round(second_us, 1),
        "decide_us_calls_196_200": round(late_us, 1),
        "decide_us_calls_196_200_no_memo": round(late_nomemo_us, 1),
        "ratio_call_200_vs_call_1": round(late_us / first_us, 3),
        "ratio_call_200_vs_call_2": round(late_us / second_us, 3),
        "ratio_no_memo_call_200_vs_call_1": round(late_nomemo_us / first_us, 3),
    }
    roots_cold, roots_again, cpu_cold = [], [], []
    for _ in range(5):
        _forget_pieces(renderer)
        c0, t0 = time.process_time(), time.perf_counter()
        renderer.render_root(msgs[:n_msgs], TOOLS)
        c1, t1 = time.process_time(), time.perf_counter()
        renderer.render_root(msgs[:n_msgs], TOOLS)
        roots_cold.append(t1 - t0)
        cpu_cold.append(c1 - c0)
        roots_again.append(time.perf_counter() - t1)
    result["root_render_us_last_request_cold"] = round(statistics.median(roots_cold) * 1e6, 1)
    result["root_render_us_last_request_again"] = round(statistics.median(roots_again) * 1e6, 1)
    # CPU time of the cold render, all the process's threads together (the tokenizer's batch is threaded)
    result["root_render_cpu_us_last_request_cold"] = round(statistics.median(cpu_cold) * 1e6, 1)
    fast = getattr(renderer, "fast", None)
    result["fast_path"] = None if fast is None else "minijinja window"
    return result


def _decide_module(name: str = "decide") -> Any:
    """rowgrove's `gateway.core.<name>` (`gateway.<name>` in a tree from before the core package)."""
    import importlib

    try:
        return importlib.import_module(f"rowgrove.gateway.core.{name}")
    except ImportError:
        return importlib.import_module(f"rowgrove.gateway.{name}")


def _forget_pieces(renderer: Any) -> None:
    pieces = getattr(renderer, "_pieces", None)  # absent before the piece cache existed
    if pieces is not None:
        pieces.clear()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--family", default=None, help="a family of tests/families.py (e.g. qwen3); overrides --model")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer calls and repeats (smoke check)")
    ap.add_argument("--before", default=None, help="a source tree to measure side by side (its src/ is imported)")
    ap.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.calls = 1, min(args.calls, 40)
    if args.json_only:
        print(json.dumps(measure(args)))
        return {}
    rounds = []
    for _ in range(2 if args.before else 1):  # alternate: the machine's load drifts
        rounds.append(("after", _in_subprocess(args, None) if args.before else measure(args)))
        if args.before:
            rounds.append(("before", _in_subprocess(args, args.before)))
    after = _median_of([r for k, r in rounds if k == "after"])
    before = _median_of([r for k, r in rounds if k == "before"]) if args.before else None
    result = dict(after)
    result["python"] = platform.python_version()
    result["machine"] = platform.machine()
    result["load_avg_1min"] = round(__import__("os").getloadavg()[0], 2)
    if before is not None:
        result["before"] = {**before, "tree": args.before}
        print(f"{'':40s} {'before':>14s} {'after':>14s}")
        for k, v in after.items():
            print(f"{k:40s} {str(before.get(k)):>14s} {str(v):>14s}")
    else:
        for k, v in result.items():
            print(f"{k:40s} {v}")
    name = "decide.json" if not args.family else f"decide-{args.family}.json"
    if not args.quick:  # smoke figures never replace the measured ones
        out = Path(__file__).parent / "results" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return result


def _in_subprocess(args: argparse.Namespace, tree: str | None) -> dict:
    """`measure` in a fresh process, importing rowgrove from `tree`/src (None: this tree)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(tree or root) / "src")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json-only", "--calls", str(args.calls),
           "--reps", str(args.reps), "--model", args.model]
    if args.family:
        cmd += ["--family", args.family]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _median_of(results: list[dict]) -> dict:
    out = {}
    for k, v in results[0].items():
        vals = [r[k] for r in results]
        out[k] = round(statistics.median(vals), 3) if all(isinstance(x, int | float) and not isinstance(x, bool)
                                                           for x in vals) else v
    return out


if __name__ == "__main__":
    main()
