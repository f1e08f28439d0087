"""Images in the other two dialects: a Responses `input_image` and an Anthropic `image` block are
the same image part as Chat's `image_url` (hashed by pixels), so a vision episode continues call
for call whichever SDK sent each turn, and each image is stored once. Official SDKs over loopback,
the tiny VLM with the scripted engine."""

from __future__ import annotations

import sqlite3

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from test_http_images import BLUE, RED, TestEngine, png, scripted_engine  # noqa: E402

from rowgrove.gateway.testing import start_gateway  # noqa: E402


@pytest.fixture
def gw(tmp_path):
    with start_gateway("tiny-vl", engine=TestEngine(scripted_engine("tiny-vl")), ledger=tmp_path / "l.db") as g:
        yield g


def _b64(url: str) -> tuple[str, str]:
    head, data = url.split(",", 1)
    return head[len("data:"):].split(";")[0], data


def test_a_vision_episode_continues_across_chat_responses_and_messages(gw):
    ro = gw.create_rollout("g-vl")
    chat = openai.OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    first = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": RED}},
                                          {"type": "text", "text": "what is this?"}]}]
    a1 = chat.chat.completions.create(model="m", messages=first, extra_body={"script": "red"})
    assert a1.choices[0].message.content == "red"

    # turn 2 over Responses, the kept image re-encoded (WebP, same pixels) as an input_image
    red_webp = png((200, 30, 30), fmt="WEBP", lossless=True)
    r2 = chat.responses.create(model="m", input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": red_webp},
                                     {"type": "input_text", "text": "what is this?"}]},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": [{"type": "input_image", "image_url": BLUE},
                                     {"type": "input_text", "text": "and this?"}]}],
        extra_body={"script": "blue"})
    assert r2.output_text == "blue"

    # turn 3 over the Messages API, images as base64 blocks
    claude = anthropic.Anthropic(base_url=ro["base_url"].rsplit("/v1", 1)[0], api_key=ro["api_key"], max_retries=0)

    def image(url: str) -> dict:
        media, data = _b64(url)
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}

    m3 = claude.messages.create(model="m", max_tokens=16, extra_body={"script": "done"}, messages=[
        {"role": "user", "content": [image(RED), {"type": "text", "text": "what is this?"}]},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": [image(BLUE), {"type": "text", "text": "and this?"}]},
        {"role": "assistant", "content": "blue"},
        {"role": "user", "content": "thanks"}])
    assert m3.content[0].text == "done"

    calls = gw.ledger.calls(ro["rollout_id"])
    assert [c.status for c in calls] == ["completed"] * 3
    assert calls[0].root and calls[1].parent_id == calls[0].id and calls[2].parent_id == calls[1].id
    db = sqlite3.connect(gw.ledger_path)
    assert db.execute("SELECT COUNT(*) FROM media").fetchone() == (2,)  # red once, blue once


@pytest.mark.parametrize("dialect", ["responses", "anthropic"])
def test_changed_pixels_of_a_kept_image_are_refused_in_each_dialect(gw, dialect):
    ro = gw.create_rollout("g-vl")
    chat = openai.OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    chat.chat.completions.create(model="m", extra_body={"script": "red"}, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": RED}},
                                     {"type": "text", "text": "what is this?"}]}])
    other = png((201, 30, 30))  # one channel off: different pixels, same position
    if dialect == "responses":
        with pytest.raises(openai.BadRequestError) as info:
            chat.responses.create(model="m", input=[
                {"role": "user", "content": [{"type": "input_image", "image_url": other},
                                             {"type": "input_text", "text": "what is this?"}]},
                {"role": "assistant", "content": "red"},
                {"role": "user", "content": "again?"}])
        assert info.value.body["code"] == "image_changed"
    else:
        claude = anthropic.Anthropic(base_url=ro["base_url"].rsplit("/v1", 1)[0], api_key=ro["api_key"],
                                     max_retries=0)
        media, data = _b64(other)
        with pytest.raises(anthropic.BadRequestError) as info:
            claude.messages.create(model="m", max_tokens=8, messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": media,
                                                                          "data": data}},
                                             {"type": "text", "text": "what is this?"}]},
                {"role": "assistant", "content": "red"},
                {"role": "user", "content": "again?"}])
        assert info.value.body["type"] == "error" and "changed" in info.value.body["error"]["message"]
    assert len(gw.ledger.calls(ro["rollout_id"])) == 1
