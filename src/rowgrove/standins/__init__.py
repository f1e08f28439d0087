"""Stand-ins for the vLLM and SGLang servers, for tests, benchmarks and trying rowgrove without
a GPU. Each speaks its server's documented wire format (the source file of every shape is cited
in its module) and samples real tokens with a real model through the hf engine, so ids and
logprobs can be checked end to end; faults are injected on request (see `common`).

    with start_standin("sglang", "tiny", incremental=True) as server:
        engine = make_engine("sglang", "tiny", url=server.url)

    python -m rowgrove.standins vllm --model tiny --port 8001
"""

from rowgrove.standins.common import FAULTS
from rowgrove.standins.launch import StandinHandle, launch_standin, start_standin

__all__ = ["FAULTS", "StandinHandle", "launch_standin", "start_standin"]
