"""How long the data bench's calibrations run and how their steps are summed up into one step.

The contention calibration right before each round (`data_contention.steady_steps`) times a window
of the bench's steps beside the mode's own loader; its summary is the round's loaded step, which
with everything cached is the whole prediction. On a loaded host a short window's mean follows
its round weakly (docs/data.md), so the window is an option: longer (`steps`, or `seconds` of steps alone, converted once per run from the run's first window of
`steps` alone) and
summarised either by the mean of its steps (`sub_windows=1`, as before) or by the median of the
means of `sub_windows` equal consecutive parts, which a burst of slow steps in one part does not
move. Every rank must run the same number of steps (each ends in an all-reduce), so a window in
seconds is converted from a step time all ranks agree on (`steps_for`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from caramel.errors import CaramelError

WARMUP_STEPS = 2  # the first steps of a pass start (or restart) its workers: never in the summary
MAX_STEPS = 100_000
MAX_SECONDS = 60.0  # per window; each round runs three (alone, two passes beside the loader)
WINDOWS_PER_ROUND = 3  # a round's calibration: steps alone, then two passes beside the loader


@dataclass(frozen=True)
class CalibrationWindow:
    """`steps` per window (warm-up included), or `seconds` of steps alone when given (then `steps`
    is only the run's first window of steps alone, which the seconds are converted from); the
    summary is the median of `sub_windows` consecutive parts' means (1: the mean)."""
    steps: int = 40
    seconds: float | None = None
    sub_windows: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.sub_windows, bool) or not isinstance(self.sub_windows, int) or self.sub_windows < 1:
            raise CaramelError(f"calibration sub-windows {self.sub_windows!r}: expected an integer >= 1 "
                               "(1: the mean of the window's steps)")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int):
            raise CaramelError(f"calibration window {self.steps!r}: expected a whole number of steps")
        if self.seconds is None:
            self.check_steps(self.steps)
        elif not WARMUP_STEPS < self.steps <= MAX_STEPS:
            # the run's first window of steps alone, which the seconds are converted from; the parent
            # decides from it (as from any window in steps) whether the ranks calibrate at all
            raise CaramelError(f"calibration window of {self.seconds!r} s converted from a first window of {self.steps} "
                               f"steps alone: expected {WARMUP_STEPS + 1} to {MAX_STEPS} steps")
        if self.seconds is not None and not (isinstance(self.seconds, (int, float)) and math.isfinite(self.seconds)
                                             and 0 < self.seconds <= MAX_SECONDS):
            raise CaramelError(f"calibration window {self.seconds!r} s: expected a duration > 0 and at most "
                               f"{MAX_SECONDS:g} s")

    def check_steps(self, steps: int) -> None:
        """A window of `steps` must leave each sub-window at least one step after the warm-up."""
        least = WARMUP_STEPS + self.sub_windows
        if not least <= steps <= MAX_STEPS:
            raise CaramelError(f"calibration window of {steps} steps: expected {least} to {MAX_STEPS} steps "
                               f"({WARMUP_STEPS} warm-up steps, then at least one per sub-window, "
                               f"{self.sub_windows} sub-windows)")

    def steps_for(self, step_s: float) -> int:
        """The window's steps: `steps`, or enough steps of `step_s` (the run's steps alone, the same
        on every rank) to last `seconds`, the warm-up added."""
        if self.seconds is None:
            return self.steps
        if not (math.isfinite(step_s) and step_s > 0):
            raise CaramelError(f"calibration window of {self.seconds:g} s: the steps alone took {step_s!r} s, "
                               "which gives no step count")
        steps = WARMUP_STEPS + max(math.ceil(self.seconds / step_s), self.sub_windows)
        if steps > MAX_STEPS:  # refused, not clamped: a shorter window than asked would be recorded as it
            raise CaramelError(f"calibration window of {self.seconds:g} s: at {step_s * 1e3:.3g} ms a step alone it "
                               f"needs {steps} steps, more than {MAX_STEPS}; give a shorter window")
        self.check_steps(steps)
        return steps

    def check_time(self, compute_s: float, timeout_s: float) -> None:
        """A round's calibration (`WINDOWS_PER_ROUND` windows, each step at least `compute_s`) must end
        before the bench's `timeout_s`, which the parent waits for its message at most."""
        window_s = self.seconds if self.seconds is not None else self.steps * compute_s
        if WINDOWS_PER_ROUND * window_s >= timeout_s:
            what = f"{self.seconds:g} s" if self.seconds is not None else f"{self.steps} steps of at least {compute_s:g} s"
            raise CaramelError(f"calibration window of {what}: its {WINDOWS_PER_ROUND} windows per round last at least "
                               f"{WINDOWS_PER_ROUND * window_s:g} s, not under the timeout of {timeout_s:g} s; "
                               "expected a shorter window (or a longer timeout)")


def window_summary(steps_s: list[float], sub_windows: int = 1) -> float:
    """The mean of `steps_s` (one sub-window) or the median of its `sub_windows` consecutive parts'
    means; the parts differ in length by at most one step. Also used to rescore stored windows."""
    if not steps_s or not 1 <= sub_windows <= len(steps_s):
        raise CaramelError(f"a calibration window of {len(steps_s)} steps cannot be cut into {sub_windows} sub-windows")
    bounds = [round(k * len(steps_s) / sub_windows) for k in range(sub_windows + 1)]
    means = sorted(sum(steps_s[a:b]) / (b - a) for a, b in zip(bounds, bounds[1:]))
    mid = len(means) // 2
    return means[mid] if len(means) % 2 else (means[mid - 1] + means[mid]) / 2


def parse_calibration_window(text: str, flag: str = "--calibration-window") -> tuple[int | None, float | None]:
    """(steps, seconds) from `flag`: a whole number is steps (`160`), a duration with its unit is
    seconds of steps (`1.5s`, `800ms`); anything else is one error naming the flag."""
    from caramel.units import parse_duration_arg_s

    raw = str(text).strip()
    if raw.isascii() and raw.isdigit():  # ASCII only: int() takes some Unicode digits, refuses others
        return int(raw), None
    if raw and raw.lstrip("+-").replace(".", "", 1).replace("e", "", 1).isdigit():  # a number without a unit
        raise CaramelError(f"{flag} {text!r}: expected a whole number of steps (such as 160) or a duration with "
                           "its unit (such as 1.5s or 800ms)")
    if raw.startswith("-"):  # the shared parser would say ">= 0", and a window of 0 s is refused too
        raise CaramelError(f"{flag} {text!r}: a window needs a duration > 0 with its unit (such as 1.5s or 800ms) "
                           "or a whole number of steps (such as 160)")
    try:
        seconds = parse_duration_arg_s(raw, flag)
    except CaramelError as e:
        raise CaramelError(f"{e}; or a whole number of steps (such as 160)") from None
    if seconds == 0:
        raise CaramelError(f"{flag} {text!r}: a window needs a duration > 0")
    return None, seconds
