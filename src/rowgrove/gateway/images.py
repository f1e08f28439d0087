"""Images at the gateway: reading a request's image parts (400 naming the message and part when one
cannot be used), the parts as a vision template sees them, and the check that a continuation kept
its parent's images.

The kept-image rule. A request that extends a call's conversation with the same text, the same
tool calls and images at the same places, but with different pixels in one of the images the
parent saw, is neither a continuation (the parent's tokens would claim pixels the model never
saw) nor silently a new root (the harness meant to continue and would never learn why its rollout
split): it is refused, naming the first message and part whose pixels changed. Dropping images
(compaction) changes the conversation's shape and is an ordinary rewrite: a new root.

The evidence is a second, image-blind chain hash (each image part hashed as "an image" without its
pixels) kept only for calls whose request carried images, so text-only traffic pays nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from rowgrove.errors import BadRequest
from rowgrove.hashing import canonical_message, chain_step
from rowgrove.media import MediaError, digest_of_url, image_positions, is_image_part, load_url, part_url, with_refs

if TYPE_CHECKING:
    from rowgrove.media import Image

_TEXT_PARTS = ("text", "input_text", "output_text")


def media_content(content: Sequence[Any], index: int) -> list[dict[str, Any]]:
    """A content list with images as a vision template takes it: text parts `{"type": "text",
    "text": ...}`, image parts `{"type": "image", "image": <pixel digest>}` (the template writes a
    placeholder; the digest tells the renderer which image it stands for)."""
    out: list[dict[str, Any]] = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS:
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"messages[{index}].content[{k}]: a {kind} part needs a string", param="messages")
            out.append({"type": "text", "text": text})
        elif is_image_part(part):
            url = part_url(part)
            digest = digest_of_url(url) if isinstance(url, str) else None
            if digest is None:
                raise BadRequest(f"messages[{index}].content[{k}]: the image could not be read: send "
                                 "data:image/png;base64,...", param="messages")
            out.append({"type": "image", "image": digest})
        else:
            raise BadRequest(
                f"messages[{index}].content[{k}]: parts of type {kind!r} cannot be rendered by this model's "
                "chat template (text and image parts only)", param="messages")
    return out


def load_request_images(messages: list[Any], *, folder: Any = None, lookup: Any = None) -> tuple[list[Any], list[Image]]:
    """(messages with file:// image URLs replaced by their stored-image reference, the request's
    images in order). BadRequest naming `messages[i].content[k]` for an image that is malformed,
    too large, not an image, or a file outside the allowed folder."""
    images: list[Image] = []
    refs: dict[tuple[int, int], str] = {}
    for i, k, url in image_positions(messages):
        try:
            if not url:
                raise MediaError('an image part needs {"image_url": {"url": "data:image/png;base64,..."}}')
            img = load_url(url, folder=folder, lookup=lookup)
        except MediaError as e:
            raise BadRequest(f"messages[{i}].content[{k}]: {e}", param="messages") from None
        images.append(img)
        if url.startswith("file:"):
            refs[(i, k)] = img.digest
    return (with_refs(messages, refs) if refs else messages), images


def blind_message_hash(msg: Mapping[str, Any]) -> bytes:
    """The message's hash with each image part counted without its pixels."""
    import hashlib

    c = canonical_message(msg)
    content = c.get("content")
    if isinstance(content, list):
        c["content"] = [{"type": "image"} if isinstance(p, dict) and p.get("type") == "image" else p for p in content]
    return hashlib.sha256(orjson.dumps(c, option=orjson.OPT_SORT_KEYS)).digest()[:16]


def blind_chain(messages: Sequence[Mapping[str, Any]], h0: bytes) -> bytes:
    """The image-blind chain hash of `messages` after `h0`."""
    h = h0
    for m in messages:
        h = chain_step(h, blind_message_hash(m))
    return h


def blind_summary(messages: Sequence[Mapping[str, Any]], h0: bytes, response_digest: bytes) -> str:
    """A completed call's image-blind summary: its request's blind chain extended by its response."""
    return chain_step(blind_chain(messages, h0), response_digest).hex()


def changed_image(messages: Sequence[Any], j: int, parent_id: str,
                  parent_images: Sequence[tuple[int, int, str]]) -> BadRequest | None:
    """The 400 for a request whose messages[:j] match call `parent_id`'s request except for an
    image's pixels (the first such image named), or None when none differs."""
    now = {(i, k): digest_of_url(url) for i, k, url in image_positions(list(messages[:j]))}
    for i, k, digest in parent_images:
        if now.get((i, k)) != digest:
            return BadRequest(
                f"messages[{i}].content[{k}]: this image's pixels differ from those call {parent_id} saw at this "
                "place in the conversation, which this request otherwise continues: send the kept image "
                "unchanged (re-encoding the same pixels is fine), or drop old images to start a new root",
                param="messages", code="image_changed")
    return None


__all__ = ["blind_chain", "blind_message_hash", "blind_summary", "changed_image", "load_request_images",
           "media_content"]


def prepared_images(prepared: Sequence[Mapping[str, Any]]) -> list[Image]:
    """The images of prepared messages (`media_content`), in order, from the decoded-image cache."""
    from rowgrove.media import known

    out: list[Image] = []
    for m in prepared:
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "image":
                    img = known(part["image"])
                    if img is None:
                        raise BadRequest("an image of this request was evicted from the decoded-image cache "
                                         "while it was rendered: send fewer images per request", param="messages")
                    out.append(img)
    return out


def gateway_vision(tokenizer: Any, ledger: Any, folder: Any) -> Any:
    """The `Vision` of the served model when its folder is a vision model (else None), reading
    stored images back from `ledger`."""
    from pathlib import Path

    from rowgrove.model.vision import Vision, is_vision_model, load_processor

    name = getattr(tokenizer, "name_or_path", None)
    if not name or not Path(str(name)).is_dir() or not is_vision_model(name):
        return None
    return Vision(load_processor(name, tokenizer), folder=folder, lookup=lambda d: stored_image(ledger, d))


def stored_image(ledger: Any, digest: str) -> Image | None:
    """The image `digest` as the ledger stores it (and now known to this process), or None."""
    from rowgrove.media import Image, remember

    rec = ledger.get_image_record(digest)
    if rec is None:
        return None
    mime, width, height, data, _ = rec
    img = Image(digest, width, height, mime, data)
    remember(img)
    return img


def store_record_images(record: Any, ledger: Any, processor: Any = None, *, folder: Any = None) -> Any:
    """A finished rollout's record with every readable inline image stored in the ledger (once)
    and replaced by its `rowgrove-media:` reference, so the record holds no image bytes."""
    from rowgrove.media import Image

    def convs(rec: Any) -> list[list[Any]]:
        return [rec["messages"]] if "messages" in rec else list(rec.get("conversations") or ())

    out = dict(record)
    new: list[list[Any]] = []
    found: list[Image] = []
    for conv in convs(record):
        refs: dict[tuple[int, int], str] = {}
        for i, k, url in image_positions(conv):
            if url.startswith(("data:image/", "file:")):
                try:
                    img = load_url(url, folder=folder)
                except MediaError:
                    continue
                found.append(img)
                refs[(i, k)] = img.digest
        new.append(with_refs(conv, refs) if refs else conv)
    if not found:
        return record
    ledger.put_images(found, processor)
    if "messages" in record:
        out["messages"] = new[0]
    else:
        out["conversations"] = new
    return out
