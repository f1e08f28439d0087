"""Images in requests: decoded once, identified by their pixels, refused with the message and part
named when they cannot be read.

An image part (`{"type": "image_url", "image_url": {"url": ...}}`, or the Responses-style
`input_image`) names its image by one of three URLs:

- `data:image/...;base64,...`: the bytes inline (what the OpenAI SDKs send);
- `file:///abs/path.png`: a local file, read only when the server was told a folder to allow
  (`rowgrove serve --media-folder DIR`) and the file lies inside it;
- `rowgrove-media:<digest>`: an image this ledger already holds (what a finished rollout's
  stored conversation carries instead of the bytes, so each image is stored once).

Identity is the hash of the decoded pixels (`pixels:` + sha256 of the RGB bytes and the size), not
of the base64 text: a harness that re-encodes the same screenshot (PNG to WebP, another zlib
level) still continues its parent. RGB because that is what the model's image processor sees
(Qwen2-VL's processor converts every image to RGB before resizing).

Decoding costs a few milliseconds per screenshot, so decoded images are kept in a process-wide
cache bounded by their bytes (CACHE_BYTES), found by the sha256 of their encoded bytes and by
pixel digest (for the renderer and the engines). Pure apart from that cache and the file reads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

MEDIA_SCHEME = "rowgrove-media:"
MAX_IMAGE_BYTES = 20 << 20       # an encoded image larger than this is refused (OpenAI's own limit is 20 MB)
MAX_IMAGE_PIXELS = 40_000_000    # width x height above this is refused before decoding (decompression bombs)
CACHE_BYTES = 256 << 20          # encoded bytes of the images kept decoded per process (least recent dropped)


class MediaError(ValueError):
    """An image that cannot be used; the message says what is wrong and what to send instead."""


@dataclass(frozen=True)
class Image:
    """One decoded image. `digest` names its pixels; `data` holds the bytes it came as (any
    lossless re-encoding decodes to the same pixels); `mime` their type."""

    digest: str
    width: int
    height: int
    mime: str
    data: bytes = field(repr=False)

    def pil(self) -> Any:
        """The image as an RGB `PIL.Image` (decoded again from `data`; cheap next to a forward pass)."""
        from PIL import Image as PILImage

        with PILImage.open(io.BytesIO(self.data)) as im:
            return im.convert("RGB")


_lock = threading.Lock()
_by_bytes: dict[bytes, str] = {}                        # sha256 of the encoded bytes -> pixel digest
_by_digest: OrderedDict[str, tuple[Image, list[bytes]]] = OrderedDict()  # digest -> image, its byte keys
_held = [0]                                             # bytes held in _by_digest


def pixel_digest(rgb: Any) -> str:
    """`pixels:<sha256>` of an RGB PIL image: its size and its raw pixel bytes."""
    h = hashlib.sha256(f"rgb:{rgb.width}x{rgb.height}:".encode())
    h.update(rgb.tobytes())
    return "pixels:" + h.hexdigest()


def decode_image(data: bytes, mime: str | None = None) -> Image:
    """The image `data` encodes; MediaError when it is too large or not an image Pillow reads."""
    if len(data) > MAX_IMAGE_BYTES:
        raise MediaError(f"the image is {len(data)} bytes, more than the {MAX_IMAGE_BYTES} allowed: send a smaller one")
    key = hashlib.sha256(data).digest()
    with _lock:
        digest = _by_bytes.get(key)
        if digest is not None and digest in _by_digest:
            _by_digest.move_to_end(digest)
            return _by_digest[digest][0]
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    try:
        with PILImage.open(io.BytesIO(data)) as im:
            w, h = im.size
            if w < 1 or h < 1 or w * h > MAX_IMAGE_PIXELS:
                raise MediaError(f"the image is {w}x{h} pixels, more than the {MAX_IMAGE_PIXELS} allowed: "
                                 "send a smaller one")
            kind = (im.format or "").lower()
            rgb = im.convert("RGB")
    except MediaError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, PILImage.DecompressionBombError) as e:
        raise MediaError(f"the image could not be decoded ({type(e).__name__}: {e}): send a PNG, JPEG, "
                         "WebP or GIF file's bytes") from None
    img = Image(pixel_digest(rgb), w, h, mime or (f"image/{kind}" if kind else "image/png"), data)
    _remember(key, img)
    return img


def _remember(key: bytes, img: Image) -> None:
    """Keep `img` (first encoding seen) by digest, and `key` (its bytes' hash) pointing at it;
    the least recently used images go once more than CACHE_BYTES are held (the newest always stays)."""
    with _lock:
        entry = _by_digest.get(img.digest)
        if entry is None:
            entry = (img, [])
            _by_digest[img.digest] = entry
            _held[0] += len(img.data)
        if key not in entry[1]:
            entry[1].append(key)
        _by_bytes[key] = img.digest
        _by_digest.move_to_end(img.digest)
        while _held[0] > CACHE_BYTES and len(_by_digest) > 1:
            _, (old, keys) = _by_digest.popitem(last=False)
            _held[0] -= len(old.data)
            for k in keys:
                _by_bytes.pop(k, None)


def known(digest: str) -> Image | None:
    """The decoded image of `digest` when this process has it cached (None otherwise)."""
    with _lock:
        entry = _by_digest.get(digest)
        if entry is None:
            return None
        _by_digest.move_to_end(digest)
        return entry[0]


def remember(img: Image) -> None:
    """Make `img` known by its digest (an image read back from a ledger)."""
    _remember(hashlib.sha256(img.data).digest(), img)


def part_url(part: Mapping[str, Any]) -> Any:
    """The URL of an image part: `image_url.url`, or `image_url` given as the string itself."""
    img = part.get("image_url") or {}
    return img.get("url", "") if isinstance(img, Mapping) else img


def is_image_part(part: Any) -> bool:
    """True for an `image_url` / `input_image` content part."""
    return isinstance(part, Mapping) and part.get("type") in ("image_url", "input_image")


def load_url(url: str, *, folder: str | Path | None = None, lookup: Any = None) -> Image:
    """The image a part's URL names (see the module docstring). `folder`: the folder file URLs
    may read from (None: file URLs are refused). `lookup(digest) -> Image | None` finds a
    `rowgrove-media:` image that is not in this process's cache (the ledger). MediaError names
    what is wrong and the fix."""
    if url.startswith("data:"):
        if "," not in url:
            raise MediaError("the data URL has no ',' before its payload: send data:image/png;base64,<bytes>")
        head, payload = url.split(",", 1)
        mime = head[5:].split(";", 1)[0] or None
        if mime is not None and not mime.startswith("image/"):
            raise MediaError(f"the data URL's type is {mime!r}, not an image: send data:image/png;base64,...")
        if not head.endswith(";base64"):
            raise MediaError("the image's data URL is not base64: send data:image/png;base64,<bytes>")
        if len(payload) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
            raise MediaError(f"the image is more than the {MAX_IMAGE_BYTES} bytes allowed: send a smaller one")
        try:
            data = base64.b64decode(payload)
        except (binascii.Error, ValueError) as e:
            raise MediaError(f"the image's data URL is not valid base64 ({e}): send the file's bytes base64-encoded") from None
        return decode_image(data, mime)
    if url.startswith(MEDIA_SCHEME):
        digest = url[len(MEDIA_SCHEME):]
        img = known(digest) or (lookup(digest) if lookup is not None else None)
        if img is None:
            raise MediaError(f"no image {digest!r} is stored in this ledger: send the image's bytes as a data: URL")
        return img
    if url.startswith("file:"):
        return decode_image(read_file_url(url, folder))
    scheme = urlparse(url).scheme or "no scheme"
    raise MediaError(f"images by {scheme} URL cannot be fetched by this server: send the bytes as "
                     "data:image/png;base64,... (or a file:// URL inside the folder given to --media-folder)")


def read_file_url(url: str, folder: str | Path | None) -> bytes:
    """The bytes of a `file://` URL inside `folder`; MediaError when no folder is allowed, the
    path leaves it (after resolving links and `..`) or the file cannot be read."""
    if folder is None:
        raise MediaError("file:// image URLs are refused: start the server with --media-folder DIR to allow "
                         "files inside DIR, or send the bytes as a data: URL")
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise MediaError(f"file URL host {parsed.netloc!r} is not this machine: use file:///absolute/path")
    root = Path(folder).resolve()
    path = Path(unquote(parsed.path)).resolve()
    if not path.is_relative_to(root):
        raise MediaError(f"{path} is outside the allowed media folder {root}: put the image inside it")
    try:
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise MediaError(f"{path} is {size} bytes, more than the {MAX_IMAGE_BYTES} allowed")
        return path.read_bytes()
    except OSError as e:
        raise MediaError(f"cannot read {path} ({e.strerror or e}): check the path") from None


def digest_of_url(url: str) -> str | None:
    """The pixel digest of a `data:` or `rowgrove-media:` URL when it names a readable image,
    else None (the caller then identifies the part by its bytes or text). Never raises."""
    if url.startswith(MEDIA_SCHEME):
        return url[len(MEDIA_SCHEME):]
    if not url.startswith("data:image/"):
        return None
    try:
        return load_url(url).digest
    except MediaError:
        return None


def media_url(digest: str) -> str:
    """The `rowgrove-media:` URL of a stored image."""
    return MEDIA_SCHEME + digest


def with_refs(messages: list[Any], refs: Mapping[tuple[int, int], str]) -> list[Any]:
    """`messages` with the image parts at (message, part) positions in `refs` pointing at the
    stored image `refs[pos]` (a `rowgrove-media:` URL); the other messages are the same objects."""
    out = list(messages)
    for (i, k), digest in refs.items():
        msg = dict(out[i]) if out[i] is messages[i] else out[i]
        parts = list(msg["content"])
        part = dict(parts[k])
        part["image_url"] = {"url": media_url(digest)}
        parts[k] = part
        msg["content"] = parts
        out[i] = msg
    return out


def image_positions(messages: Any) -> list[tuple[int, int, str]]:
    """(message index, part index, url) of every image part, in order. Skips what is not a
    message or a part (validation reports those)."""
    out: list[tuple[int, int, str]] = []
    if not isinstance(messages, list):
        return out
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            for k, part in enumerate(content):
                if is_image_part(part):
                    url = part_url(part)
                    out.append((i, k, url if isinstance(url, str) else ""))
    return out


__all__ = ["MEDIA_SCHEME", "Image", "MediaError", "decode_image", "digest_of_url", "image_positions",
           "is_image_part", "known", "load_url", "media_url", "pixel_digest", "read_file_url", "remember",
           "with_refs"]
