"""`GET/POST /v1/weights`: the version new tokens are sampled under, a checkpoint folder loaded
into the engine (a local engine reads it; a server engine tells the servers to), and a version
announced by a trainer that pushed the weights to the servers itself."""

from __future__ import annotations

import httpx
import pytest
import torch
from safetensors.torch import save_file

from rowgrove.engines import make_engine
from rowgrove.gateway.testing import start_gateway
from rowgrove.standins import start_standin


def _checkpoint(model, folder, scale: float = 0.5):
    folder.mkdir(parents=True)
    sd = {k: (v.detach() * scale).contiguous().clone() for k, v in model.state_dict().items()}
    save_file(sd, str(folder / "model.safetensors"))
    return sd


def test_a_local_engine_loads_a_checkpoint_and_versions_move(tmp_path):
    with start_gateway("tiny", engine="scripted") as gw:
        assert gw.get("/v1/weights") == {"weights_version": 0, "engine": "ScriptedEngine"}
        sd = _checkpoint(gw.engine.model, tmp_path / "ck")
        r = httpx.post(f"{gw.url}/v1/weights", json={"path": str(tmp_path / "ck")})
        assert r.status_code == 200 and r.json()["weights_version"] == 1
        name = next(iter(sd))
        assert torch.equal(gw.engine.model.state_dict()[name], sd[name])
        # a call after the update records version 1 on every sampled token
        ro = gw.create_rollout("g")
        from openai import OpenAI

        c = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"])
        reply = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        call = gw.ledger.get_call(reply.id)
        assert set(call.weight_versions.tolist()) == {1}
        # announced versions only move forward
        assert httpx.post(f"{gw.url}/v1/weights", json={"version": 7}).json()["weights_version"] == 7
        bad = httpx.post(f"{gw.url}/v1/weights", json={"version": 3})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "version"


@pytest.mark.parametrize("body", [{}, {"path": "x", "version": 1}, {"version": True}, {"version": "2"},
                                  {"path": ""}, [1, 2]])
def test_bad_bodies_are_400(body):
    with start_gateway("tiny", engine="scripted") as gw:
        r = httpx.post(f"{gw.url}/v1/weights", json=body)
        assert r.status_code == 400 and "error" in r.json()
        assert gw.get("/v1/weights")["weights_version"] == 0


def test_a_folder_without_safetensors_is_400(tmp_path):
    with start_gateway("tiny", engine="scripted") as gw:
        r = httpx.post(f"{gw.url}/v1/weights", json={"path": str(tmp_path)})
        assert r.status_code == 400 and "safetensors" in r.json()["error"]["message"]


def test_a_server_engine_has_the_servers_load_the_folder(tmp_path):
    with start_standin("vllm", "tiny") as server:
        engine = make_engine("vllm", "tiny", url=server.url)
        with start_gateway("tiny", engine=engine) as gw:
            _checkpoint(server.engine.model, tmp_path / "ck")
            r = httpx.post(f"{gw.url}/v1/weights", json={"path": str(tmp_path / "ck")})
            assert r.status_code == 200 and r.json() == {"weights_version": 1, "engine": "vllm"}
        loads = server.log()["weight_loads"]
        assert len(loads) == 1 and str(tmp_path / "ck") in str(loads[0])
