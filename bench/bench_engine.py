"""Throughput of the hf engine on the tiny model, against transformers' own `model.generate`
(batch 1, sampling) measured in the same run.

    .venv/bin/python bench/bench_engine.py [--model tiny] [--tokens 64] [--threads 2]

Prints tokens/s and the ratio to the baseline for 1, 8 and 32 concurrent requests; writes
bench/results/engine.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="fewer tokens (smoke check)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens = min(args.tokens, 16)
    torch.set_num_threads(args.threads)

    from rowgrove.engines import SamplingParams, make_engine
    from rowgrove.model.load import load_model

    model, tok = load_model(args.model)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"question {i} " * 4}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False) for i in range(32)]

    # baseline: transformers generate, one request at a time, min_new_tokens forces full length
    def baseline(n: int) -> float:
        t0, total = time.perf_counter(), 0
        for p in prompts[:n]:
            out = model.generate(torch.tensor([p]), do_sample=True, max_new_tokens=args.tokens,
                                 min_new_tokens=args.tokens, pad_token_id=tok.pad_token_id)
            total += out.shape[1] - len(p)
        return total / (time.perf_counter() - t0)

    baseline(2)  # warm-up
    base_tps = baseline(8)
    eng = make_engine("hf", args.model, max_batch=32)
    # no stop ids besides end-of-turn; random weights rarely sample it, so rows run ~full length
    sp = [SamplingParams(max_tokens=args.tokens, seed=i) for i in range(32)]

    async def run(n: int) -> float:
        t0 = time.perf_counter()
        gens = await asyncio.gather(*(eng.generate(prompts[i], sp[i]) for i in range(n)))
        return sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0)

    async def all_runs() -> dict[int, float]:
        await run(4)  # warm-up
        res = {n: await run(n) for n in (1, 8, 32)}
        await eng.aclose()
        return res

    res = asyncio.run(all_runs())
    print(f"baseline transformers generate, batch 1: {base_tps:8.0f} tok/s")
    for n, tps in res.items():
        print(f"hf engine, {n:2d} concurrent requests:  {tps:8.0f} tok/s   x{tps / base_tps:.2f} vs baseline")
    out = Path(__file__).parent / "results" / "engine.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "tokens": args.tokens, "threads": args.threads,
              "baseline_generate_b1_tok_s": base_tps,
              "engine_tok_s": {str(n): v for n, v in res.items()},
              "ratio_vs_baseline": {str(n): v / base_tps for n, v in res.items()}}
    if not args.quick:  # smoke figures never replace the measured ones
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
