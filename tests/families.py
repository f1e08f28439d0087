"""Test data: the model families people train, as tiny offline Hugging Face folders.

One `Family` per real chat template (read through tests/realfiles.py, which skips a test whose
template is absent; see the templates folder's SOURCES.md): its special and added tokens, its eos list as
the real generation_config.json has it, its bos, and `native()`, the text the model SAMPLES after
the generation prompt in that family's own format, stop token included. `family_model_dir(name)`
builds the tiny model of a family (rowgrove.model.family) under the cache root, once.

Real vocabularies: a family with `tokenizer` set has a real tokenizer (scripts/fetch_tokenizers.py,
read through tests/realfiles.py). `family_model_dir(name, vocab="real")` builds its tiny random
model on that vocabulary (skipping the test when the tokenizer is absent);
`suite_model_dir(name)` is what the conformance matrix, the framework tests, the parser round
trips and the real-vLLM comparisons run a family on: its real vocabulary where it has one and the
tokenizer is there, the tiny one otherwise (`suite_vocab(name)` says which).

Import from a test module in a subfolder of tests/ (this folder is not on sys.path there):

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from families import FAMILIES, family_model_dir

Conventions of `native(content=None, tool_calls=(), reasoning=None)`:
- `tool_calls`: (name, arguments) pairs, or mappings {"name", "arguments"[, "id"]}, or OpenAI
  tool calls {"id", "type", "function": {"name", "arguments"}}; arguments a dict (a JSON string
  is parsed). An id is only written by Mistral (9 alphanumerics; default `tool_call_id(i)`).
- `reasoning=None` is the sample after the NON-thinking generation prompt, a string the sample
  after the thinking one: render the prompt with `family.prompt_kwargs(thinking=reasoning is not
  None)`. gpt-oss always reasons; there `reasoning=None` just means no analysis message.
- What a family cannot sample raises ValueError: reasoning where `thinking` is False, more than
  one call where `parallel_tool_calls` is False, content next to calls where
  `content_with_tool_calls` is False, reasoning next to calls where `reasoning_with_tool_calls`
  is False.
- JSON is written as the templates' `tojson` writes it: json.dumps(x, ensure_ascii=False).

Where a template's history form differs from what the model samples, `native()` is the sampled
form (model card / vLLM parser): gpt-oss puts the recipient in the channel
(`<|channel|>commentary to=functions.f <|constrain|>json`) and ends a final answer with
`<|return|>`; DeepSeek V3.1 in thinking mode samples `R</think>C`, whose `R` the history drops;
GLM's stop token is the next turn's `<|user|>` / `<|observation|>`, which the history writes only
with that turn; Qwen's history adds a newline after `<|im_end|>`. `tests/model/test_family.py`
pins each of these differences against the real templates.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from realfiles import has_tokenizer, require_templates, template_text, tokenizer_folder

from rowgrove.model.family import build_family_model, family_config_hash
from rowgrove.model.tiny import cache_root


def tool_call_id(i: int) -> str:
    """The default id of the i-th tool call: 9 alphanumerics, as Mistral's template demands."""
    return f"call{i:05d}"


def _dumps(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


def _calls(tool_calls: Sequence[Any]) -> list[tuple[str, dict[str, Any], str]]:
    """Normalise tool calls to (name, arguments dict, id)."""
    out = []
    for i, tc in enumerate(tool_calls):
        if isinstance(tc, Mapping):
            fn = tc.get("function", tc)
            name, args, cid = fn["name"], fn.get("arguments", {}), tc.get("id") or tool_call_id(i)
        else:
            name, args = tc
            cid = tool_call_id(i)
        if isinstance(args, str):
            args = json.loads(args)
        if not isinstance(args, Mapping):
            raise ValueError(f"tool call {name!r}: arguments must be a JSON object, got {args!r}")
        out.append((name, dict(args), cid))
    return out


@dataclass(frozen=True)
class Family:
    """One model family: tokens, eos list, template file and native sampled format."""

    name: str
    template_file: str
    special_tokens: tuple[str, ...]
    extra_tokens: tuple[str, ...]
    eos_tokens: tuple[str, ...]          # generation_config.json eos_token_id, in its order
    eos_token: str                       # tokenizer_config.json eos_token
    bos: str | None                      # tokenizer_config.json bos_token
    pad: str | None = None
    add_bos: bool = False                # the real tokenizer prepends bos on add_special_tokens=True
    thinking: bool = False               # can sample reasoning
    parallel_tool_calls: bool = True     # more than one call in one sample
    content_with_tool_calls: bool = True
    reasoning_with_tool_calls: bool = True
    reasoning_field: str | None = None   # assistant-message key the template reads reasoning from
                                         # (None: DeepSeek reads "R</think>C" from content)
    thinking_kwargs: tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]] = ((), ())
    tokenizer: str | None = None         # its real tokenizer's folder (tests/realfiles.py), if it has one
    token_renames: tuple[tuple[int, str], ...] = ()  # ids of that tokenizer the family names otherwise
    _native: Callable[..., str] = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def chat_template(self) -> str:
        """The family's real chat template; skips the calling test when it is absent."""
        return template_text(self.template_file)

    def prompt_kwargs(self, thinking: bool) -> dict[str, Any]:
        """apply_chat_template kwargs for the (non-)thinking generation prompt `native` follows."""
        return dict(self.thinking_kwargs[1 if thinking else 0])

    def build_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of rowgrove.model.family.build_family_model for this family."""
        return {"chat_template": self.chat_template(), "special_tokens": self.special_tokens,
                "extra_tokens": self.extra_tokens, "eos_tokens": self.eos_tokens, "eos_token": self.eos_token,
                "bos_token": self.bos, "pad_token": self.pad, "add_bos": self.add_bos}

    def real_build_kwargs(self) -> dict[str, Any]:
        """build_kwargs() on the family's real vocabulary; skips the calling test when the real
        tokenizer is absent (ValueError for a family that has none)."""
        if self.tokenizer is None:
            raise ValueError(f"{self.name} has no real tokenizer in tests/realfiles.py")
        return {**self.build_kwargs(), "tokenizer_dir": tokenizer_folder(self.tokenizer),
                "token_renames": dict(self.token_renames)}

    def native(self, content: str | None = None, tool_calls: Sequence[Any] = (), reasoning: str | None = None) -> str:
        """What the model samples after the generation prompt, stop token included."""
        calls = _calls(tool_calls)
        if reasoning is not None and not self.thinking:
            raise ValueError(f"{self.name} does not sample reasoning")
        if len(calls) > 1 and not self.parallel_tool_calls:
            raise ValueError(f"{self.name} samples at most one tool call per turn")
        if calls and content and not self.content_with_tool_calls:
            raise ValueError(f"{self.name} samples no content next to a tool call")
        if calls and reasoning is not None and not self.reasoning_with_tool_calls:
            raise ValueError(f"{self.name} calls tools only without reasoning (non-thinking mode)")
        return self._native(content or "", calls, reasoning)


# ---- native formats ------------------------------------------------------------------------

def _hermes_calls(content: str, calls) -> str:
    out = content
    for i, (name, args, _) in enumerate(calls):
        if content or i:
            out += "\n"
        out += '<tool_call>\n{"name": "' + name + '", "arguments": ' + _dumps(args) + "}\n</tool_call>"
    return out


def _qwen25(content, calls, reasoning):
    return _hermes_calls(content, calls) + "<|im_end|>"


def _qwen3(content, calls, reasoning):
    head = "" if reasoning is None else "<think>\n" + reasoning + "\n</think>\n\n"
    return head + _hermes_calls(content, calls) + "<|im_end|>"


def _llama31(content, calls, reasoning):
    if calls:
        name, args, _ = calls[0]
        return '{"name": "' + name + '", "parameters": ' + _dumps(args) + "}<|eot_id|>"
    return content + "<|eot_id|>"


def _mistral(content, calls, reasoning):
    if calls:
        items = [_dumps({"name": name, "arguments": args})[:-1] + ', "id": "' + cid + '"}' for name, args, cid in calls]
        return "[TOOL_CALLS][" + ", ".join(items) + "]</s>"
    return content + "</s>"


def _deepseek(content, calls, reasoning):
    head = "" if reasoning is None else reasoning + "</think>"
    if calls:
        body = "".join("<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>" + _dumps(args) + "<｜tool▁call▁end｜>"
                       for name, args, _ in calls)
        return head + content + "<｜tool▁calls▁begin｜>" + body + "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    return head + content + "<｜end▁of▁sentence｜>"


def _gpt_oss(content, calls, reasoning):
    out = "" if reasoning is None else "<|channel|>analysis<|message|>" + reasoning + "<|end|><|start|>assistant"
    if calls:
        name, args, _ = calls[0]
        return (out + "<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>"
                + _dumps(args) + "<|call|>")
    return out + "<|channel|>final<|message|>" + content + "<|return|>"


def _glm(content, calls, reasoning):
    out = "" if reasoning is None else "\n<think>" + reasoning + "</think>"
    if content:
        out += "\n" + content
    for name, args, _ in calls:
        out += "\n<tool_call>" + name + "\n"
        for k, v in args.items():
            value = v if isinstance(v, str) else _dumps(v)
            out += "<arg_key>" + k + "</arg_key>\n<arg_value>" + value + "</arg_value>\n"
        out += "</tool_call>"
    return out + ("<|observation|>" if calls else "<|user|>")


# ---- the catalog -------------------------------------------------------------------------

_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
_QWEN25_EXTRA = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                 "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family(
        name="qwen2.5", template_file="Qwen-Qwen2.5-7B-Instruct.jinja",
        special_tokens=_QWEN_SPECIAL, extra_tokens=_QWEN25_EXTRA,
        eos_tokens=("<|im_end|>", "<|endoftext|>"), eos_token="<|im_end|>", bos=None, pad="<|endoftext|>",
        _native=_qwen25,
    ),
    Family(
        name="qwen3", template_file="Qwen-Qwen3-0.6B.jinja",
        special_tokens=_QWEN_SPECIAL,
        extra_tokens=_QWEN25_EXTRA + ("<tool_response>", "</tool_response>", "<think>", "</think>"),
        eos_tokens=("<|im_end|>", "<|endoftext|>"), eos_token="<|im_end|>", bos=None, pad="<|endoftext|>",
        thinking=True, reasoning_field="reasoning_content",
        thinking_kwargs=((("enable_thinking", False),), (("enable_thinking", True),)),
        tokenizer="qwen3",
        _native=_qwen3,
    ),
    Family(
        name="llama3.1", template_file="meta-llama-Llama-3.1-8B-Instruct.jinja",
        special_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
                        "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"),
        extra_tokens=(),
        eos_tokens=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"), eos_token="<|eot_id|>",
        bos="<|begin_of_text|>", pad=None, add_bos=True,
        parallel_tool_calls=False, content_with_tool_calls=False,
        # the packaged tokenizer is Llama 3's: the same vocabulary, but 3.1 names three of its
        # reserved special tokens (Llama 3.1's tokenizer.json: ids 128004, 128008, 128010)
        tokenizer="llama3.1",
        token_renames=((128004, "<|finetune_right_pad_id|>"), (128008, "<|eom_id|>"), (128010, "<|python_tag|>")),
        _native=_llama31,
    ),
    Family(
        name="mistral-nemo", template_file="mistralai-Mistral-Nemo-Instruct-2407.jinja",
        special_tokens=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                        "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "<pad>", "[PREFIX]", "[MIDDLE]",
                        "[SUFFIX]"),
        extra_tokens=(),
        eos_tokens=("</s>",), eos_token="</s>", bos="<s>", pad=None, add_bos=True,
        content_with_tool_calls=False,
        _native=_mistral,
    ),
    Family(
        name="deepseek-v3.1", template_file="deepseek-ai-DeepSeek-V3.1.jinja",
        # DeepSeek marks only bos/eos/pad special; its chat and tool markers are non-special
        # added tokens (so skip_special_tokens keeps them).
        special_tokens=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"),
        extra_tokens=("<think>", "</think>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>",
                      "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                      "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                      "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"),
        eos_tokens=("<｜end▁of▁sentence｜>",), eos_token="<｜end▁of▁sentence｜>",
        bos="<｜begin▁of▁sentence｜>", pad="<｜end▁of▁sentence｜>", add_bos=True,
        thinking=True, reasoning_with_tool_calls=False, reasoning_field=None,
        thinking_kwargs=((("thinking", False),), (("thinking", True),)),
        # the packaged tokenizer is DeepSeek V3's: V3.1 (as R1 before it) names two of its
        # placeholders <think> and </think> (non-special)
        tokenizer="deepseek-v3.1",
        token_renames=((128798, "<think>"), (128799, "</think>")),
        _native=_deepseek,
    ),
    Family(
        name="gpt-oss", template_file="openai-gpt-oss-120b.jinja",
        special_tokens=("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                        "<|start|>", "<|end|>", "<|message|>", "<|call|>"),
        extra_tokens=(),
        eos_tokens=("<|return|>", "<|endoftext|>", "<|call|>"), eos_token="<|return|>",
        bos="<|startoftext|>", pad="<|endoftext|>",
        thinking=True, parallel_tool_calls=False, content_with_tool_calls=False, reasoning_field="thinking",
        tokenizer="gpt-oss",
        _native=_gpt_oss,
    ),
    Family(
        name="glm-4.6", template_file="GLM-4.6.jinja",
        special_tokens=("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                        "<|assistant|>", "<|observation|>"),
        extra_tokens=("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                      "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
        eos_tokens=("<|endoftext|>", "<|user|>", "<|observation|>"), eos_token="<|endoftext|>",
        bos=None, pad="<|endoftext|>",
        thinking=True, reasoning_field="reasoning_content",
        thinking_kwargs=((("enable_thinking", False),), (("enable_thinking", True),)),
        _native=_glm,
    ),
)}


def require_families(names: Sequence[str] | None = None, *, module: bool = False) -> None:
    """Skip the calling test (or the module, `module=True`) unless the real templates of the
    families `names` (default: all) are present."""
    chosen = FAMILIES.values() if names is None else [family(n) for n in names]
    require_templates([f.template_file for f in chosen], module=module)


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown family {name!r}: one of {', '.join(FAMILIES)}") from None


@functools.lru_cache(maxsize=None)
def _model_dir(name: str, root: str, shape: tuple[tuple[str, Any], ...], real: bool) -> Path:
    fam = family(name)
    kw = {**(fam.real_build_kwargs() if real else fam.build_kwargs()), **dict(shape)}
    chash = family_config_hash(**kw)
    return build_family_model(Path(root) / f"family-{name}{'-real' if real else ''}-{chash}", **kw)


def family_model_dir(name: str, *, vocab: str = "tiny", **shape: Any) -> Path:
    """The tiny model folder of family `name` under the cache root ($ROWGROVE_CACHE, default
    ~/.cache/rowgrove), built on first use and reused afterwards (once per process and root).
    `vocab`: "tiny" (the tiny BPE with the family's tokens), "real" (the family's real tokenizer;
    skips the calling test when it is absent), "suite" (`suite_vocab(name)`).
    `shape`: model-shape arguments of build_family_model (`hidden`, `heads`, `layers`,
    `tie_embeddings`); `**rowgrove.model.tiny.servable_kwargs()` gives a folder vLLM's CPU engine
    can serve (head_dim 32)."""
    if vocab == "suite":
        vocab = suite_vocab(name)
    if vocab not in ("tiny", "real"):
        raise ValueError(f"vocab must be 'tiny', 'real' or 'suite', got {vocab!r}")
    if vocab == "real":
        tokenizer_folder(family(name).tokenizer or "")  # skip now when absent (before the cache lookup)
    return _model_dir(name, str(cache_root()), tuple(sorted(shape.items())), vocab == "real")


def suite_vocab(name: str) -> str:
    """"real" when family `name` has a real tokenizer and it is in the folder, else "tiny"."""
    tok = family(name).tokenizer
    return "real" if tok is not None and has_tokenizer(tok) else "tiny"


def suite_model_dir(name: str, **shape: Any) -> Path:
    """The folder the suites run family `name` on: `family_model_dir(name, vocab="suite")`."""
    return family_model_dir(name, vocab="suite", **shape)
