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
    from rowgrove.gateway import decide as D
    from rowgrove.toolcalls import format_assistant_text

    index = D.RolloutIndex() if memo else _no_memo_index()
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
    from rowgrove.gateway import decide as D
    from rowgrove.hashing import chain_hashes

    class NoMemo(D.RolloutIndex):
        """The naive baseline: every message of every request validated and hashed again."""

        def chain(self, messages: Any, h0: bytes) -> list[bytes]:
            D.validate_messages(messages)
            return chain_hashes(messages, h0)

    return NoMemo()



def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--family", default=None, help="a family of tests/families.py (e.g. qwen3); overrides --model")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer calls and repeats (smoke check)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.calls = 1, min(args.calls, 40)

    from rowgrove.gateway.render import Renderer
    from rowgrove.model.load import load_tokenizer

    if args.family:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from families import family_model_dir

        args.model = str(family_model_dir(args.family))
    renderer = Renderer(load_tokenizer(args.model))
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
    from rowgrove.gateway import decide as D
    idx = D.RolloutIndex()
    final = D.decide(idx, msgs[:n_msgs], renderer, tools=TOOLS)
    result = {
        "model": args.family or args.model,
        "calls": args.calls,
        "reps": args.reps,
        "messages_in_last_request": n_msgs,
        "request_bytes_last": len(json.dumps(msgs[:n_msgs])),
        "context_tokens_last": None,
        "decide_us_call_1_root": round(first_us, 1),
        "decide_us_call_2": round(second_us, 1),
        "decide_us_calls_196_200": round(late_us, 1),
        "decide_us_calls_196_200_no_memo": round(late_nomemo_us, 1),
        "ratio_call_200_vs_call_1": round(late_us / first_us, 3),
        "ratio_call_200_vs_call_2": round(late_us / second_us, 3),
        "ratio_no_memo_call_200_vs_call_1": round(late_nomemo_us / first_us, 3),
        "root_render_us_last_request": None,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    t0 = time.perf_counter()
    full = renderer.render_root(msgs[:n_msgs], TOOLS)
    result["root_render_us_last_request"] = round((time.perf_counter() - t0) * 1e6, 1)
    result["context_tokens_last"] = len(full)
    assert final.root  # a fresh index: the same request rendered whole, for scale
    for k, v in result.items():
        print(f"{k:40s} {v}")
    name = "decide.json" if not args.family else f"decide-{args.family}.json"
    if not args.quick:  # smoke figures never replace the measured ones
        out = Path(__file__).parent / "results" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
