"""The stand-in package has no import circle: `common` imports no other stand-in module, each
server module (`vllm`, `sglang`) imports only `common`, and `launch` (which picks a server by
kind) sits above them. Read from the source, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import rowgrove.standins

PKG = Path(rowgrove.standins.__file__).parent


def _imports(module: str) -> set[str]:
    tree = ast.parse((PKG / f"{module}.py").read_text())
    return {n.module.rsplit(".", 1)[-1] for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("rowgrove.standins.")}


def test_the_stand_in_modules_import_downwards_only():
    assert _imports("common") == set()
    assert _imports("vllm") == {"common"}
    assert _imports("sglang") == {"common"}
    assert _imports("launch") == {"common", "vllm", "sglang"}
