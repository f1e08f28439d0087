"""Keep the engine behind a rowgrove gateway on a trainer's weights, through the gateway's own
weight route, and prove it before the next rollouts are sampled.

    trainer's state dict ──► write_checkpoint into SYNC_DIR/vNNNNNN    (a folder trainer and gateway
                             (rowgrove.engines.remote, the one          both read; the two newest kept)
                              checkpoint writer rowgrove has)
                         ──► POST {gateway}/v1/weights {"path": ...}    the gateway's engine loads it:
                                                                        hf copies the tensors in; vLLM /
                                                                        SGLang reload, and the gateway
                                                                        checks each server's probe
                                                                        logprobs against the folder
                                                                        (rowgrove.engines.verify)
                         ──► probe: one short call through the gateway (its own rollout, group
                             `PROBE_GROUP`), its row read back, and the engine's logprob of every
                             sampled token compared with the trainer's own on the same ids
                             (`reference`), within `tolerance`; every sampled token must carry
                             the new weight version

The probe closes the loop the route alone leaves open: it checks what the gateway samples
with, for every engine (the hf engine's route has no server to check), against the logprobs the
trainer computes its ratio from. Any failure raises `WeightSyncError` (a RowgroveError) naming
what failed and how to fix it, so a trainer stops instead of going on off-policy.

Where the trainer moves the weights into the servers itself (TRL's own vLLM server over NCCL),
`announce` records the new version on the gateway (`POST /v1/weights {"version": N}`) and
`verify` runs the same probe.

A PEFT model (LoRA and the other adapters that merge) is synced as the weights its forward pass
computes with: `engine_weights` merges the adapters into the base weights for the write and
unmerges them after, under the base model's own names, as TRL does for its vLLM server
(trl/generation/vllm_generation.py, `_iter_named_params`): an engine serves the base
architecture and would refuse adapter tensors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from rowgrove.engines.verify import WeightSyncError, largest_difference, sync_tolerance

# The group every probe rollout is created in, so that nobody mistakes it for training data.
PROBE_GROUP = "rowgrove-weight-sync-probe"
PROBE_MAX_TOKENS = 16

Reference = Callable[[Sequence[int]], Sequence[float]]


@dataclass(frozen=True)
class SyncRecord:
    """One verified sync: the weight version the gateway now samples with, the largest |engine -
    trainer| logprob over the probe's sampled tokens, how many tokens that was, and the seconds
    the whole sync (write, load, probe) took."""

    version: int
    gap: float
    probe_tokens: int
    seconds: float


class GatewaySync:
    """The weight path from a trainer to the engine behind the gateway at `gateway_url`.

    `sync_dir`: the folder checkpoints are written to; the gateway must read it under the same
    path (same machine, or a shared filesystem). `tolerance`: the largest logprob difference the
    probe accepts (default `rowgrove.engines.verify.sync_tolerance()`: 1e-3, or
    $ROWGROVE_SYNC_TOLERANCE). `admin_key`: the gateway's admin key, when it has one.
    """

    def __init__(self, gateway_url: str, sync_dir: str | Path, *, tolerance: float | None = None,
                 admin_key: str | None = None, timeout: float = 600.0):
        self.url = gateway_url.rstrip("/")
        self.sync_dir = Path(sync_dir)
        self.tolerance = sync_tolerance(tolerance)
        self.headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.timeout = timeout

    # ---- the gateway's weight route --------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None, *, key: str | None = None,
                 what: str) -> dict[str, Any]:
        """One request; WeightSyncError naming `what` when it fails or answers an error."""
        url = path if path.startswith("http") else f"{self.url}{path}"
        headers = {"authorization": f"Bearer {key}"} if key else self.headers
        try:
            r = httpx.request(method, url, json=body, headers=headers, timeout=self.timeout)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"{what}: {method} {url} failed ({type(e).__name__}: {e}); is the gateway "
                                  "running at that address? Training stops rather than go on off-policy") from None
        if r.status_code >= 400:
            try:
                detail = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                detail = r.text[:500]
            raise WeightSyncError(f"{what}: {method} {url} answered {r.status_code}: {detail}. Training stops "
                                  "rather than go on off-policy")
        return dict(r.json())

    def version(self) -> int:
        """The weight version the gateway's engine samples with now (`GET /v1/weights`)."""
        return int(self._request("GET", "/v1/weights", what="reading the gateway's weight version")["weights_version"])

    def push(self, state_dict: Mapping[str, Any], config: Any) -> int:
        """Write `state_dict` as a checkpoint (with `config`, a transformers PretrainedConfig, as
        its config.json) under `sync_dir` and have the gateway's engine load it. Returns the new
        version; WeightSyncError when the route fails or the version did not move."""
        from rowgrove.engines.remote import prune_checkpoints, write_checkpoint
        from rowgrove.engines.verify import with_tied_head

        before = self.version()
        meta = self.sync_dir / "config"
        if not (meta / "config.json").is_file():
            meta.mkdir(parents=True, exist_ok=True)
            config.to_json_file(str(meta / "config.json"))
        folder = write_checkpoint(with_tied_head(state_dict, meta / "config.json"),
                                  self.sync_dir / f"v{before + 1:06d}", meta)
        got = self._request("POST", "/v1/weights", {"path": str(folder.resolve())},
                            what=f"loading the trainer's weights from {folder} into the gateway's engine")
        after = int(got["weights_version"])
        if after <= before:
            raise WeightSyncError(f"the gateway's engine ({got.get('engine')}) answered the weight update from "
                                  f"{folder} but its version stayed {after}: it did not load the weights. Serve an "
                                  "engine that loads checkpoints (hf, vllm, sglang)")
        prune_checkpoints(self.sync_dir, keep=2)
        return after

    def announce(self) -> int:
        """Record on the gateway that the trainer moved the weights into its servers itself
        (`POST /v1/weights {"version": N}`, N = the current version + 1); returns N."""
        got = self._request("POST", "/v1/weights", {"version": self.version() + 1},
                            what="announcing the new weight version to the gateway")
        return int(got["weights_version"])

    # ---- the probe ----------------------------------------------------------------------------

    def verify(self, reference: Reference, version: int, *, note: str = "") -> tuple[float, int]:
        """One call through the gateway, in a rollout of its own (group `PROBE_GROUP`); its row's
        engine logprobs at the sampled tokens against `reference(ids)` (the trainer's log p of
        ids[1:]). Returns (largest difference, tokens compared); WeightSyncError when it exceeds
        the tolerance, when a sampled token carries another version than `version`, or when the
        probe cannot be run."""
        from rowgrove.assemble.io import row_from_json
        from rowgrove.engines.remote import PROBE_MESSAGES

        what = f"verifying weight version {version} with a probe call"
        created = self._request("POST", "/v1/rollouts", {"group_id": PROBE_GROUP,
                                                          "metadata": {"purpose": "weight-sync probe",
                                                                       "version": version, "note": note}}, what=what)
        base, key, rid = created["base_url"], created["api_key"], created["rollout_id"]
        base = self.url + base if base.startswith("/") else base
        messages = [dict(m) for m in PROBE_MESSAGES]
        answer = self._request("POST", f"{base}/chat/completions",
                               {"model": "policy", "messages": messages, "max_tokens": PROBE_MAX_TOKENS,
                                "temperature": 1.0}, key=key, what=what)
        reply = answer["choices"][0]["message"]
        self._request("POST", f"/v1/rollouts/{rid}/finish", {"messages": [*messages, reply], "reward": 0.0},
                      key=key, what=what)
        rows = [row_from_json(r) for r in self._request("GET", f"/v1/rollouts/{rid}/rows", key=key, what=what)["rows"]]
        if len(rows) != 1 or rows[0].logprobs is None:
            raise WeightSyncError(f"{what}: the probe rollout {rid} gave {len(rows)} rows "
                                  f"({json.dumps([r.mask_reason for r in rows])}), not one row with logprobs")
        row = rows[0]
        ids = [int(t) for t in row.input_ids]
        sampled = np.flatnonzero(np.asarray(row.loss_mask) == 1)
        if len(sampled) == 0 or sampled[0] == 0:
            raise WeightSyncError(f"{what}: the probe rollout {rid} has no sampled token after a prompt")
        if row.weight_versions is not None:
            seen = sorted({int(row.weight_versions[t]) for t in sampled})
            if seen != [version]:
                raise WeightSyncError(f"{what}: the probe's tokens were sampled under weight version(s) {seen}, not "
                                      f"{version}: the gateway's engine did not switch to the new weights")
        ref = list(reference(ids))
        expected = [float(ref[t - 1]) for t in sampled]
        got = [float(row.logprobs[t]) for t in sampled]
        worst, at = largest_difference(expected, got)
        if worst > self.tolerance:
            raise WeightSyncError(
                f"the gateway's engine samples with other weights than the trainer after weight version {version}: "
                f"on the probe's {len(sampled)} sampled tokens its logprobs differ from the trainer's by up to "
                f"{worst:.3g} (token {at}; tolerance {self.tolerance:g}). The engine did not load what the trainer "
                "wrote, or computes in another precision: check that the gateway serves the trainer's model "
                "folder in the trainer's dtype; raise the tolerance (sync_tolerance, $ROWGROVE_SYNC_TOLERANCE) "
                "only for a lower-precision engine. Training stops rather than go on off-policy")
        return worst, len(sampled)

    def sync(self, state_dict: Mapping[str, Any], config: Any, reference: Reference, *, note: str = "") -> SyncRecord:
        """`push` then `verify`: the gateway's engine samples with `state_dict`, checked."""
        t0 = time.perf_counter()
        version = self.push(state_dict, config)
        gap, n = self.verify(reference, version, note=note)
        return SyncRecord(version=version, gap=gap, probe_tokens=n, seconds=time.perf_counter() - t0)


def is_peft_model(model: Any) -> bool:
    """A PEFT model (peft.PeftModel and its task subclasses), told without importing peft."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


@contextmanager
def engine_weights(model: Any) -> Iterator[dict[str, Any]]:
    """The state dict an engine loads for `model`, for the duration of the block: a plain model's
    own; a PEFT model's adapters merged into the base weights (unmerged when the block ends, even
    on error), under the base model's names, adapter tensors and `modules_to_save` originals left
    out. The tensors share storage with the model: write them before the block ends."""
    if not is_peft_model(model):
        yield model.state_dict()
        return
    adapters = ", ".join(f"{name}: {getattr(cfg, 'peft_type', '?')}" for name, cfg in model.peft_config.items())
    if getattr(model, "active_peft_config", None) is not None and model.active_peft_config.is_prompt_learning:
        raise WeightSyncError(f"the trainer's PEFT adapter ({adapters}) "
                              "is prompt learning: it adds virtual tokens an engine serving the base model cannot "
                              "hold. Train a LoRA-family adapter (they merge into the weights) to keep the "
                              "gateway's engine on the trainer's policy")
    try:
        model.merge_adapter()
    except Exception as e:  # noqa: BLE001 - peft raises several types; each becomes one clear error
        raise WeightSyncError(f"could not merge the trainer's PEFT adapters ({adapters}) into its weights for the "
                              f"gateway's engine: {e}. Train an adapter type peft can merge (LoRA-family)") from e
    try:
        prefix = getattr(model, "prefix", None) or "lora_"
        out: dict[str, Any] = {}
        for name, tensor in model.state_dict().items():
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            if prefix in name or "original_module" in name:
                continue
            out[name.replace("modules_to_save.default.", "")] = tensor
        yield out
    finally:
        model.unmerge_adapter()


__all__ = ["PROBE_GROUP", "GatewaySync", "SyncRecord", "engine_weights", "is_peft_model"]
