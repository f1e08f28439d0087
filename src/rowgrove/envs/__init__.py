"""Small tasks with tools and verifiable rewards, for the demo, the trainer and tests.

- `counter`: reach a target with `add(n)`; learnable by the tiny model on a CPU in minutes.
- `lookup`: look up hidden prices, answer their sum.
- `shapes`: count the shapes on screens drawn on the spot (images; for a vision model).

`make_env(name, seed)` gives a fresh environment (one per concurrent episode), `make_tasks(name,
n, seed)` the tasks, `synth_transcripts` the warm-up data and `task_corpus` the tokenizer text.
"""

from __future__ import annotations

from rowgrove.envs.base import Env, StepResult, Task, check_arguments, tool_schema
from rowgrove.envs.counter import CounterEnv, counter_reward, make_counter_tasks
from rowgrove.envs.lookup import LookupEnv, make_lookup_tasks
from rowgrove.envs.shapes import ShapesEnv, make_shapes_tasks
from rowgrove.envs.registry import ENV_NAMES, make_env, make_tasks
from rowgrove.envs.synth import POLICIES, play, synth_transcripts, task_corpus, tool_call_message

__all__ = [
    "ENV_NAMES", "POLICIES", "CounterEnv", "Env", "LookupEnv", "ShapesEnv", "StepResult", "Task", "check_arguments",
    "counter_reward", "make_counter_tasks", "make_env", "make_lookup_tasks", "make_shapes_tasks", "make_tasks", "play",
    "synth_transcripts", "task_corpus", "tool_call_message", "tool_schema",
]
