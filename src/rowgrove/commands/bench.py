"""`rowgrove bench`: run the benchmarks in bench/ (each `bench/bench_<name>.py` exposes
`main(argv) -> dict` and writes bench/results/<name>.json) and print their ratios.

    rowgrove bench                 # all of them
    rowgrove bench --quick         # smaller sizes, for a smoke check
    rowgrove bench --only train    # one of them
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path


def bench_dir() -> Path:
    """bench/ in the current directory, else the one of the source checkout."""
    here = Path.cwd() / "bench"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[3] / "bench"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke check, not a measurement")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only bench_NAME.py (repeatable), e.g. --only train")
    p.add_argument("--dir", type=Path, default=None, help="benchmark directory (default: ./bench)")


def _ratios(result: object, prefix: str = "") -> list[str]:
    """Every `*ratio*` / `*speedup*` number in a (nested) result, as `key: value` lines."""
    out = []
    if isinstance(result, dict):
        for k, v in result.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict):
                out += _ratios(v, name + ".")
            elif isinstance(v, (int, float)) and ("ratio" in k or "speedup" in k):
                out.append(f"{name}: {v:.3g}")
    return out


def run(args: argparse.Namespace) -> int:
    from rowgrove.errors import InputError

    root = args.dir or bench_dir()
    files = sorted(root.glob("bench_*.py"))
    known = [f.stem.removeprefix("bench_") for f in files]
    if args.only:
        unknown = [n for n in args.only if n not in known]
        if unknown:
            raise InputError(f"no benchmark named {', '.join(unknown)} in {root}: known are {', '.join(known)}")
        files = [f for f in files if f.stem.removeprefix("bench_") in args.only]
    if not files:
        raise InputError(f"no bench_*.py in {root}: run from the repository root or pass --dir")
    failed = 0
    for f in files:
        name = f.stem.removeprefix("bench_")
        print(f"== {name} ({f})", flush=True)
        spec = importlib.util.spec_from_file_location(f"rowgrove_bench_{name}", f)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]
        t0 = time.time()
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            result = module.main(["--quick"] if args.quick else [])
        except Exception as e:  # noqa: BLE001 - one failing benchmark must not hide the others
            print(f"   FAILED: {type(e).__name__}: {e}")
            failed += 1
            continue
        for line in _ratios(result) or [json.dumps(result, default=str)[:300]]:
            print(f"   {line}")
        print(f"   ({time.time() - t0:.1f}s)")
    return 1 if failed else 0
