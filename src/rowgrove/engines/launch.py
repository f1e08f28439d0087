"""Start a real `vllm serve` for rowgrove: the flags and environment it needs, in one place.

The tests marked `vllm`, `scripts/gpu_check.sh` and `bench/bench_remote.py` all start their servers
through `start_vllm`, so the first run on a GPU exercises the command line the CPU suite proved.

    with start_vllm(model_folder, python=".venv-stack-vllm/bin/python") as server:
        engine = make_engine("vllm", model_folder, url=server.url)

What the command line holds and why (docs/engines.md, "Starting vLLM"):

- `--logprobs-mode raw_logprobs`: logprobs of the raw logits (temperature 1, before top-k/top-p),
  what the trainer's importance ratio compares against (vLLM's default, named so nobody changes it);
- `--generation-config vllm`: no sampling defaults from generation_config.json (rowgrove sends
  every sampling parameter anyway);
- `--dtype float32` on CPU (the trainer's dtype, so logprobs compare exactly), `--enforce-eager`
  on CPU (torch.compile doubles start-up to 45-100 s for no gain on a tiny model);
- environment `VLLM_SERVER_DEV_MODE=1`: the weight-sync routes (`/pause`, `/collective_rpc`,
  `/reset_prefix_cache`, `/update_weight_version`, `/resume`) are development routes;
- on CPU: `VLLM_TARGET_DEVICE=cpu`, `VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache), a writable
  `VLLM_CACHE_ROOT`, `HF_HUB_OFFLINE=1` (the model is a local folder; nothing is downloaded);
- on CPU, once it answers: the engine-core and worker processes (every thread) reniced to
  `engine_nice` (default 19). Between steps they busy-poll their shared-memory queues
  (vllm/distributed/device_communicators/shm_broadcast.py, `SpinCondition`: `sched_yield()` in a
  loop for 1 s after each message), so on a machine with few cores they keep every core runnable
  and whatever else is on the request path (vLLM's own API server, the gateway, the client) waits
  on the run queue for each wake-up: on 2 cores the gateway process spent 5.1 s of a 6.1 s run
  waiting for a CPU to do 0.4 s of work, vLLM saw ~2 requests per step instead of ~30, and the
  gateway's throughput at 32 concurrent rollouts fell to a fifth of calling vLLM directly
  (docs/engines.md, "bench_remote"). At nice 19 the spinning gives way to any waking process and
  the forward passes still run whenever nothing else wants the core. The API server keeps the
  caller's priority (it is on every request's path).

The server runs in its own process group and `stop()` ends that group (the engine core is a child
process of the API server), so nothing outlives the `with` block.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rowgrove.errors import EngineError

# The flags every rowgrove-driven vLLM gets (see the module docstring for why each one).
BASE_FLAGS = ("--logprobs-mode", "raw_logprobs", "--generation-config", "vllm")
CPU_FLAGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "4096")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_vllm_python() -> Path | None:
    """The python of the environment vLLM is installed in: $ROWGROVE_VLLM_PYTHON, else the
    checkout's `.venv-stack-vllm/bin/python` (scripts/install_vllm_env.sh: vLLM and rowgrove in one
    environment), else an older checkout's `.venv-vllm/bin/python`, else None."""
    env = os.environ.get("ROWGROVE_VLLM_PYTHON")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[3]
    for folder in (".venv-stack-vllm", ".venv-vllm"):
        here = root / folder / "bin" / "python"
        if here.is_file():
            return here
    return None


def vllm_env(*, device: str = "cpu", cache_root: str | Path | None = None, kv_cache_gib: int = 1,
             omp_threads: int | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a `vllm serve` rowgrove drives: dev mode (weight routes) everywhere, and
    on CPU the device, KV-cache size, a writable cache root and offline hub."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["VLLM_CACHE_ROOT"] = str(cache_root or Path(tempfile.gettempdir()) / "rowgrove-vllm-cache")
    env.pop("VIRTUAL_ENV", None)
    if device == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
        if omp_threads is not None:
            env["OMP_NUM_THREADS"] = str(omp_threads)
    return env


def vllm_command(python: str | Path, model: str | Path, port: int, *, device: str = "cpu",
                 served_model: str | None = None, extra_args: Sequence[str] = ()) -> list[str]:
    """The `vllm serve` command line rowgrove starts (run with `vllm_env`)."""
    cmd = [str(python), "-m", "vllm.entrypoints.cli.main", "serve", str(model),
           "--host", "127.0.0.1", "--port", str(port), *BASE_FLAGS]
    if device == "cpu":
        cmd += CPU_FLAGS
    if served_model:
        cmd += ["--served-model-name", served_model]
    return cmd + list(extra_args)


@dataclass
class VLLMServer:
    """A running `vllm serve` started by `start_vllm`; `stop()` (or leaving `with`) ends it."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    model: Path
    startup_s: float = 0.0
    engine_pids: tuple[int, ...] = ()  # the processes reniced at start-up (CPU): engine core, worker(s)
    _log: object = field(default=None, repr=False)

    def log_tail(self, n: int = 40) -> str:
        """The last `n` lines of the server's log (start-up errors show here)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """End the server's whole process group: SIGTERM, then SIGKILL after `timeout` seconds."""
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # children of the group that outlived the leader
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def check_cpu_servable(model: str | Path) -> None:
    """Refuse, before a 30 s start-up, a model vLLM's CPU attention cannot run: it takes head_dim
    32..512, and a model outside that starts but kills the engine on its first request
    ("Unsupported CPU attention configuration"). A model that is not a local folder is left to vLLM."""
    config_path = Path(model) / "config.json"
    if not config_path.is_file():
        return
    import json

    try:
        config = json.loads(config_path.read_text())
        text = config.get("text_config") or config
        head_dim = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return  # an unusual config: vLLM reads it itself
    if not 32 <= head_dim <= 512:
        raise EngineError(f"{model}: head_dim {head_dim} (hidden_size / num_attention_heads) is outside 32..512, "
                          "which vLLM's CPU attention needs (the engine dies on the first request); build the "
                          "tiny model with rowgrove.model.tiny.servable_kwargs() (hidden 64, 2 heads) or serve "
                          "it on a GPU (device='cuda')")


def start_vllm(model: str | Path, *, python: str | Path | None = None, port: int | None = None,
               device: str = "cpu", served_model: str | None = None, extra_args: Sequence[str] = (),
               log_path: str | Path | None = None, startup_timeout: float = 240.0,
               env: Mapping[str, str] | None = None, kv_cache_gib: int = 1,
               omp_threads: int | None = None, engine_nice: int | None = None) -> VLLMServer:
    """Start `vllm serve model` on 127.0.0.1 and return once `/health` answers 200.

    `python`: the interpreter of vLLM's environment (default `default_vllm_python()`). `port`:
    default a free one. The server's output goes to `log_path` (default a temporary file).
    `engine_nice`: the niceness the engine-core and worker processes get once the server answers
    (default 19 on CPU, untouched on CUDA; 0 leaves them as started): see the module docstring.
    EngineError (naming the log and its last lines) when vLLM is not installed there, the process
    exits, or `/health` is not 200 within `startup_timeout` seconds; the process is ended then.
    """
    if device == "cpu":
        check_cpu_servable(model)
    python = Path(python) if python is not None else default_vllm_python()
    if python is None or not Path(python).is_file():
        raise EngineError(f"no vLLM environment at {python or '.venv-stack-vllm/bin/python'}: run "
                          "scripts/install_vllm_env.sh, or set ROWGROVE_VLLM_PYTHON to the python of one")
    port = port or free_port()
    log = Path(log_path) if log_path is not None else Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
    cmd = vllm_command(python, model, port, device=device, served_model=served_model, extra_args=extra_args)
    full_env = vllm_env(device=device, kv_cache_gib=kv_cache_gib, omp_threads=omp_threads, base=env)
    handle = open(log, "wb")  # noqa: SIM115 - closed by stop()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    server = VLLMServer(url=f"http://127.0.0.1:{port}", process=proc, log_path=log, model=Path(model), _log=handle)
    deadline = t0 + startup_timeout
    try:
        _wait_healthy(server, deadline, startup_timeout)
    except BaseException:  # a timeout, a failed start, or the caller interrupted: no server left behind
        server.stop()
        raise
    server.startup_s = time.monotonic() - t0
    nice = (19 if device == "cpu" else 0) if engine_nice is None else engine_nice
    if nice > 0:
        server.engine_pids = renice_descendants(proc.pid, nice)
    return server


def descendants(pid: int) -> list[int]:
    """The live descendants of process `pid` (children first), read from /proc ([] where there is
    no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, ())
    return out


def renice_descendants(pid: int, nice: int) -> tuple[int, ...]:
    """Set every thread of every descendant of `pid` to niceness `nice` (Linux keeps a niceness
    per thread; threads started later inherit their creator's). Raising niceness needs no
    privilege. Returns the processes reniced; ones that vanish meanwhile are skipped."""
    done: list[int] = []
    for p in descendants(pid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
            for tid in tids:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except (OSError, ValueError):
            continue
        done.append(p)
    return tuple(done)


def _wait_healthy(server: VLLMServer, deadline: float, startup_timeout: float) -> None:
    """Return once the server's /health is 200; EngineError when it exits or the deadline passes."""
    proc, model, log = server.process, server.model, server.log_path
    with httpx.Client(timeout=2.0) as http:
        while True:
            if proc.poll() is not None:
                raise EngineError(f"vllm serve {model} exited with code {proc.returncode} during start-up "
                                  f"(log {log}):\n{server.log_tail()}")
            try:
                if http.get(f"{server.url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise EngineError(f"vllm serve {model} did not answer /health within {startup_timeout:.0f} s "
                                  f"(log {log}):\n{server.log_tail()}")
            time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m rowgrove.engines.launch MODEL [--port N] [--device cpu|cuda] [-- EXTRA...]`:
    start vLLM the way rowgrove does, print its URL, serve until interrupted (scripts use this)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m rowgrove.engines.launch", description=main.__doc__)
    ap.add_argument("model")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--python", default=None, help="python of vLLM's environment")
    ap.add_argument("--log", default=None)
    ap.add_argument("--startup-timeout", type=float, default=240.0)
    ap.add_argument("--engine-nice", type=int, default=None,
                    help="niceness of the engine-core and worker processes (default 19 on cpu, 0 on cuda)")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # more `vllm serve` flags, after --
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)

    class _Stop(Exception):
        pass

    def _stop(*_: object) -> None:
        raise _Stop

    # handlers first: a SIGTERM while vLLM starts must still end vLLM's process group
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = None
    try:
        server = start_vllm(args.model, python=args.python, port=args.port, device=args.device,
                            extra_args=extra, log_path=args.log, startup_timeout=args.startup_timeout,
                            engine_nice=args.engine_nice)
        print(server.url, flush=True)
        while server.alive():
            time.sleep(0.5)
        print(f"launch: vllm serve exited with code {server.process.returncode}; log {server.log_path}", flush=True)
        return 1
    except _Stop:
        return 0
    except EngineError as e:
        print(f"launch: {e}", flush=True)
        return 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
