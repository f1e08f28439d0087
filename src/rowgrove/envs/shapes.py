"""The `shapes` task: a visual one. Each episode shows a few screens, images drawn on the spot
(white squares and circles on a colored background); the agent answers `answer(count)` with the
number of shapes on the newest screen, and is shown the next one. Reward: the fraction of screens
counted right.

It exists to train a vision-language model through the whole seam: every screen is a new image
(an `image_url` part with a PNG data URL), and the harness compacts by keeping only the newest
image (`AgentConfig(compaction="keep_newest_image")`), so each call rewrites its history and one
rollout becomes one row per call, each row carrying the images its prompt shows.

Screens are 112x112 (16 image tokens on the tiny VLM), deterministic in the task's seed. A
random policy (uniform count in 0..MAX_SHAPES) scores 1 / (MAX_SHAPES + 1) per screen; the
expert, 1.0.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any

from rowgrove.envs.base import Env, StepResult, Task, tool_schema

MAX_SHAPES = 4
SIZE = 112

TOOLS: list[dict[str, Any]] = [
    tool_schema("answer", "Say how many shapes the newest screen shows.",
                {"count": {"type": "integer", "minimum": 0, "maximum": MAX_SHAPES}}, ["count"]),
]


def draw_screen(count: int, seed: int) -> bytes:
    """A SIZE x SIZE PNG with `count` white shapes (squares or circles, 14 px, not overlapping) on
    a background color set by `seed`."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    im = Image.new("RGB", (SIZE, SIZE), (rng.randint(0, 120), rng.randint(0, 120), rng.randint(0, 120)))
    draw = ImageDraw.Draw(im)
    cells = rng.sample(range(36), count)  # a 6x6 grid of 18-px cells: shapes never touch
    for c in cells:
        x, y = 2 + 18 * (c % 6), 2 + 18 * (c // 6)
        box = (x, y, x + 14, y + 14)
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)(box, fill=(255, 255, 255))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def screen_part(count: int, seed: int) -> dict[str, Any]:
    """The screen as an OpenAI `image_url` content part (a PNG data URL)."""
    url = "data:image/png;base64," + base64.b64encode(draw_screen(count, seed)).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def make_shapes_tasks(n: int, seed: int, *, screens: int = 3) -> list[Task]:
    """`n` tasks of `screens` screens each, shape counts drawn uniformly in 0..MAX_SHAPES by `seed`."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        counts = [rng.randint(0, MAX_SHAPES) for _ in range(screens)]
        tasks.append(Task(task_id=f"shapes-{seed}-{i}", prompt="How many shapes are on the screen? Call answer.",
                          tools=TOOLS, answer=counts, data={"seed": rng.randrange(2**31)}))
    return tasks


class ShapesEnv(Env):
    """Count the shapes of each screen of `task.answer` (one count per screen) with `answer`."""

    name = "shapes"
    tools = TOOLS

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.seed = 0
        self.screen = 0
        self.right = 0
        self._started = False

    def _screen(self, text: str) -> list[dict[str, Any]]:
        return [screen_part(self.counts[self.screen], self.seed + self.screen), {"type": "text", "text": text}]

    def reset(self, task: Task) -> list[dict[str, Any]]:  # type: ignore[override]
        self.counts = [int(c) for c in task.answer]
        self.seed = int(task.data.get("seed", 0))
        self.screen = 0
        self.right = 0
        self._started = True
        return self._screen(task.prompt)

    def step(self, tool_name: str, arguments: dict[str, Any]) -> StepResult:
        self._require_started(self._started)
        if self.screen >= len(self.counts):
            return StepResult("episode is over", True, self.reward())
        ok = int(arguments["count"]) == self.counts[self.screen]
        self.right += ok
        self.screen += 1
        verdict = "right" if ok else "wrong"
        if self.screen >= len(self.counts):
            return StepResult(f"{verdict}. done", True, self.reward(), {"right": self.right})
        obs = [{"type": "text", "text": f"{verdict}. next screen"}, *self._screen("How many now?")]
        return StepResult(obs, False, self.reward(), {"right": self.right})  # type: ignore[arg-type]

    def reward(self) -> float:
        self._require_started(self._started)
        return self.right / max(len(self.counts), 1)

    def expert_action(self) -> tuple[str, dict[str, Any]]:
        return "answer", {"count": self.counts[min(self.screen, len(self.counts) - 1)]}

    def random_action(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        return "answer", {"count": rng.randint(0, MAX_SHAPES)}


__all__ = ["MAX_SHAPES", "ShapesEnv", "draw_screen", "make_shapes_tasks", "screen_part"]
