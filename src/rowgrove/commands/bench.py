"""`rowgrove bench`: run the benchmarks in bench/ (each `bench/bench_<name>.py` exposes
`main(argv) -> dict` and writes bench/results/<name>.json) and print their ratios and goals.

    rowgrove bench                 # all of them
    rowgrove bench --quick         # smaller sizes, for a smoke check: no results file is written
    rowgrove bench --only train    # one of them
    rowgrove bench seam --seeds 2 --out runs/seam   # one by name; --seeds / --out go to it
    rowgrove bench seam --long                      # its long run (--long / --jobs go to one named)

Goals: a benchmark's result may hold `"goals": {"name": {"value": x, "goal": "<= 1 ms", "met": bool}}`
(and, older style, keys ending in `_goal_met` holding a bool); each is printed `MET` or `MISSED`,
and a missed goal makes the exit code 1. With --quick (smoke sizes, not a measurement) they are
printed but do not set the exit code, and any results file a benchmark rewrites is put back.
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
    p.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run, as with --only (default: all)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke check, not a measurement")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only bench_NAME.py (repeatable), e.g. --only train")
    p.add_argument("--dir", type=Path, default=None, help="benchmark directory (default: ./bench)")
    p.add_argument("--seeds", type=int, default=None, help="seeds, for a benchmark that takes them (one named)")
    p.add_argument("--out", type=Path, default=None, help="output directory, for a benchmark that takes one (one named)")
    p.add_argument("--long", action="store_true",
                   help="the long run, for a benchmark that has one (one named), e.g. rowgrove bench seam --long")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs side by side, for a benchmark that takes it (one named)")


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


def goals(result: object, prefix: str = "") -> list[tuple[str, bool, str]]:
    """(name, met, detail) of every goal in a (nested) result: the entries of each `goals`
    mapping (`{"value": ..., "goal": ..., "met": bool}`) and every bool key ending in `_goal_met`."""
    out: list[tuple[str, bool, str]] = []
    if not isinstance(result, dict):
        return out
    for k, v in result.items():
        name = f"{prefix}{k}"
        if k == "goals" and isinstance(v, dict):
            for g, spec in v.items():
                if isinstance(spec, dict) and isinstance(spec.get("met"), bool):
                    value = spec.get("value")
                    shown = f"{value:.4g}" if isinstance(value, float) else str(value)
                    out.append((f"{prefix}{g}", spec["met"], f"{shown} (goal {spec.get('goal', '?')})"))
        elif isinstance(v, dict):
            out += goals(v, name + ".")
        elif isinstance(v, bool) and k.endswith("_goal_met"):
            out.append((name.removesuffix("_goal_met"), v, "goal met" if v else "goal not met"))
    return out


def _snapshot(results: Path) -> dict[Path, bytes]:
    return {f: f.read_bytes() for f in results.glob("*.json")} if results.is_dir() else {}


def _put_back(before: dict[Path, bytes], results: Path) -> list[str]:
    """Restore results files a --quick run changed or added; names of those it touched."""
    touched = []
    for f, data in before.items():
        if not f.exists() or f.read_bytes() != data:
            f.write_bytes(data)
            touched.append(f.name)
    for f in (results.glob("*.json") if results.is_dir() else []):
        if f not in before:
            f.unlink()
            touched.append(f.name)
    return touched


def run(args: argparse.Namespace) -> int:
    from rowgrove.errors import InputError

    root = args.dir or bench_dir()
    files = sorted(root.glob("bench_*.py"))
    known = [f.stem.removeprefix("bench_") for f in files]
    names = [*(args.only or []), *args.names]
    passed = [*(["--seeds", str(args.seeds)] if args.seeds is not None else []),
              *(["--out", str(args.out)] if args.out is not None else []),
              *(["--long"] if args.long else []),
              *(["--jobs", str(args.jobs)] if args.jobs is not None else [])]
    if passed and len(names) != 1:
        raise InputError(f"{' and '.join(a for a in passed if a.startswith('--'))} go to one benchmark: "
                         "name it, e.g. rowgrove bench seam --seeds 2")
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(f"no benchmark named {', '.join(unknown)} in {root}: known are {', '.join(known)}")
        files = [f for f in files if f.stem.removeprefix("bench_") in names]
    if not files:
        raise InputError(f"no bench_*.py in {root}: run from the repository root or pass --dir")
    failed = missed = 0
    for f in files:
        name = f.stem.removeprefix("bench_")
        print(f"== {name} ({f})", flush=True)
        spec = importlib.util.spec_from_file_location(f"rowgrove_bench_{name}", f)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]
        t0 = time.time()
        before = _snapshot(root / "results") if args.quick else {}
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            result = module.main((["--quick"] if args.quick else []) + passed)
        except Exception as e:  # noqa: BLE001 - one failing benchmark must not hide the others
            print(f"   FAILED: {type(e).__name__}: {e}")
            failed += 1
            continue
        finally:
            if args.quick and (touched := _put_back(before, root / "results")):
                print(f"   (--quick: put back {', '.join(touched)}, which bench_{name}.py rewrote)")
        for line in _ratios(result) or [json.dumps(result, default=str)[:300]]:
            print(f"   {line}")
        for goal, met, detail in goals(result):
            print(f"   {'MET' if met else 'MISSED'} {goal}: {detail}" + (" [--quick: not a measurement]"
                                                                       if args.quick else ""))
            missed += not met and not args.quick
        print(f"   ({time.time() - t0:.1f}s)")
    if missed:
        print(f"rowgrove bench: {missed} goal{'s' if missed != 1 else ''} MISSED (see the lines above)",
              file=sys.stderr)
    return 1 if failed or missed else 0
