"""Training progress on rank 0: a tqdm bar with samples/s, step time and exposed communication,
and the same numbers to an optional TensorBoard writer.

Other ranks get an object whose methods do nothing, so a training loop calls it unconditionally.
Numbers come from the engine's stats (`last_step_s`, `last_wait_s`) when
given, else from the wall clock between `update()` calls. The bar shows medians over the last
`window_steps` steps, so one slow step (a checkpoint) does not make the bar jump.
"""
from __future__ import annotations

import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, TextIO

from caramel.errors import CaramelError


@dataclass
class ProgressConfig:
    """What the bar shows and where the scalars go."""

    total_steps: int | None = None
    """Steps expected (for the bar's length and ETA); None shows a counter."""
    samples_per_step: int | None = None
    """Samples per optimizer step over all ranks (global batch); None hides samples/s."""
    tensorboard_dir: str | None = None
    """Directory for TensorBoard event files (needs the `tensorboard` package); None disables it."""
    desc: str = "train"
    window_steps: int = 10
    """Steps the displayed medians run over."""
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.total_steps is not None and self.total_steps < 0:
            raise CaramelError(f"total_steps must be >= 0, got {self.total_steps}")
        if self.samples_per_step is not None and self.samples_per_step <= 0:
            raise CaramelError(f"samples_per_step must be positive, got {self.samples_per_step}")
        if self.window_steps < 1:
            raise CaramelError(f"window_steps must be >= 1, got {self.window_steps}")


def open_tensorboard(log_dir: str) -> Any:
    """A `torch.utils.tensorboard.SummaryWriter`, or a CaramelError saying how to install it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise CaramelError(f"TensorBoard logging to {log_dir!r} needs the tensorboard package: "
                           "pip install tensorboard (or pip install 'caramel[tensorboard]')") from None
    return SummaryWriter(log_dir=log_dir)


class TrainingProgress:
    """Rank 0's progress bar and scalar log; a no-op on other ranks or when disabled.

    `writer` is anything with `add_scalar(tag, value, step)` and `close()`; it defaults to a
    TensorBoard writer when `config.tensorboard_dir` is set.
    """

    def __init__(self, config: ProgressConfig | None = None, rank: int = 0, file: TextIO | None = None,
                 writer: Any = None):
        self.config = config or ProgressConfig()
        self.active = self.config.enabled and rank == 0
        self.step = 0
        self._last_t = time.perf_counter()
        self._step_times: deque[float] = deque(maxlen=self.config.window_steps)
        self._exposed: deque[float] = deque(maxlen=self.config.window_steps)
        self._bar = None
        self._writer = None
        if not self.active:
            return
        self._writer = writer if writer is not None else (
            open_tensorboard(self.config.tensorboard_dir) if self.config.tensorboard_dir else None)
        from tqdm import tqdm

        self._bar = tqdm(total=self.config.total_steps, desc=self.config.desc, unit="step",
                         file=file if file is not None else sys.stderr, dynamic_ncols=file is None)

    def update(self, step_time_s: float | None = None, exposed_comm_s: float | None = None,
               loss: float | None = None, **scalars: float) -> dict[str, float]:
        """Record one optimizer step; returns the scalars logged for it (empty on other ranks)."""
        now = time.perf_counter()
        measured = now - self._last_t
        self._last_t = now
        self.step += 1
        if not self.active:
            return {}
        step_time_s = measured if step_time_s is None else float(step_time_s)
        self._step_times.append(step_time_s)
        values: dict[str, float] = {"step_time_ms": step_time_s * 1e3}
        if self.config.samples_per_step and step_time_s > 0:
            values["samples_per_s"] = self.config.samples_per_step / step_time_s
        if exposed_comm_s is not None:
            self._exposed.append(float(exposed_comm_s))
            values["exposed_comm_ms"] = float(exposed_comm_s) * 1e3
        if loss is not None:
            values["loss"] = float(loss)
        values.update({k: float(v) for k, v in scalars.items()})
        self._show(loss)
        if self._writer is not None:
            for name, value in values.items():
                tag = f"train/{name}" if name == "loss" or name in scalars else f"caramel/{name}"
                self._writer.add_scalar(tag, value, self.step)
        return values

    def update_from_stats(self, stats: Any, loss: float | None = None) -> dict[str, float]:
        """Record one step from the engine's stats (`last_step_s`, `last_wait_s`): a dict or an object with those attributes."""
        if isinstance(stats, dict):
            step_s, wait_s = stats.get("last_step_s"), stats.get("last_wait_s")
        else:
            step_s, wait_s = getattr(stats, "last_step_s", None), getattr(stats, "last_wait_s", None)
        return self.update(step_time_s=step_s, exposed_comm_s=wait_s, loss=loss)

    def _show(self, loss: float | None) -> None:
        assert self._bar is not None
        med = statistics.median(self._step_times)
        parts = []
        if self.config.samples_per_step and med > 0:
            parts.append(f"{self.config.samples_per_step / med:,.0f} samples/s")
        parts.append(f"step {med * 1e3:.1f} ms")
        if self._exposed:
            parts.append(f"exposed {statistics.median(self._exposed) * 1e3:.1f} ms")
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        self._bar.set_postfix_str(", ".join(parts), refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        """Close the bar and flush the writer (safe to call twice)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "TrainingProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
