"""The tokenizer rowgrove loads is the model folder's tokenizer.json, under every transformers its
range allows (pyproject.toml): the ids the gateway records must be the model's own.

Before transformers 5.23, `AutoTokenizer` builds a folder whose config names `LlamaTokenizerFast`
(DeepSeek V3's does) from that class, with a Metaspace pre-tokenizer and decoder in place of the
file's byte-level ones: other ids, and decoding drops every space. `make test` runs this module in
each stack's environment (scripts/stack_tests.sh: transformers 5.10 and 5.19 there, 5.23 here).
"""

from __future__ import annotations

import json
import shutil

import pytest


@pytest.fixture
def llama_named_folder(tmp_path):
    """The tiny model's byte-level tokenizer, its config naming `LlamaTokenizerFast` as DeepSeek V3's does."""
    from rowgrove.model.tiny import tiny_model_dir

    src = tiny_model_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy(src / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["tokenizer_class"] = "LlamaTokenizerFast"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path


TEXT = "I cannot look it up; Lima is mild.\n\n  two  spaces, tabs\tand 北京"


def test_folder_tokenizer_gives_tokenizer_jsons_ids_whatever_class_the_config_names(llama_named_folder):
    from tokenizers import Tokenizer

    from rowgrove.model.turns import folder_tokenizer

    raw = Tokenizer.from_file(str(llama_named_folder / "tokenizer.json"))
    want = raw.encode(TEXT, add_special_tokens=False).ids
    tok = folder_tokenizer(llama_named_folder)
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert ids == want
    assert tok.decode(ids) == TEXT
    assert tok.chat_template  # the config's chat template and special tokens come along
    assert tok.eos_token == json.loads((llama_named_folder / "tokenizer_config.json").read_text())["eos_token"]


def test_the_folder_really_loads_another_pipeline_under_some_transformers(llama_named_folder):
    """What the test above guards against, where it happens (transformers < 5.23); a no-op check
    otherwise, so the test above is known to have exercised the fix where it ran."""
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(str(llama_named_folder))
    raw = Tokenizer.from_file(str(llama_named_folder / "tokenizer.json"))
    same = plain.encode(TEXT, add_special_tokens=False) == raw.encode(TEXT, add_special_tokens=False).ids
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    if (major, minor) < (5, 23):
        assert not same, f"transformers {transformers.__version__} kept tokenizer.json: narrow the note in model/turns.py"
    else:
        assert same
