"""The stand-in package has no import circle: `common` imports no other stand-in module; each
server (`vllm`, `sglang`) is its module plus its parts (`_request`: parsing a request and the
error bodies; `_output` and the route parts above it), where the request part imports only
`common`, the other parts `common` and the request part, and the server module `common` and its
own parts; `launch` (which picks a server by kind) sits above them. Read from the source, so a
lazy import inside a function counts too."""

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
    for server, parts in (("vllm", ("request", "output", "dev")), ("sglang", ("request", "output", "control"))):
        assert _imports(f"{server}_request") == {"common"}
        for part in parts[1:]:
            assert _imports(f"{server}_{part}") == {"common", f"{server}_request"}
        assert _imports(server) == {"common"} | {f"{server}_{part}" for part in parts}
    assert _imports("launch") == {"common", "vllm", "sglang"}
