"""The fast renderer (MiniJinja over a template's window form) against `apply_chat_template`, on
every real template of tests/families.py and every template rowgrove ships, over generated
conversations: tool calls, tool results, reasoning, image parts, unicode, `<`, `>`, `&` and quotes
in arguments and text.

Each example asserts byte equality with `apply_chat_template`, or that the fast path declined
(returned None); and that a window render of the last k messages writes exactly the text the
whole rendering writes for them (the incremental proof, checked on data). Templates the proof or
the engine check declines are listed, and the ones rowgrove relies on for constant-cost
continuations must not decline.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from families import FAMILIES, require_families  # noqa: E402
from test_content_parts_roles import TEMPLATES as EXCERPTS  # noqa: E402

from rowgrove.gateway.core.incremental import analyse  # noqa: E402
from rowgrove.gateway.core.preprocess import detect_content_format, detect_part_roles, engine_message  # noqa: E402
from rowgrove.gateway.core.window import fast_engine, plain, split  # noqa: E402
from rowgrove.model.templates import TEMPLATES  # noqa: E402

# every template rowgrove ships, every real family template (read when a test asks for it, so a
# missing one skips that test), and the excerpts of templates that read parts for some roles only
# (Kimi K2, Ministral 3: tests/gateway/test_content_parts_roles.py)
NAMES = sorted([f"rowgrove:{name}" for name in TEMPLATES] + list(FAMILIES) + [f"excerpt:{name}" for name in EXCERPTS])


def source_of(name: str) -> str:
    """The template text of `name`: a shipped template, an excerpt, or a family's real one (skips
    when absent)."""
    if name.startswith("rowgrove:"):
        return TEMPLATES[name.removeprefix("rowgrove:")].jinja
    if name.startswith("excerpt:"):
        return EXCERPTS[name.removeprefix("excerpt:")]
    return FAMILIES[name].chat_template()


# templates whose continuations must take the window path (the benchmarks' and the default's)
MUST_BE_FAST = {"rowgrove:chatml", "rowgrove:qwen3", "rowgrove:llama3", "qwen2.5", "qwen3"}

TEXT = st.lists(st.sampled_from(list("ab <>&'\"\n{}:日ü") + ["</think>", "<think>", "<tool_response>",
                                                                "</tool_response>", "\\u003c"]),
                max_size=10).map("".join)
ARG = st.one_of(TEXT, st.integers(-5, 99))
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather <now> & 'then' \"quoted\" ünï",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@st.composite
def conversations(draw, images: bool):
    """(raw OpenAI messages, tools, template options): a system message or not, then turns."""
    msgs: list[dict] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(TEXT)})
    msgs.append({"role": "user", "content": draw(TEXT)})
    pending: list[str] = []
    for k in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["assistant", "tool_call", "user"]))
        if pending and draw(st.booleans()):
            for cid in pending:
                content = draw(TEXT)
                msgs.append({"role": "tool", "tool_call_id": cid,
                             "content": [{"type": "text", "text": content}] if draw(st.booleans()) else content})
            pending = []
            continue
        if kind == "user":
            if images and draw(st.booleans()):
                msgs.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": draw(TEXT)}]})
            else:
                msgs.append({"role": "user", "content": draw(TEXT)})
            continue
        msg: dict = {"role": "assistant", "content": draw(st.one_of(st.none(), TEXT))}
        if draw(st.booleans()):
            msg["reasoning_content"] = draw(TEXT)
        if kind == "tool_call":
            calls = []
            for c in range(draw(st.integers(1, 2))):
                cid = f"call{k}{c:04d}"[-9:].rjust(9, "0")
                args = draw(st.dictionaries(st.sampled_from(["city", "q", "n"]), ARG, max_size=2))
                calls.append({"id": cid, "type": "function", "function": {
                    "name": draw(st.sampled_from(["get_weather", "search"])),
                    "arguments": __import__("json").dumps(args, ensure_ascii=False)}})
            msg["tool_calls"] = calls
            pending = [c["id"] for c in calls]
        elif msg["content"] is None:
            msg["content"] = ""
        msgs.append(msg)
    for cid in pending:
        msgs.append({"role": "tool", "tool_call_id": cid, "content": draw(TEXT)})
    tools = draw(st.sampled_from([None, TOOLS]))
    opts = draw(st.sampled_from([{}, {"enable_thinking": False}, {"enable_thinking": True}]))
    return msgs, tools, opts


def _prepare(msgs: list[dict], fmt: frozenset[str]) -> list[dict]:
    out = []
    for i, m in enumerate(msgs):
        content = m.get("content")
        if isinstance(content, list) and any(p.get("type") == "image" for p in content):
            # what the gateway hands a vision template: image parts by pixel digest
            out.append({"role": m["role"], "content": [
                {"type": "image", "image": "sha256:00"} if p["type"] == "image" else p for p in content]})
        else:
            out.append(engine_message(m, i, fmt))
    return out


@pytest.fixture(scope="module")
def tokenizer():
    from rowgrove.model.load import load_tokenizer
    from rowgrove.model.tiny import tiny_model_dir

    return load_tokenizer(str(tiny_model_dir("chatml")))


def test_strings_the_engines_strip_differently_decline():
    """Python's str.strip treats U+001C..U+001F as whitespace, Rust's does not: MiniJinja would
    render `"a\x1f".strip()` differently, so such strings never take the fast path."""
    import minijinja

    env = minijinja.Environment()
    env.pycompat = True
    assert env.render_str("{{ s.strip() }}", s="a\x1f") != "a\x1f".strip()
    assert not plain({"role": "user", "content": "a\x1f"}) and plain({"role": "user", "content": "a b"})


@given(st.lists(st.text(alphabet=st.sampled_from("ab \x1c\x1d\x1e\x1f\\u\"{}:01cdef"), max_size=12),
                min_size=1, max_size=4))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_renderer_never_calls_a_message_plain_that_is_not(tokenizer, texts):
    """`Renderer.prepare` reads a message's plainness off its JSON (escaped control characters),
    not by walking the prepared dict: it may call a plain message odd (then the exact slow path
    renders it), never an odd one plain, raw text and text decoded from tool-call arguments alike."""
    import json

    from rowgrove.gateway.core.render import Renderer

    r = Renderer(tokenizer)
    msgs = [{"role": "user", "content": texts[0]}]
    for k, t in enumerate(texts[1:]):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": json.dumps({"a": t})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": t})
    for m in r.prepare(msgs):
        if not plain(m):
            assert not r._all_plain([m]), m
    assert r._all_plain(r.prepare([{"role": "user", "content": "a b"}]))


@pytest.mark.parametrize("name", sorted(MUST_BE_FAST))
def test_the_templates_rowgrove_relies_on_take_the_fast_path(name, tokenizer):
    special = dict(tokenizer.special_tokens_map)
    _engine, why = fast_engine(source_of(name), special)
    assert why == "", f"{name}: {why}"


def test_the_proof_declines_state_across_messages_and_reassigned_messages():
    require_families(["glm-4.6", "llama3.1"])
    assert isinstance(analyse(source_of("glm-4.6")), str)
    assert "reassigns messages" in analyse(source_of("llama3.1"))


@pytest.mark.parametrize("name", NAMES)
def test_fast_path_equals_apply_chat_template_or_declines(name, tokenizer):
    source = source_of(name)
    special = dict(tokenizer.special_tokens_map)
    engine, _why = fast_engine(source, special)
    fmt = detect_part_roles(source)  # as the gateway's Renderer prepares messages for both paths
    images = "image" in source

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(conv=conversations(images), gen=st.booleans(), k=st.integers(0, 8))
    def check(conv, gen, k):
        msgs, tools, opts = conv
        try:
            prepared = _prepare(msgs, fmt)
        except Exception:
            return  # the gateway refuses these messages before any template sees them
        try:
            want = tokenizer.apply_chat_template(prepared, tools=tools, add_generation_prompt=gen, tokenize=False,
                                                 chat_template=source, **opts)
        except Exception:
            want = None
        if engine is None or not plain(tools) or not all(map(plain, prepared)):
            return  # declined
        raw = engine.render(prepared, tools, opts, gen)
        whole = split(raw) if raw is not None else None
        if whole is None:
            return  # declined
        assert want is not None, "the fast path rendered what apply_chat_template refuses"
        assert whole.text == want
        # the window from loop position k on writes what the whole rendering writes there
        if not whole.items:
            return
        k = min(k, len(whole.items) - 1)  # at least one message in the window, as a continuation has
        part = split(engine.render(prepared, tools, opts, gen, k), len(whole.items) - k)
        assert part is not None
        assert part.pre == whole.pre and part.v == whole.v
        assert "".join(part.items) == "".join(whole.items[len(whole.items) - len(part.items):])

    check()


# -- text parts reach a template as the string they stand for (vllm#39614) -------------------------

def _tool_turn(parts: bool) -> list[dict]:
    from families import tool_call_id

    result = [{"type": "text", "text": "sunny, 21C"}] if parts else "sunny, 21C"
    return [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": tool_call_id(0), "type": "function",
                                                                  "function": {"name": "get_weather",
                                                                               "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": tool_call_id(0), "name": "get_weather", "content": result}]


@pytest.mark.parametrize("name", NAMES)
def test_text_parts_render_as_their_string_on_every_template(name, tokenizer):
    """A tool result sent as `[{"type": "text", "text": ...}]` renders exactly as the same result
    sent as a string: no template (GLM-4.6's tool branch loops over content without asking a
    part's type; Kimi K2's and Ministral 3's tool branches print the content whole while other
    roles' branches read parts) ever prints a part's Python repr."""
    source = source_of(name)
    fmt = detect_part_roles(source)

    engine, _why = fast_engine(source, dict(tokenizer.special_tokens_map))

    def render(parts: bool) -> str:
        prepared = [engine_message(m, i, fmt) for i, m in enumerate(_tool_turn(parts))]
        text = tokenizer.apply_chat_template(prepared, tools=TOOLS, add_generation_prompt=True, tokenize=False,
                                             chat_template=source)
        if engine is not None:  # the fast path renders the same messages, and the same text
            raw = engine.render(prepared, TOOLS, {}, True)
            assert raw is not None and split(raw).text == text
        return text

    text = render(True)
    assert "sunny, 21C" in text and "'type'" not in text and "'text'" not in text
    assert text == render(False)


def test_only_templates_that_read_part_types_get_part_lists():
    typed = "{% for m in messages %}{% for p in m.content %}{{ p.text if p.type == 'text' }}{% endfor %}{% endfor %}"
    untyped = "{% for m in messages %}{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}"
    assert detect_content_format(typed) == "openai"
    assert detect_content_format(untyped) == "string"


def test_glm_reads_no_part_types():
    assert detect_content_format(source_of("glm-4.6")) == "string"


# -- the proof's clauses, one template each --------------------------------------------------------

_OK = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"


@pytest.mark.parametrize("template, why", [
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{% endfor %}",
     "namespace attribute"),
    ("{% for m in messages %}{{ messages | length }}{% endfor %}", "reads messages"),
    ("{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}{{ m.content }}{% endfor %}", "breaks"),
    ("{% for m in messages %}{{ messages[loop.index0 - 1].role }}{% endfor %}", "neighbour"),
    ("{% for m in messages %}{{ messages[loop.index0 + 2].role }}{% endfor %}", "neighbour"),
    ("{% for m in messages %}{{ loop.length }}{% endfor %}", "loop.length"),
    ("{% for m in messages %}{% if m.role == 'user' %}{% set last = m.content %}{% endif %}{{ last }}{% endfor %}",
     "before assigning"),
    ("{% set messages = messages[1:] %}{% for m in messages %}{{ m.content }}{% endfor %}", "reassigns messages"),
    ("{% for m in messages %}{% for n in messages %}{{ n.content }}{% endfor %}{% endfor %}", "single top-level loop"),
    ("{% macro f(l) %}{{ l.length }}{% endmacro %}{% for m in messages %}{{ f(loop) }}{% endfor %}", "whole"),
])
def test_the_proof_declines_what_it_cannot_show(template, why):
    verdict = analyse(template)
    assert isinstance(verdict, str) and why in verdict, verdict


def test_the_proof_accepts_a_guarded_neighbour_and_prints_the_variables_the_loop_reads(tokenizer):
    template = ("{% set ns = namespace(last=messages | length - 1) %}"
                "{% for m in messages %}{% if loop.first or messages[loop.index0 - 1].role != m.role %}"
                "<{{ m.role }}>{% endif %}{{ m.content }}{% if loop.index0 == ns.last %}!{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}<a>{% endif %}")
    window = analyse(template)
    assert not isinstance(window, str), window
    assert window.pre_vars == ("ns",)
    assert not isinstance(analyse(_OK), str)
    engine, why = fast_engine(template, dict(tokenizer.special_tokens_map))
    assert engine is not None, why
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    whole = split(engine.render(msgs, None, {}, True))
    assert whole.text == tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                       chat_template=template)
    part = split(engine.render(msgs, None, {}, True, 2), 1)
    assert part.items == whole.items[2:] and part.v == whole.v and "2" in part.v


@pytest.mark.parametrize("template, why", [
    # jinja2 calls a string a sequence, MiniJinja does not
    ("{% for m in messages %}{{ 'L' if m.content is sequence }}{% endfor %}", "test sequence"),
    # jinja2 refuses to order a string against a number, MiniJinja answers False
    ("{% for m in messages %}{% if m.content < 3 %}x{% endif %}{% endfor %}", "ordering comparison"),
    ("{% for m in messages %}{% set x = m.content %}{% if x > 1 %}x{% endif %}{% endfor %}", "ordering comparison"),
    ("{% set ns = namespace(a=0) %}{% for m in messages %}{% set ns.a = m.content %}"
     "{% if ns.a >= 3 %}x{% endif %}{% endfor %}", "ordering comparison"),
    ("{% for m in messages %}{{ m.role ~ '!' }}{% endfor %}", "Concat"),
    ("{% for m in messages %}{{ m.content | title }}{% endfor %}", "filter title"),
])
def test_minijinja_is_refused_where_the_engines_differ(template, why):
    from rowgrove.gateway.core.window import supported

    verdict = supported(template)
    assert verdict is not None and why in verdict, verdict
    # the positions and lengths a template computes itself may be ordered
    assert supported("{% set ns = namespace(last=messages | length - 1) %}{% for m in messages %}"
                     "{% if loop.index0 > ns.last %}x{% endif %}{% endfor %}") is None


# -- latched scans (Qwen3's search for the last real user query) ------------------------------------

_SCAN = ("{%- set ns = namespace(looking=true, at=-1) %}"
         "{%- for m in messages[::-1] %}{%- set i = (messages | length - 1) - loop.index0 %}"
         "{%- if ns.looking and m.role == 'user' and not m.content.startswith('<r>') %}"
         "{%- set ns.looking = false %}{%- set ns.at = i %}{%- endif %}{%- endfor %}"
         "{%- for m in messages %}<{{ m.role }}{% if loop.index0 > ns.at %}*{% endif %}>{{ m.content }}{% endfor %}"
         "{%- if add_generation_prompt %}<a>{% endif %}")


def test_qwen3s_scan_for_the_last_query_stops_at_it():
    """The window form breaks out of Qwen3's reverse scan once the last real user query is
    found: a continuation's render costs the messages since that query, not the conversation."""
    require_families(["qwen3"])
    window = analyse(source_of("qwen3"))
    assert not isinstance(window, str), window
    assert "{% if not ns.multi_step_tool %}{% break %}{% endif %}" in window.source


@pytest.mark.parametrize("body", [
    "{%- set i = loop.index0 %}{{ i }}{%- if ns.looking and m.role == 'user' %}{%- set ns.looking = false %}{%- endif %}",
    "{%- set i = m.content - 1 %}{%- if ns.looking and m.role == 'user' %}{%- set ns.looking = false %}{%- endif %}",
    "{%- set i = m.content.split('x') %}{%- if ns.looking %}{%- set ns.looking = false %}{%- endif %}",
    "{%- if m.role == 'user' and ns.looking %}{%- set ns.looking = false %}{%- endif %}",
    "{%- if ns.looking %}{%- set ns.at = 1 %}{%- else %}{%- set ns.at = 2 %}{%- endif %}",
    "{%- if ns.looking %}{%- set ns.looking = false %}{%- endif %}{%- if ns.at %}{%- set ns.at = 0 %}{%- endif %}",
    "{%- set ns = namespace(looking=true, at=0) %}{%- if ns.looking %}{%- set ns.looking = false %}{%- endif %}",
])
def test_a_scan_whose_later_iterations_might_act_is_not_cut_short(body):
    """Printing, an assignment that could fail or call a method, a test the flag does not guard
    first, an else, a second guard, rebinding the namespace: any of these keeps the whole scan."""
    template = ("{%- set ns = namespace(looking=true, at=-1) %}{%- for m in messages[::-1] %}" + body
                + "{%- endfor %}{%- for m in messages %}{{ m.content }}{% endfor %}")
    window = analyse(template)
    assert not isinstance(window, str), window
    assert "{% break %}" not in window.source


def test_a_cut_short_scan_renders_as_the_whole_scan(tokenizer):
    """The latched scan through the fast engine against apply_chat_template (jinja2, the whole
    scan), on conversations with the queries anywhere, or none, and the window from every
    position against the whole rendering."""
    window = analyse(_SCAN)
    assert not isinstance(window, str) and "{% break %}" in window.source
    engine, why = fast_engine(_SCAN, dict(tokenizer.special_tokens_map))
    assert engine is not None, why
    content = st.sampled_from(["a", "<r>b", "c<r>", ""])
    message = st.builds(lambda role, text: {"role": role, "content": text},
                        st.sampled_from(["user", "assistant", "tool"]), content)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(msgs=st.lists(message, min_size=1, max_size=12), k=st.integers(0, 11))
    def check(msgs, k):
        want = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, chat_template=_SCAN)
        whole = split(engine.render(msgs, None, {}, True))
        assert whole is not None and whole.text == want
        k = min(k, len(msgs) - 1)
        part = split(engine.render(msgs, None, {}, True, k), len(msgs) - k)
        assert part is not None and part.v == whole.v and part.items == whole.items[k:]

    check()


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3)
    | st.dictionaries(st.integers(0, 3), kids, max_size=2),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_JSONISH, min_size=1, max_size=4),
       args=st.sampled_from([{}, {"indent": 2}, {"indent": "\t"}, {"sort_keys": True}, {"ensure_ascii": True},
                             {"separators": (",", ":")}, {"separators": [", ", ": "], "indent": 4}]))
def test_tojson_writes_what_json_dumps_writes_remembered_or_not(values, args):
    """The window engine's tojson remembers what it wrote by the value's orjson bytes; each value,
    written twice and among others that orjson writes alike (null, NaN, infinities), reads as
    json.dumps writes it."""
    import json

    from rowgrove.gateway.core.window import _tojson

    for _ in range(2):
        for v in [*values, float("nan"), None, float("inf"), 1, 1.0, True]:
            assert _tojson(v, **args) == json.dumps(v, **{"ensure_ascii": False, **args})
