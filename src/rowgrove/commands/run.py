"""`rowgrove run`: drive a CLI coding agent through a gateway, N rollouts of one group.

    rowgrove run --gateway http://127.0.0.1:8000 --group g1 --n 4 --reward-cmd 'pytest -q' \\
        -- codex exec 'fix the failing test'

Each rollout gets its own copy of --workdir, its own config home, and the harness pointed at its
base URL (codex, claude, qwen, opencode, mini by their own settings; any other program through
`{base_url}` and `{api_key}` in its arguments). The reward is --reward-cmd's exit status in that
copy (0 -> 1.0, else 0.0) or the number its last line prints; a harness that crashes or runs past
--timeout finishes its rollout invalid with the reason. One line per rollout when it finishes.
"""

from __future__ import annotations

import argparse
import sys
import threading


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gateway", required=True, help="the gateway's URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--group", required=True, help="the group id of the rollouts (one prompt's GRPO group)")
    p.add_argument("--n", type=int, default=1, help="rollouts to run concurrently")
    p.add_argument("--workdir", help="folder copied for each rollout (the harness runs in the copy); "
                                     "default an empty folder")
    p.add_argument("--reward-cmd", help="shell command run in the rollout's copy after the harness: exit 0 -> "
                                        "reward 1.0, else 0.0, or the number its last line prints")
    p.add_argument("--timeout", type=float, help="seconds a harness (and the reward command) may run")
    p.add_argument("--key", help="the gateway's control key, when it has one (default $ROWGROVE_CONTROL_KEY)")
    p.add_argument("harness", nargs=argparse.REMAINDER, help="-- HARNESS ARGS...: the harness command line")


def run(args: argparse.Namespace) -> int:
    import os

    from rowgrove.harnesses.run import RolloutResult, RunError, run_group

    argv = list(args.harness)
    if argv and argv[0] == "--":
        argv = argv[1:]
    done = [0]
    lock = threading.Lock()
    tty = sys.stderr.isatty()

    def on_done(res: RolloutResult) -> None:
        with lock:
            done[0] += 1
            if tty:
                print(f"\r\033[K[{done[0]}/{args.n}] done", end="", file=sys.stderr, flush=True)
                print("\r\033[K", end="", file=sys.stderr)
            print(res.line(), flush=True)

    if tty:
        print(f"[0/{args.n}] running {' '.join(argv[:1])} ...", end="", file=sys.stderr, flush=True)
    try:
        results = run_group(args.gateway, args.group, argv, n=args.n, workdir=args.workdir,
                            reward_cmd=args.reward_cmd, timeout=args.timeout,
                            key=args.key or os.environ.get("ROWGROVE_CONTROL_KEY"), on_done=on_done)
    except RunError as e:
        print(f"rowgrove run: {e}", file=sys.stderr)
        return 2
    return 0 if all(r.valid for r in results) else 1
