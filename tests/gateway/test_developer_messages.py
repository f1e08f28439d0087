"""`developer` messages (Codex sends its instructions as two developer input items and no
`instructions`) reach every family's real template: a template that does not render the role
itself gets them as system messages (`preprocess.renders_developer`), so none is dropped or
refused. The leading run of system/developer messages is one turn (`leading.merge_leading_system`, as the
Responses edge applies it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from families import FAMILIES, family_model_dir, require_families  # noqa: E402

from rowgrove.gateway.core.render import Renderer  # noqa: E402
from rowgrove.gateway.dialects.leading import merge_leading_system  # noqa: E402

CODEX = [
    {"role": "developer", "content": [{"type": "input_text", "text": "DEV-ONE sandbox and approvals"}]},
    {"role": "developer", "content": [{"type": "input_text", "text": "DEV-TWO collaboration mode"}]},
    {"role": "user", "content": [{"type": "input_text", "text": "USER-TASK fix the test"}]},
]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_codex_requests_developer_messages_are_in_every_familys_prompt(name):
    require_families([name])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(family_model_dir(name))
    text = Renderer(tok).render_text(merge_leading_system(CODEX))
    for needle in ("DEV-ONE sandbox and approvals", "DEV-TWO collaboration mode", "USER-TASK fix the test"):
        assert needle in text, f"{name}: {needle!r} missing from the prompt:\n{text}"
