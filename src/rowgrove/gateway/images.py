"""Images at the gateway's edge: reading a request's image parts once, before `decide` (400 naming
the message and part when one cannot be used), into the `RequestImages` the decision and rendering
core reads (`gateway.core` never reads an image URL itself), and the served model's `Vision`.

The kept-image rule. A request that extends a call's conversation with the same text, the same
tool calls and images at the same places, but with different pixels in one of the images the
parent saw, is neither a continuation (the parent's tokens would claim pixels the model never
saw) nor silently a new root (the harness meant to continue and would never learn why its rollout
split): it is refused, naming the first message and part whose pixels changed. Dropping images
(compaction) changes the conversation's shape and is an ordinary rewrite: a new root.

The evidence is a second, image-blind chain hash (`hashing.blind_chain`: each image part hashed as
"an image" without its pixels) kept only for calls whose request carried images, so text-only
traffic pays nothing; the check itself is `core.decide.RolloutIndex.check_kept_images`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rowgrove.errors import BadRequest
from rowgrove.gateway.core.messages import RequestImages
from rowgrove.hashing import blind_chain, blind_message_hash, chain_step
from rowgrove.media import MEDIA_SCHEME, MediaError, image_positions, load_url, media_url, with_refs

if TYPE_CHECKING:
    from rowgrove.media import Image


def load_request_images(messages: list[Any], *, folder: Any = None,
                        lookup: Any = None) -> tuple[list[Any], RequestImages]:
    """The edge's one pass over a request's image parts: (messages with file:// image URLs replaced
    by their stored-image reference, the request's images with the pixel digest each part names).
    BadRequest naming `messages[i].content[k]` for an image that is malformed, too large, not an
    image, or a file outside the allowed folder."""
    images: list[Image] = []
    digests: dict[tuple[int, int], str | None] = {}
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
            url = media_url(img.digest)
        digests[(i, k)] = _named_digest(url, img)
    return (with_refs(messages, refs) if refs else messages), RequestImages(images, digests)


def _named_digest(url: str, img: Image) -> str | None:
    """The pixel digest `digest_of_url(url)` gives for a URL that `load_url` read as `img`, without
    decoding it again: the reference's own digest, the image's for a `data:image/` URL, None for
    another URL (a data URL without an image type names no image)."""
    if url.startswith(MEDIA_SCHEME):
        return url[len(MEDIA_SCHEME):]
    return img.digest if url.startswith("data:image/") else None


def blind_summary(messages: Sequence[Mapping[str, Any]], h0: bytes, response_digest: bytes) -> str:
    """A completed call's image-blind summary: its request's blind chain extended by its response."""
    return chain_step(blind_chain(messages, h0), response_digest).hex()


__all__ = ["RequestImages", "blind_chain", "blind_message_hash", "blind_summary", "load_request_images"]


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
