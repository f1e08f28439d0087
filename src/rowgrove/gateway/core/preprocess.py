"""Messages as an inference server hands them to a Hugging Face chat template.

The prompt a row trains on must be the prompt the model's own chat endpoint would build, so the
gateway prepares each OpenAI message the way vLLM's `vllm/entrypoints/chat_utils.py` does
before `apply_chat_template` (SGLang's `conversation`/`jinja_template_utils` does the same):

- only the fields a template may read are kept: role, content, tool_calls (assistant),
  tool_call_id (tool), name, and reasoning; SDK noise (`refusal`, `annotations`, `audio`,
  `function_call`, any `null`) is dropped;
- content `null` becomes `""` (a tool-call turn as the gateway returns it);
- content given as a list of parts is flattened to one string (text parts joined by "\\n") for
  the roles whose content the template takes as a string; where the template iterates over a
  role's `message.content` and reads each part's `type` (decided per role from the template's
  syntax tree, `detect_part_roles`), messages of that role get the list of text parts; a plain
  string stays a string, as SGLang passes it;
- a tool call's keys are in the order vLLM's request model rebuilds them: `id`, `function`
  (`arguments`, then `name`), `type`; tool-call `arguments` (a JSON string on the wire) are
  parsed to an object: templates such as Qwen3-Coder and GLM-4.6 iterate `arguments | items`, and
  every template writes an object the way the model sampled it rather than as an escaped string;
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
from rowgrove.hashing import ROLES

STRING = "string"
OPENAI = "openai"
_TEXT_PARTS = ("text", "input_text", "output_text", "refusal")
_MEDIA_TEXT_PARTS = ("text", "input_text", "output_text")
_IMAGE_PARTS = ("image_url", "input_image")


def detect_content_format(chat_template: str) -> str:
    """"openai" when the template reads the content parts of some role's messages by their type
    (`detect_part_roles` is not empty), else "string"."""
    return OPENAI if detect_part_roles(chat_template) else STRING


def detect_part_roles(chat_template: str) -> frozenset[str]:
    """The roles (of `hashing.ROLES`) whose messages' content parts the template reads by type:
    a list of text parts reaches the template as a list for these roles and as the string it
    stands for (parts joined by "\\n") for every other role.

    A role reads parts when a `for` over a message's content (`m.content`, `m['content']`, a
    filter or slice of one, a list of its items, or a variable set to one of those) reads its
    item's `type` (`part.type` / `part['type']`), and the `if` / `elif` / `else` branches around
    that loop can be taken for a message of that role. Each branch's role is decided from the tests of that
    same message's role (`m.role == 'user'`, `m['role'] != 'tool'`, `m.role in [...]`, joined by
    `and` / `or` / `not`, a variable set from `m.role`); a test that says nothing about the role
    leaves every role possible. So Ministral 3 (parts read for system, user and assistant; the
    tool branch writes `message['content']|string`) and the first Kimi K2 template (its tool
    branch prints `message['content']`) get a tool result as its string, while their user
    messages keep image and text parts as a list.

    vLLM's `_detect_content_format` says "openai" for the whole template when any `for` walks
    content, whether or not it asks a part's `type`; GLM-4.6's tool branch loops over content
    and prints each item, so there a text part is printed as a Python dict repr (vllm#39614). vLLM (and
    SGLang) flatten a tool message's text parts before rendering; for other roles rowgrove's
    decision is per role where vLLM's is per template (docs/families.md)."""
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(chat_template)
    except jinja2.TemplateError:
        return frozenset()
    holders: dict[str, list[jn.Node]] = {}  # variable -> the message expressions its content came from
    role_names: dict[str, list[jn.Node]] = {}  # variable -> the message expressions its role came from
    for node in ast.find_all(jn.Assign):
        if not isinstance(node.target, jn.Name):
            continue
        held = _parts_of(node.node)
        if held:
            holders.setdefault(node.target.name, []).extend(held)
        if _is_role_access(node.node):
            role_names.setdefault(node.target.name, []).append(node.node.node)
    loops: list[tuple[jn.For, tuple[tuple[jn.Expr, bool], ...]]] = []
    _branches(ast, (), loops)
    roles: set[str] = set()
    for loop, path in loops:
        it = loop.iter
        owners = holders.get(it.name, []) if isinstance(it, jn.Name) else _parts_of(it)
        if not owners or not _reads_type(loop):
            continue
        for owner in owners:
            roles.update(r for r in ROLES if _possible(path, owner, r, role_names))
    return frozenset(roles)


def _parts_of(node: jn.Node) -> list[jn.Node]:
    """The messages whose content parts `node` lists: `m.content` / `m['content']` (-> [m]), a
    filter or slice of one (`m.content | sort(attribute='type')`, `m.content[1:]`), or a list of
    such parts (`[m.content[1], m.content[0]]`); [] for anything else (a macro's result, a
    variable)."""
    while isinstance(node, jn.Filter) and node.node is not None:
        node = node.node
    if isinstance(node, jn.Getitem) and isinstance(node.arg, jn.Slice):
        node = node.node
    if _is_content_access(node):
        return [node.node]
    if isinstance(node, jn.List | jn.Tuple):
        items = [x.node if isinstance(x, jn.Getitem) and _is_content_access(x.node) else None for x in node.items]
        return [x.node for x in items if x is not None] if items and None not in items else []
    return []


def _branches(node: jn.Node, path: tuple[tuple[jn.Expr, bool], ...],
              out: list[tuple[jn.For, tuple[tuple[jn.Expr, bool], ...]]]) -> None:
    """Every `for` under `node` with the `if` tests (and the outcome each must have) on the way
    to it: the body of `if t` needs t true, its `elif u` needs t false and u true, its `else`
    needs every test false."""
    if isinstance(node, jn.For):
        out.append((node, path))
    if isinstance(node, jn.If):
        before: tuple[tuple[jn.Expr, bool], ...] = ()
        for branch in (node, *node.elif_):
            for child in branch.body:
                _branches(child, path + before + ((branch.test, True),), out)
            before += ((branch.test, False),)
        for child in node.else_:
            _branches(child, path + before, out)
        return
    for child in node.iter_child_nodes():
        _branches(child, path, out)


def _possible(path: tuple[tuple[jn.Expr, bool], ...], owner: jn.Node, role: str,
              role_names: Mapping[str, list[jn.Node]]) -> bool:
    """Whether a message `owner` of role `role` can take the branches of `path` (no test on the
    way decides against it)."""
    for test, want in path:
        got = _truth(test, owner, role, role_names)
        if got is not None and got != want:
            return False
    return True


def _truth(test: jn.Node, owner: jn.Node, role: str, role_names: Mapping[str, list[jn.Node]]) -> bool | None:
    """The value of `test` for a message `owner` of role `role`, or None where it depends on
    anything else."""
    if isinstance(test, jn.Not):
        got = _truth(test.node, owner, role, role_names)
        return None if got is None else not got
    if isinstance(test, jn.And | jn.Or):
        left = _truth(test.left, owner, role, role_names)
        right = _truth(test.right, owner, role, role_names)
        decisive = isinstance(test, jn.Or)  # the value that decides `or` (True) / `and` (False)
        if left is decisive or right is decisive:
            return decisive
        return None if left is None or right is None else not decisive
    if not isinstance(test, jn.Compare) or len(test.ops) != 1:
        return None
    op = test.ops[0]
    left, right = test.expr, op.expr
    if _role_of(right, owner, role_names) and op.op in ("eq", "ne"):
        left, right = right, left
    if not _role_of(left, owner, role_names):
        return None
    if op.op in ("eq", "ne") and isinstance(right, jn.Const) and isinstance(right.value, str):
        return (role == right.value) == (op.op == "eq")
    if op.op in ("in", "notin") and isinstance(right, jn.List | jn.Tuple) \
            and all(isinstance(x, jn.Const) for x in right.items):
        return (role in [x.value for x in right.items]) == (op.op == "in")
    return None


def _role_of(node: jn.Node, owner: jn.Node, role_names: Mapping[str, list[jn.Node]]) -> bool:
    """Whether `node` is the role of message `owner`: `owner.role`, `owner['role']`, or a variable
    set only from that."""
    if _is_role_access(node):
        return node.node == owner
    if isinstance(node, jn.Name) and node.name in role_names:
        return all(o == owner for o in role_names[node.name])
    return False


def _is_role_access(node: jn.Node) -> bool:
    if isinstance(node, jn.Getattr):
        return node.attr == "role"
    if isinstance(node, jn.Getitem):
        return isinstance(node.arg, jn.Const) and node.arg.value == "role"
    return False


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


def renders_developer(chat_template: str) -> bool:
    """Whether the template renders a `developer` message itself (gpt-oss's harmony template names
    the role). Elsewhere a developer message is handed to the template as a `system` message:
    most templates drop a role they do not know without a word (Qwen2.5, Qwen3, GLM-4.6,
    DeepSeek) or raise on it (Gemma 3, Mistral), and a developer message is the system prompt by
    another name (OpenAI's model spec: developer messages take the place of system messages)."""
    return "developer" in chat_template


def engine_message(msg: Mapping[str, Any], index: int, content_format: str | frozenset[str] = STRING, *,
                   media: bool = False, images: RequestImages = NO_IMAGES,
                   developer: bool = True) -> dict[str, Any]:
    """One OpenAI message as the engine's chat endpoint passes it to the template (see the module
    docstring). The input must already be a valid message (`decide.validate_messages`).
    `content_format`: "string" or "openai" for every role, or the roles whose text parts stay a
    list (`detect_part_roles`). With `media` (a vision model) image parts are kept, as
    `{"type": "image", "image": <pixel digest>}` in a list of parts (what vLLM hands a multimodal
    template), with text parts as they are; the digests are those the edge resolved (`images`,
    the request's `RequestImages`). `developer` False (the template does not render that role,
    `renders_developer`): a developer message reaches the template as a system message."""
    role = msg.get("role")
    if role == "developer" and not developer:
        role = "system"
    out: dict[str, Any] = {"role": role}
    content = msg.get("content")
    if media and isinstance(content, list) and any(_is_image_part(p) for p in content):
        out["content"] = media_content(content, index, images.by_message.get(index, {}))
    else:
        fmt = content_format if isinstance(content_format, str) else (OPENAI if role in content_format else STRING)
        out["content"] = _content(content, index, fmt)
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


def engine_messages(messages: Sequence[Mapping[str, Any]],
                    content_format: str | frozenset[str] = STRING) -> list[dict[str, Any]]:
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
    """A tool call in the key order vLLM's request model gives it (pydantic rebuilds OpenAI's
    `ChatCompletionMessageFunctionToolCallParam` and `Function` TypedDicts in their declared
    order): `id`, `function` (`arguments`, `name`, then any other key as sent), `type`, then any
    other key as sent; null values dropped. A template that writes `tool_call.function | tojson`
    (Mistral Nemo) then writes `{"arguments": ..., "name": ...}` whatever order the client sent."""
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
    function: dict[str, Any] = {"arguments": args}
    if fn.get("name") is not None:
        function["name"] = fn["name"]
    function.update((key, v) for key, v in fn.items() if v is not None and key not in function)
    out: dict[str, Any] = {}
    if tc.get("id") is not None:
        out["id"] = tc["id"]
    out["function"] = function
    out["type"] = tc.get("type") or "function"
    out.update((key, v) for key, v in tc.items() if v is not None and key not in out)
    return out
