"""The `rowgrove` command: a thin shell over the Python API.

Each subcommand lives in `rowgrove.commands.<name>` with `add_arguments(parser)` and
`run(args) -> int`. Only the chosen command's module is imported, so `rowgrove --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

COMMANDS: dict[str, str] = {
    "serve": "run the capture gateway (OpenAI-compatible) in front of an engine",
    "rows": "turn every finished rollout of a ledger into training rows (Parquet or JSONL)",
    "ls": "list a ledger's rollouts: id, group, status, reward, calls, roots, rows, mask reason",
    "show": "draw a rollout's call lineage: trees, continuations, rejected and accepted leaves, rows",
    "run": "drive a CLI coding agent (codex, claude, qwen, opencode, mini, any) through a gateway, N rollouts",
    "train": "run the reference GRPO trainer",
    "demo": "the main job on embedded defaults: build the tiny model, train, report",
    "bench": "run the benchmarks in bench/ and write their figures",
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help shows its default, unless the help already speaks of it (which also
    keeps defaults read from the environment, such as keys, out of `--help`) or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_ = action.help or ""
        if "default" in help_.lower() or action.default in (None, False, [], argparse.SUPPRESS):
            return help_
        return super()._get_help_string(action) or help_


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (the problem and where help is), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def version() -> str:
    """The installed distribution's version, else the package's `__version__`."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("rowgrove")
    except PackageNotFoundError:
        from rowgrove import __version__

        return __version__


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; with `command`, only that subcommand's arguments are loaded."""
    parser = Parser(
        prog="rowgrove",
        description="Exact, fairly weighted training rows for agentic RL.",
    )
    parser.add_argument("--version", action="version", version=f"rowgrove {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_ in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=HelpFormatter)
        if name == command:
            importlib.import_module(f"rowgrove.commands.{name}").add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(f"rowgrove.commands.{args.command}")
    from rowgrove.errors import RowgroveError

    try:
        return int(module.run(args) or 0)
    except RowgroveError as e:
        print(f"rowgrove {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
