"""Process faults: a worker killed (SIGKILL) or frozen (SIGSTOP) in the middle of training.

A killed peer closes its sockets, so the survivors' next collective fails at once; a frozen
peer keeps its sockets open and says nothing, so only the collective timeout
(`CARAMEL_TIMEOUT_S`) can notice it. Either way every survivor must exit non-zero with the
engine's message naming the collective, instead of waiting forever.
"""
from __future__ import annotations

import random
import signal

from experiments.faults.harness import JobConfig, LocalJob
from experiments.faults.result import FaultResult, MatrixConfig, error_line, fault, shorten

ENGINE_MESSAGE = "all-reduce of "  # what the engine's errors name: "all-reduce of bucket B chunk C" or "all-reduce of the plan check"
# Long enough that the fault always lands mid-run, short enough that a missed fault still ends.
RUN_STEPS = 100_000
STEP_SLEEP_S = 0.02


def signal_experiment(sig: int, cfg: MatrixConfig, world_size: int = 2, victim: int = 1,
                      at_step: int | None = None, limit_s: float | None = None,
                      worker_args: list[str] | None = None) -> dict:
    """Run a job, send `sig` to `victim` after it finished `at_step` steps, watch the survivors.

    Returns the raw measurements: injection step, per-rank exit codes and times since the
    signal, each survivor's error line, and the ranks that were still running at the limit.
    """
    rng = random.Random(cfg.seed * 7919 + sig)
    at_step = at_step if at_step is not None else rng.randint(5, 30)
    limit_s = limit_s if limit_s is not None else cfg.kill_limit_s
    survivors = [r for r in range(world_size) if r != victim]
    args = ["--steps", str(RUN_STEPS), "--step-sleep-s", str(STEP_SLEEP_S), *(worker_args or [])]
    with LocalJob(JobConfig(world_size, args,
                            timeout_s=cfg.timeout_s)) as job:
        job.wait_for_step(victim, at_step)
        t_sig = job.signal(victim, sig)
        outcome = job.wait(limit_s, ranks=survivors)
        victim_step = job.step_of(victim)
    return {
        "at_step": at_step, "victim": victim, "victim_last_step": victim_step, "survivors": survivors,
        "exit_codes": [r.exit_code for r in outcome.ranks],
        "exit_after_s": [None if r.exit_time is None else r.exit_time - t_sig for r in outcome.ranks],
        "messages": {r.rank: error_line(r.stderr_tail) for r in outcome.ranks if r.rank in survivors},
        "hung": outcome.hung,
    }


def _result(name: str, raw: dict, injected: str, expected: str, limit_s: float, min_s: float = 0.0) -> FaultResult:
    survivors = raw["survivors"]
    times = [raw["exit_after_s"][r] for r in survivors]
    codes = [raw["exit_codes"][r] for r in survivors]
    messages = [raw["messages"][r] for r in survivors]
    detected = not raw["hung"] and all(c not in (0, None) for c in codes)
    detect_s = max(times) if detected else None
    named = all(ENGINE_MESSAGE in m for m in messages)
    passed = detected and named and detect_s is not None and min_s <= detect_s <= limit_s
    return FaultResult(
        fault=name, category="process", injected=injected.format(**raw), expected=expected,
        detected=detected, detect_s=detect_s, exit_codes=raw["exit_codes"], message=shorten(messages[0] if messages else ""),
        recovered="no (by design: the job stops; restart it, see torchrun-restart)",
        data_lost="steps since the last checkpoint (this job writes none)", passed=passed, details=raw)


@fault("sigkill-worker", "process")
def sigkill_worker(cfg: MatrixConfig) -> FaultResult:
    raw = signal_experiment(signal.SIGKILL, cfg)
    return _result("sigkill-worker", raw, "SIGKILL rank {victim} of 2 after step {at_step}",
                   f"every other rank exits non-zero within {cfg.kill_limit_s:g} s, naming the collective",
                   cfg.kill_limit_s)


@fault("sigstop-worker", "process")
def sigstop_worker(cfg: MatrixConfig) -> FaultResult:
    # a silent peer cannot be noticed before the timeout: an exit much earlier would mean the
    # survivor failed for some other reason; the upper slack covers start-up of the wait and teardown
    raw = signal_experiment(signal.SIGSTOP, cfg, limit_s=cfg.timeout_s + 50)
    return _result("sigstop-worker", raw, "SIGSTOP rank {victim} of 2 after step {at_step} (never resumed)",
                   f"every other rank exits non-zero after the {cfg.timeout_s:g} s collective timeout (CARAMEL_TIMEOUT_S)",
                   cfg.timeout_s + 50, min_s=cfg.timeout_s * 0.9)
