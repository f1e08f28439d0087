"""Images through the gateway, over real HTTP with the official openai SDK, on the tiny VLM
(`--model tiny-vl`, a random-init Qwen2-VL with its image processor), scripted engine.

Pinned here: a kept image continues; the same pixels re-encoded continue; changed pixels of a kept
image are a 400 naming the message with the ledger unchanged; a compaction that drops old images
starts a new root and one more row; each image is stored once however many calls carry it; bad
images are 400 naming message and part. For every call, the ids the engine was given equal the
processor's own expansion (`processor.apply_chat_template` + `processor(text, images)`).
"""

from __future__ import annotations

import base64
import io
import sqlite3

import httpx
import pytest

openai = pytest.importorskip("openai")

from PIL import Image as PILImage  # noqa: E402

from rowgrove.gateway.testing import start_gateway  # noqa: E402
from rowgrove.model.load import model_dir  # noqa: E402
from rowgrove.model.vision import load_processor  # noqa: E402

from fixtures_http import TestEngine, dump_ledger, full_prompt, scripted_engine  # noqa: E402


def png(color: tuple[int, int, int], size: tuple[int, int] = (90, 60), fmt: str = "PNG", **kw) -> str:
    """A data URL of a solid image with a white square in its corner (so the pixels are not trivial)."""
    im = PILImage.new("RGB", size, color)
    im.paste((255, 255, 255), (2, 2, 12, 12))
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    mime = {"PNG": "png", "WEBP": "webp", "BMP": "bmp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def user(text: str, *urls: str) -> dict:
    return {"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}} for u in urls),
                                        {"type": "text", "text": text}]}


RED, BLUE, GREEN = png((200, 30, 30)), png((30, 30, 200), (120, 80)), png((30, 200, 30), (50, 70))


@pytest.fixture(scope="module")
def engine():
    return TestEngine(scripted_engine("tiny-vl"))


@pytest.fixture(scope="module")
def processor(engine):
    return load_processor(model_dir("tiny-vl"), engine.tokenizer)


@pytest.fixture
def gw(engine, tmp_path):
    engine.reset()
    engine.prompts.clear()
    with start_gateway("tiny-vl", engine=engine, ledger=tmp_path / "ledger.db", media_folder=str(tmp_path)) as g:
        yield g


def client(ro) -> openai.OpenAI:
    return openai.OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)


def processor_ids(processor, messages: list[dict]) -> list[int]:
    """The processor's own ids for a request: its chat template on the messages (images as
    `{"type": "image"}` parts) and its tokenization with the decoded images."""
    from rowgrove.media import image_positions, load_url

    conv, images = [], []
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):
            parts = []
            for p in c:
                if p["type"] == "image_url":
                    img = load_url(p["image_url"]["url"]).pil()
                    images.append(img)
                    parts.append({"type": "image", "image": img})
                else:
                    parts.append(p)
            conv.append({**m, "content": parts})
        else:
            conv.append({**m, "content": c or ""})
    assert len(images) == len(image_positions(messages))
    text = processor.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    enc = processor(text=[text], images=images or None)
    return list(enc["input_ids"][0])


def ask(cli, messages, script="ok") -> dict:
    r = cli.chat.completions.create(model="tiny-vl", messages=messages, extra_body={"script": script})
    return {"role": "assistant", "content": r.choices[0].message.content}


def calls(gw, ro):
    return gw.ledger.calls(ro["rollout_id"])


def check_ids(gw, ro, processor, requests):
    """Every call's full prompt (rebuilt from the ledger) is what the engine got and the processor's ids."""
    cs = calls(gw, ro)
    assert len(cs) == len(requests)
    for call, msgs, sent in zip(cs, requests, gw.engine.prompts[-len(cs):], strict=True):
        full = full_prompt(gw.ledger, call)
        assert full == sent
        assert full == processor_ids(processor, msgs), f"call {call.ordinal}"


def media_rows(path) -> tuple[int, int]:
    db = sqlite3.connect(path)
    try:
        return (db.execute("SELECT COUNT(*) FROM media").fetchone()[0],
                db.execute("SELECT COUNT(*) FROM call_media").fetchone()[0])
    finally:
        db.close()


def test_a_kept_image_continues_and_is_stored_once(gw, processor):
    ro = gw.create_rollout("g")
    cli = client(ro)
    m1 = [user("count the squares", RED)]
    a1 = ask(cli, m1, "one")
    m2 = m1 + [a1, user("and now?", BLUE)]
    a2 = ask(cli, m2, "two")
    m3 = m2 + [a2, {"role": "user", "content": "done?"}]
    ask(cli, m3, "yes")
    c1, c2, c3 = calls(gw, ro)
    assert c1.root and c2.parent_id == c1.id and c3.parent_id == c2.id
    check_ids(gw, ro, processor, [m1, m2, m3])
    pad = processor.image_token_id
    assert c1.prompt_ids.tolist().count(pad) == 6  # 90x60 -> 84x56 after smart_resize: 6x4 patches / 4
    assert gw.ledger.call_images(ro["rollout_id"])[c3.id] == [d for d in gw.ledger.call_images(ro["rollout_id"])[c2.id]]
    assert media_rows(gw.ledger_path) == (2, 1 + 2 + 2)  # 2 images stored once, 5 references


def test_the_same_pixels_re_encoded_continue(gw, processor):
    ro = gw.create_rollout("g")
    cli = client(ro)
    m1 = [user("look", RED)]
    a1 = ask(cli, m1, "seen")
    again = png((200, 30, 30), fmt="WEBP", lossless=True)
    assert again != RED
    m2 = [user("look", again), a1, user("more")]
    ask(cli, m2)
    c1, c2 = calls(gw, ro)
    assert c2.parent_id == c1.id
    check_ids(gw, ro, processor, [m1, m2])
    assert media_rows(gw.ledger_path)[0] == 1


def test_changed_pixels_of_a_kept_image_are_refused_with_the_ledger_unchanged(gw, processor):
    ro = gw.create_rollout("g")
    cli = client(ro)
    m1 = [{"role": "system", "content": "be brief"}, user("look", RED)]
    a1 = ask(cli, m1, "seen")
    check_ids(gw, ro, processor, [m1])
    before = dump_ledger(gw.ledger_path), media_rows(gw.ledger_path)
    changed = png((201, 30, 30))
    r = httpx.post(ro["base_url"] + "/chat/completions", headers={"authorization": f"Bearer {ro['api_key']}"},
                   json={"messages": [m1[0], user("look", changed), a1, user("again")]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "messages[1].content[0]" in err["message"] and "pixels differ" in err["message"]
    assert err["code"] == "image_changed"
    assert (dump_ledger(gw.ledger_path), media_rows(gw.ledger_path)) == before


def test_a_compaction_that_drops_old_images_is_a_new_root_and_one_more_row(gw, processor):
    ro = gw.create_rollout("g")
    cli = client(ro)
    m1 = [user("screen 1", RED)]
    a1 = ask(cli, m1, "saw one")
    m2 = m1 + [a1, user("screen 2", BLUE)]
    a2 = ask(cli, m2, "saw two")
    # compaction: keep only the newest image
    m3 = [user("screen 1", ), a1, user("screen 2", BLUE), a2, user("screen 3", GREEN)]
    m3[0] = {"role": "user", "content": "screen 1 (image dropped)"}
    a3 = ask(cli, m3, "saw three")
    c1, c2, c3 = calls(gw, ro)
    assert c2.parent_id == c1.id and c3.root
    check_ids(gw, ro, processor, [m1, m2, m3])
    gw.finish(ro["rollout_id"], conversations=[m2 + [a2], m3 + [a3]], reward=1.0)
    rows = gw.rows(ro["rollout_id"])["rows"]
    assert len(rows) == 2
    assert media_rows(gw.ledger_path) == (3, 1 + 2 + 2)
    # the finished record holds references, not bytes
    rec = gw.ledger.get_rollout(ro["rollout_id"]).record
    assert "base64" not in str(rec) and "rowgrove-media:pixels:" in str(rec)
    assert [r["images"] for r in rows] == [gw.ledger.call_images(ro["rollout_id"])[c.id] for c in (c2, c3)]


def test_a_file_url_inside_the_media_folder_is_read_and_one_outside_refused(gw, processor, tmp_path):
    path = tmp_path / "shot.png"
    path.write_bytes(base64.b64decode(RED.split(",", 1)[1]))
    ro = gw.create_rollout("g")
    cli = client(ro)
    m1 = [user("look", path.as_uri())]
    a1 = ask(cli, m1, "seen")
    m2 = [user("look", RED), a1, user("same image as data")]
    ask(cli, m2)
    c1, c2 = calls(gw, ro)
    assert c2.parent_id == c1.id
    check_ids(gw, ro, processor, [[user("look", RED)], m2])
    r = httpx.post(ro["base_url"] + "/chat/completions", headers={"authorization": f"Bearer {ro['api_key']}"},
                   json={"messages": [user("x", "file:///etc/hostname")]})
    assert r.status_code == 400 and "outside the allowed media folder" in r.json()["error"]["message"]


BAD = [
    pytest.param("data:image/png;base64,aGVsbG8=", "could not be decoded", id="not-an-image"),
    pytest.param("data:image/png;base64,abcde", "base64", id="bad-base64"),
    pytest.param("data:text/plain;base64,aGVsbG8=", "not an image", id="not-image-mime"),
    pytest.param("https://example.com/x.png", "cannot be fetched", id="remote-url"),
    pytest.param("rowgrove-media:pixels:00", "no image", id="unknown-ref"),
    pytest.param(png((1, 2, 3), fmt="PNG")[:60], "", id="truncated"),
]


@pytest.mark.parametrize(("url", "words"), BAD)
def test_a_bad_image_is_400_naming_message_and_part(gw, url, words):
    ro = gw.create_rollout("g")
    before = dump_ledger(gw.ledger_path)
    body = {"messages": [{"role": "system", "content": "s"}, user("look", RED, url)]}
    r = httpx.post(ro["base_url"] + "/chat/completions", headers={"authorization": f"Bearer {ro['api_key']}"},
                   json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and err["message"].startswith("messages[1].content[1]:"), err
    assert words in err["message"]
    assert dump_ledger(gw.ledger_path) == before


def test_an_oversized_image_is_400(gw, monkeypatch):
    import rowgrove.media as media

    monkeypatch.setattr(media, "MAX_IMAGE_PIXELS", 100)
    ro = gw.create_rollout("g")
    r = httpx.post(ro["base_url"] + "/chat/completions", headers={"authorization": f"Bearer {ro['api_key']}"},
                   json={"messages": [user("look", png((9, 9, 9), (31, 17)))]})
    assert r.status_code == 400 and "messages[0].content[0]" in r.json()["error"]["message"]
    assert "31x17" in r.json()["error"]["message"]


def test_rowgrove_show_draws_which_calls_carried_which_images(gw, processor, tmp_path, capsys):
    from rowgrove.cli import main

    ro = gw.create_rollout("g")
    cli = client(ro)
    m1 = [user("screen 1", RED)]
    a1 = ask(cli, m1, "saw one")
    m2 = m1 + [a1, user("screen 2", BLUE)]
    a2 = ask(cli, m2, "saw two")
    m3 = [{"role": "user", "content": "screen 1 (dropped)"}, a1, user("screen 2", BLUE), a2, user("screen 3", GREEN)]
    a3 = ask(cli, m3, "saw three")
    check_ids(gw, ro, processor, [m1, m2, m3])
    gw.finish(ro["rollout_id"], conversations=[m2 + [a2], m3 + [a3]], reward=1.0)
    assert main(["show", "--ledger", str(gw.ledger_path), "--rollout", ro["rollout_id"]]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip().startswith("c")}
    assert lines["c1"].endswith("images +i1")
    assert lines["c2"].endswith("images i1 +i2")
    assert lines["c3"].endswith("images i2 +i3")
    assert "images (3, + = first carried by that call): i1 = pixels:" in out
    svg = tmp_path / "lineage.svg"
    assert main(["show", "--ledger", str(gw.ledger_path), "--rollout", ro["rollout_id"], "--out", str(svg)]) == 0
    assert "i1 +i2" in svg.read_text()


@pytest.mark.slow  # a fresh process imports torch and transformers
def test_rowgrove_serve_tiny_vl_with_a_media_folder(tmp_path, processor):
    import os
    import socket
    import subprocess
    import sys
    import time

    from rowgrove.ledger import Ledger

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shot = tmp_path / "shots" / "a.png"
    shot.parent.mkdir()
    shot.write_bytes(base64.b64decode(RED.split(",", 1)[1]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rowgrove.cli", "serve", "--model", "tiny-vl", "--engine", "scripted",
         "--ledger", str(tmp_path / "served.db"), "--port", str(port), "--media-folder", str(shot.parent),
         "--log-level", "warning"],
        env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-2000:]
            time.sleep(0.2)
        ro = httpx.post(url + "/v1/rollouts", json={"group_id": "g"}).json()
        cli = client(ro)
        m1 = [user("look", shot.as_uri())]
        a1 = ask(cli, m1, "seen")
        m2 = [user("look", RED), a1, user("again", GREEN)]
        ask(cli, m2, "two")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    with Ledger(tmp_path / "served.db", readonly=True) as led:
        c1, c2 = led.calls(ro["rollout_id"])
        assert c2.parent_id == c1.id
        assert full_prompt(led, c2) == processor_ids(processor, m2)


def test_serve_help_lists_tiny_vl_and_a_bad_media_folder_is_refused(tmp_path, capsys):
    from rowgrove.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "tiny-vl" in out and "--media-folder" in out
    assert main(["serve", "--ledger", str(tmp_path / "l.db"), "--media-folder", str(tmp_path / "none")]) == 2
    assert "--media-folder" in capsys.readouterr().err
    assert not (tmp_path / "l.db").exists()


def test_the_kept_image_check_survives_a_gateway_restart(engine, processor, tmp_path):
    engine.reset()
    path = tmp_path / "ledger.db"
    with start_gateway("tiny-vl", engine=engine, ledger=path) as g:
        ro = g.create_rollout("g")
        m1 = [user("look", RED)]
        a1 = ask(client(ro), m1, "seen")
    with start_gateway("tiny-vl", engine=engine, ledger=path) as g:  # a new process's memory: rebuilt from the ledger
        before = dump_ledger(path)
        r = httpx.post(ro["base_url"].replace(ro["base_url"].split("/rollouts/")[0], g.url) + "/chat/completions",
                       headers={"authorization": f"Bearer {ro['api_key']}"},
                       json={"messages": [user("look", png((201, 30, 30))), a1, user("again")]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "image_changed"
        assert dump_ledger(path) == before
        ask(openai.OpenAI(base_url=ro["base_url"].replace(ro["base_url"].split("/rollouts/")[0], g.url),
                          api_key=ro["api_key"], max_retries=0), [user("look", RED), a1, user("again")])
        c1, c2 = g.ledger.calls(ro["rollout_id"])
        assert c2.parent_id == c1.id
        assert full_prompt(g.ledger, c2) == processor_ids(processor, [user("look", RED), a1, user("again")])
