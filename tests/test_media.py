"""Images named by their pixels (`rowgrove.media`): any lossless encoding of the same pixels has
one digest, any pixel change another; the decoded-image cache is bounded by bytes; file URLs are
read only inside the allowed folder; message hashes follow the pixels and the image-blind hash
ignores them."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image as PILImage

import rowgrove.media as media
from rowgrove.gateway.images import blind_message_hash
from rowgrove.hashing import message_hash


def encode(arr: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(arr).save(buf, fmt, **kw)
    return buf.getvalue()


arrays = st.tuples(st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**32 - 1)).map(
    lambda t: np.random.default_rng(t[2]).integers(0, 256, (t[0], t[1], 3), dtype=np.uint8))


@settings(max_examples=25, deadline=None)
@given(arr=arrays, fmt=st.sampled_from([("WEBP", {"lossless": True}), ("BMP", {}), ("PNG", {"compress_level": 0}),
                                        ("TIFF", {})]))
def test_a_lossless_re_encoding_has_the_same_digest_and_a_pixel_change_another(arr, fmt):
    name, kw = fmt
    a = media.decode_image(encode(arr, "PNG"))
    b = media.decode_image(encode(arr, name, **kw))
    assert a.digest == b.digest and a.digest.startswith("pixels:")
    changed = arr.copy()
    changed[0, 0, 0] ^= 1
    assert media.decode_image(encode(changed, "PNG")).digest != a.digest
    # the same pixel bytes at another size are another image
    if arr.shape[0] > 1 and arr.shape[0] != arr.shape[1]:
        flat = arr.reshape(arr.shape[1], arr.shape[0], 3)
        assert media.decode_image(encode(np.ascontiguousarray(flat), "PNG")).digest != a.digest


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_message_hashes_follow_the_pixels_and_the_blind_hash_ignores_them():
    arr = np.zeros((8, 8, 3), np.uint8)
    other = arr.copy()
    other[3, 3] = 255

    def msg(data):
        return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _url(data)}},
                                            {"type": "text", "text": "hi"}]}

    png, webp, changed = encode(arr, "PNG"), encode(arr, "WEBP", lossless=True), encode(other, "PNG")
    assert message_hash(msg(png)) == message_hash(msg(webp)) != message_hash(msg(changed))
    assert blind_message_hash(msg(png)) == blind_message_hash(msg(changed))
    ref = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": media.media_url(
        media.decode_image(png).digest)}}, {"type": "text", "text": "hi"}]}
    assert message_hash(ref) == message_hash(msg(png))


def test_the_cache_is_bounded_by_bytes(monkeypatch):
    imgs = [encode(np.full((20, 20, 3), k, np.uint8), "PNG") for k in range(5)]
    monkeypatch.setattr(media, "CACHE_BYTES", 2 * max(len(b) for b in imgs))
    decoded = [media.decode_image(b) for b in imgs]
    assert media.known(decoded[-1].digest) is decoded[-1]
    assert media.known(decoded[0].digest) is None
    assert media._held[0] <= media.CACHE_BYTES


def test_file_urls_are_read_only_inside_the_folder(tmp_path):
    inside = tmp_path / "shots" / "a.png"
    inside.parent.mkdir()
    inside.write_bytes(encode(np.zeros((4, 4, 3), np.uint8), "PNG"))
    assert media.load_url(inside.as_uri(), folder=inside.parent).width == 4
    with pytest.raises(media.MediaError, match="--media-folder"):
        media.load_url(inside.as_uri())
    (tmp_path / "secret.png").write_bytes(inside.read_bytes())
    with pytest.raises(media.MediaError, match="outside the allowed media folder"):
        media.load_url((inside.parent / ".." / "secret.png").as_uri(), folder=inside.parent)
    with pytest.raises(media.MediaError, match="cannot read"):
        media.load_url((inside.parent / "missing.png").as_uri(), folder=inside.parent)
