"""`Renderer.decode_reply(ids, body)` gives exactly `(decode(ids), decode(ids[:body]))`: a reply
with and without its final stop token, decoded once where the decoder allows it. Checked on any
ids (partial characters among them, which a byte-level decoder turns into U+FFFD) ending in each
stop token, on the tiny vocabularies and, where present, on real ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from families import family_model_dir

REAL = ("qwen3", "llama3.1", "deepseek-v3.1", "gpt-oss")


def _check(renderer, data) -> None:
    n = len(renderer.tokenizer)
    stops = sorted(renderer.stop_ids)
    ids = data.draw(st.lists(st.integers(0, n - 1), max_size=12), label="ids")
    stop = data.draw(st.sampled_from(stops), label="stop")
    whole = [*ids, stop]
    assert renderer.decode_reply(whole, len(ids)) == (renderer.decode(whole), renderer.decode(ids))
    assert renderer.decode_reply(ids, len(ids)) == (renderer.decode(ids), renderer.decode(ids))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_tiny_vocabularies(renderers, data):
    for renderer in renderers.values():
        _check(renderer, data)


@pytest.fixture(scope="module", params=REAL)
def real_renderer(request):
    from rowgrove.gateway.core.render import Renderer
    from rowgrove.model.load import load_tokenizer

    return Renderer(load_tokenizer(str(family_model_dir(request.param, vocab="real"))))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_real_vocabularies(real_renderer, data):
    _check(real_renderer, data)


def test_a_cut_inside_a_character_is_decoded_apart(renderers):
    """The bytes of one character split over ids, the stop token after its first byte: the body's
    text is its own decoding (U+FFFD), not the whole text cut before the stop token."""
    r = renderers["qwen3"]
    ids = r.encode("é")
    first = [i for i in r.encode("中文") if i not in r.stop_ids][:1]
    stop = sorted(r.stop_ids)[0]
    for body in (ids, first):
        whole = [*body, stop]
        assert r.decode_reply(whole, len(body)) == (r.decode(whole), r.decode(body))
