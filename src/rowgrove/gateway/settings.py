"""The gateway's settings and the small pure decisions made from them at start-up: which tool and
reasoning parsers a chat template gets, whether a host is loopback, how long a context the
model takes. Split from `sessions` (the life of a call), which re-exports these names."""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass
from typing import Any

from rowgrove.errors import BadRequest, InputError, Unavailable
from rowgrove.parsers import detect_reasoning_parser, detect_tool_parser

MiB = 1 << 20
MAX_JSON_DEPTH = 200  # the most `max_json_depth` may be: stored JSON (orjson) nests at most 254 deep


@dataclass(frozen=True)
class GatewaySettings:
    """How the gateway serves; `rowgrove serve` fills it from its flags. InputError for a value
    that cannot work (a limit below 1, a public URL that is not http(s), a trusted proxy that is
    not an address or network)."""

    admin_key: str | None = None       # when set, control routes need it (or the rollout's own key)
    max_body_bytes: int = 32 * MiB     # larger request bodies get 413
    max_queue: int = 256               # most generations in flight at once; beyond: 429
    engine_timeout: float = 600.0      # seconds one generation may take; beyond: 504, call failed
    retry_after: float = 1.0           # the Retry-After hint (seconds) sent with 429/503
    default_max_tokens: int = 1024     # max_tokens when the request names none
    tool_parser: str | None = None     # how sampled tool calls are read (vLLM's names); None: from the template
    reasoning_parser: str | None = None  # how sampled reasoning is split off; None: from the template
    max_json_depth: int = 64           # request JSON nested deeper gets 400 before anything else
    body_timeout: float = 30.0         # seconds a request body may take to arrive; beyond: 408
    max_open_uploads: int = 256        # most requests whose body is still being read; beyond: 503
    public_url: str | None = None      # base of every base_url; None: http://{bound host}:{port}
    trusted_proxies: tuple[str, ...] = ()  # peers (addresses or networks) whose X-Forwarded-For is believed
    model_name: str | None = None      # the model GET /v1/models lists; None: the engine's, else "rowgrove"
    gc_freeze: bool = True             # freeze start-up objects out of the collector (tail latency, see app.py)
    hold_freed_memory: bool = True     # `serve`: glibc keeps freed large blocks for reuse (server.hold_freed_memory)
    media_folder: str | None = None    # file:// image URLs are read only inside this folder; None: refused
    hosted_tools: str = "drop"         # hosted tools (web_search, ...): "drop" leaves them out, "refuse" answers 400

    def __post_init__(self) -> None:
        if self.hosted_tools not in ("drop", "refuse"):
            raise InputError(f"--hosted-tools must be drop or refuse, got {self.hosted_tools!r}")
        for name in ("max_body_bytes", "max_queue", "max_open_uploads", "default_max_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}")
        if not 1 <= self.max_json_depth <= MAX_JSON_DEPTH:
            raise InputError(f"{_flag('max_json_depth')} must be in [1, {MAX_JSON_DEPTH}], got {self.max_json_depth}")
        for name in ("engine_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise InputError(f"{_flag(name)} must be a number of seconds > 0, got {getattr(self, name)}")
        if self.public_url is not None:
            url = self.public_url
            if not (url.startswith(("http://", "https://")) and len(url.split("://", 1)[1].strip("/")) > 0):
                raise InputError(f"{_flag('public_url')} must be an http:// or https:// URL such as "
                                 f"http://gw.example:8000, got {url!r}")
        if isinstance(self.trusted_proxies, str):
            object.__setattr__(self, "trusted_proxies", (self.trusted_proxies,))
        elif not isinstance(self.trusted_proxies, tuple):
            object.__setattr__(self, "trusted_proxies", tuple(self.trusted_proxies))
        for p in self.trusted_proxies:
            try:
                ipaddress.ip_network(p, strict=False)
            except ValueError:
                raise InputError(f"trusted proxy {p!r} (--trusted-proxy) is not an IP address or network "
                                 "(e.g. 10.0.0.5 or 10.0.0.0/24)") from None


def _flag(name: str) -> str:
    """A setting's name with the `rowgrove serve` flag that sets it, for error messages."""
    flag = {"default_max_tokens": "--max-tokens"}.get(name, "--" + name.replace("_", "-"))
    return f"{name} ({flag})"


class BodyTooLarge(BadRequest):
    """The request body is over `max_body_bytes` (413)."""


class BodyTimeout(BadRequest):
    """The request body did not arrive within `body_timeout` seconds (408)."""


class TooManyUploads(Unavailable):
    """`max_open_uploads` requests are already sending their bodies (503 with Retry-After)."""


def choose_parsers(chat_template: str, settings: GatewaySettings) -> tuple[str | None, str | None]:
    """(tool parser, reasoning parser): the settings' names, "none" for none, or (None given)
    detected from the chat template. InputError for a name rowgrove does not know."""
    from rowgrove.errors import InputError
    from rowgrove.parsers import REASONING_PARSERS, TOOL_PARSERS

    out = []
    for given, known, detect, flag in (
            (settings.tool_parser, TOOL_PARSERS, detect_tool_parser, "--tool-parser"),
            (settings.reasoning_parser, REASONING_PARSERS, detect_reasoning_parser, "--reasoning-parser")):
        if given is None:
            out.append(detect(chat_template))
        elif given == "none":
            out.append(None)
        elif given in known:
            out.append(given)
        else:
            raise InputError(f"{flag} {given!r} is not a parser rowgrove knows: use one of {', '.join(known)} or none")
    return out[0], out[1]


_LOOPBACK_CACHE: dict[str, bool] = {}


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback addresses."""
    if not host:
        return False
    hit = _LOOPBACK_CACHE.get(host)
    if hit is None:
        try:
            addr = ipaddress.ip_address(host)
            mapped = getattr(addr, "ipv4_mapped", None)
            hit = bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))
        except ValueError:
            hit = False
        if len(_LOOPBACK_CACHE) < 4096:
            _LOOPBACK_CACHE[host] = hit
    return hit


def model_context_length(tokenizer: Any, engine: Any) -> int | None:
    """The most tokens the model attends to: the engine's `max_context` when it has one, else
    `max_position_embeddings` (or `max_seq_len`, `n_positions`) of the model folder's config.json;
    None when unknown (no cap)."""
    given = getattr(engine, "max_context", None)
    if isinstance(given, int) and given > 0:
        return given
    import json
    from pathlib import Path

    folder = getattr(engine, "model_path", None) or getattr(tokenizer, "name_or_path", None)
    path = Path(str(folder)) / "config.json" if folder else None
    if path is None or not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None, cfg):
        for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
            v = c.get(key) if c else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None
