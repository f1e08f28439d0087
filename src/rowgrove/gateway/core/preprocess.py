"""Messages as an inference server hands them to a Hugging Face chat template.

The prompt a row trains on must be the prompt the model's own chat endpoint would build, so the
gateway prepares each OpenAI message the way vLLM's `vllm/entrypoints/chat_utils.py` does
before `apply_chat_template` (SGLang's `conversation`/`jinja_template_utils` does the same):

- only the fields a template may read are kept: role, content, tool_calls (assistant),
  tool_call_id (tool), name, and reasoning; SDK noise (`refusal`, `annotations`, `audio`,
  `function_call`, any `null`) is dropped;
- content `null` becomes `""` (a tool-call turn as the gateway returns it);
- content given as a list of parts is flattened to one string (text parts joined by "\\n") for
  templates that take a string; templates that iterate over `message.content` and read each
  part's `type` ("openai" content format, detected from the template's syntax tree) get the list
  of text parts; a plain string stays a string, as SGLang passes it;
- tool-call `arguments` (a JSON string on the wire) are parsed to an object: templates such as
  Qwen3-Coder and GLM-4.6 iterate `arguments | items`, and every template writes an object the way
  the model sampled it rather than as an escaped string;
- `reasoning_content` / `reasoning` set both names on an assistant message, and (as transformers'
  `apply_chat_template` does) `thinking` too, for harmony templates.

Pure: no I/O. `BadRequest` names the message and field when a message cannot be prepared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.nodes as jn
import orjson

from rowgrove.errors import BadRequest
from rowgrove.gateway.core.messages import NO_IMAGES, RequestImages

STRING = "string"
OPENAI = "openai"
_TEXT_PARTS = ("text", "input_text", "output_text", "refusal")
_MEDIA_TEXT_PARTS = ("text", "input_text", "output_text")
_IMAGE_PARTS = ("image_url", "input_image")


def detect_content_format(chat_template: str) -> str:
    """"openai" when the template reads a message's content parts by their type, else "string".

    vLLM's `_detect_content_format` says "openai" for any `for` over `m.content` / `m['content']`
    (or over a variable assigned from one); a template that loops over content but never asks a
    part's `type` (GLM-4.6's tool branch prints each item) then prints a text part as a Python
    dict repr (vllm#39614). Here a list of text parts reaches the template as the string it
    stands for unless such a loop also reads `part.type` / `part['type']`: only then does the
    template know what a part is."""
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(chat_template)
    except jinja2.TemplateError:
        return STRING
    names: set[str] = set()
    for node in ast.find_all(jn.Assign):
        if isinstance(node.target, jn.Name) and _is_content_access(node.node):
            names.add(node.target.name)
    for loop in ast.find_all(jn.For):
        it = loop.iter
        if isinstance(it, jn.Filter) and it.node is not None:
            it = it.node
        if (_is_content_access(it) or (isinstance(it, jn.Name) and it.name in names)) and _reads_type(loop):
            return OPENAI
    return STRING


def _reads_type(loop: jn.For) -> bool:
    """Whether the loop's body reads its item's `type`."""
    if not isinstance(loop.target, jn.Name):
        return False
    item = loop.target.name
    for node in loop.find_all(jn.Getattr | jn.Getitem):
        if isinstance(node.node, jn.Name) and node.node.name == item:
            if isinstance(node, jn.Getattr) and node.attr == "type":
                return True
            if isinstance(node, jn.Getitem) and isinstance(node.arg, jn.Const) and node.arg.value == "type":
                return True
    return False


def _is_content_access(node: jn.Node) -> bool:
    if isinstance(node, jn.Getattr):
        return node.attr == "content"
    if isinstance(node, jn.Getitem):
        return isinstance(node.arg, jn.Const) and node.arg.value == "content"
    return False


def engine_message(msg: Mapping[str, Any], index: int, content_format: str = STRING, *,
                   media: bool = False, images: RequestImages = NO_IMAGES) -> dict[str, Any]:
    """One OpenAI message as the engine's chat endpoint passes it to the template (see the module
    docstring). The input must already be a valid message (`decide.validate_messages`). With
    `media` (a vision model) image parts are kept, as `{"type": "image", "image": <pixel digest>}`
    in a list of parts (what vLLM hands a multimodal template), with text parts as they are; the
    digests are those the edge resolved (`images`, the request's `RequestImages`)."""
    role = msg.get("role")
    out: dict[str, Any] = {"role": role}
    content = msg.get("content")
    if media and isinstance(content, list) and any(_is_image_part(p) for p in content):
        out["content"] = media_content(content, index, images.by_message.get(index, {}))
    else:
        out["content"] = _content(content, index, content_format)
    if role == "assistant":
        calls = msg.get("tool_calls")
        if calls:
            out["tool_calls"] = [_tool_call(tc, index, k) for k, tc in enumerate(calls)]
        reasoning = msg.get("reasoning")
        if reasoning is None:
            reasoning = msg.get("reasoning_content")
        if reasoning is not None:
            # key order as transformers' _alias_reasoning_fields builds it
            out = {"thinking": reasoning, **out, "reasoning": reasoning, "reasoning_content": reasoning}
    elif role == "tool" and msg.get("tool_call_id") is not None:
        out["tool_call_id"] = msg["tool_call_id"]
    name = msg.get("name")
    if isinstance(name, str):
        out["name"] = name
    return out


def engine_messages(messages: Sequence[Mapping[str, Any]], content_format: str = STRING) -> list[dict[str, Any]]:
    """`engine_message` for each message."""
    return [engine_message(m, i, content_format) for i, m in enumerate(messages)]


def _is_image_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") in _IMAGE_PARTS


def media_content(content: Sequence[Any], index: int, digests: Mapping[int, str | None]) -> list[dict[str, Any]]:
    """A content list with images as a vision template takes it: text parts `{"type": "text",
    "text": ...}`, image parts `{"type": "image", "image": <pixel digest>}` (the template writes a
    placeholder; the digest tells the renderer which image it stands for). `digests`: part index
    -> the pixel digest the edge resolved for the image part there."""
    out: list[dict[str, Any]] = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _MEDIA_TEXT_PARTS:
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"messages[{index}].content[{k}]: a {kind} part needs a string", param="messages")
            out.append({"type": "text", "text": text})
        elif _is_image_part(part):
            digest = digests.get(k)
            if digest is None:
                raise BadRequest(f"messages[{index}].content[{k}]: the image could not be read: send "
                                 "data:image/png;base64,...", param="messages")
            out.append({"type": "image", "image": digest})
        else:
            raise BadRequest(
                f"messages[{index}].content[{k}]: parts of type {kind!r} cannot be rendered by this model's "
                "chat template (text and image parts only)", param="messages")
    return out


def prepared_images(prepared: Sequence[Mapping[str, Any]], images: RequestImages) -> list[Any]:
    """The images of prepared messages (`media_content`), in order, as the edge resolved them."""
    out: list[Any] = []
    by_digest = images.by_digest
    for m in prepared:
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "image":
                    img = by_digest.get(part["image"])
                    if img is None:
                        raise BadRequest("an image of this request was evicted from the decoded-image cache "
                                         "while it was rendered: send fewer images per request", param="messages")
                    out.append(img)
    return out


def _content(content: Any, index: int, content_format: str) -> Any:
    # A string stays a string in both formats: templates that loop over parts test `is string`
    # first, and wrapping it (vLLM's "openai" format) makes GLM-4.6 print a tool result as a
    # Python repr (vLLM issue #39614; SGLang passes the string, sglang #22595).
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS:
            text = part.get("refusal") if kind == "refusal" else part.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"messages[{index}].content[{k}]: a {kind} part needs a string", param="messages")
            texts.append(text)
        else:
            raise BadRequest(
                f"messages[{index}].content[{k}]: parts of type {kind!r} cannot be rendered by this "
                "model's chat template (text parts only): send text, or serve a model that takes this input",
                param="messages")
    if content_format == OPENAI:
        return [{"type": "text", "text": t} for t in texts]
    return "\n".join(texts)


def _tool_call(tc: Mapping[str, Any], index: int, k: int) -> dict[str, Any]:
    fn = tc.get("function") or {}
    args: Any = fn.get("arguments")
    if not args:
        args = {}
    elif isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError as e:
            raise BadRequest(
                f"messages[{index}].tool_calls[{k}].function.arguments is not valid JSON ({e}): send the "
                "arguments exactly as the model's tool call returned them", param="messages") from None
    out: dict[str, Any] = {k2: v for k2, v in tc.items() if v is not None and k2 != "function"}
    out.setdefault("type", "function")
    out["function"] = {**{k2: v for k2, v in fn.items() if v is not None}, "arguments": args}
    return out
