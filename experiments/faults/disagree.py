"""Ranks that disagree: a different model, a different plan, a different world size, or a
collective skipped on one rank by a data-dependent branch.

The promise: every rank stops with an error that names what differs, none hangs past the
collective timeout, and none finishes silently with parameters that differ from the others'.
"""
from __future__ import annotations

import time

from experiments.faults.harness import JobConfig, LocalJob
from experiments.faults.result import FaultResult, MatrixConfig, error_line, fault, shorten

STEPS = 30


def disagreement_experiment(cfg: MatrixConfig, rank_args: dict[int, list[str]] | None = None,
                            rank_env: dict[int, dict[str, str]] | None = None, world_size: int = 2,
                            steps: int = STEPS, extra_args: list[str] | None = None) -> dict:
    """Start a job whose ranks differ as given; wait for every rank (timeout + 50 s at most)."""
    args = ["--steps", str(steps), "--step-sleep-s", "0", *(extra_args or [])]
    job_cfg = JobConfig(world_size, args, rank_args=rank_args or {}, rank_env=rank_env or {}, timeout_s=cfg.timeout_s)
    limit_s = cfg.timeout_s + 50
    with LocalJob(job_cfg) as job:
        t0 = time.time()
        outcome = job.wait(limit_s)
    checksums = {r.rank: r.done["checksum"] for r in outcome.ranks if r.done}
    return {
        "exit_codes": [r.exit_code for r in outcome.ranks],
        "exit_after_s": [None if r.exit_time is None else r.exit_time - t0 for r in outcome.ranks],
        "messages": {r.rank: error_line(r.stderr_tail) for r in outcome.ranks},
        "hung": outcome.hung,
        "checksums": checksums,
        "limit_s": limit_s,
    }


def judge(name: str, raw: dict, injected: str, expected: str, must_name: list[str]) -> FaultResult:
    """Passed when every rank exited non-zero and every rank's error line names each of `must_name`."""
    codes = raw["exit_codes"]
    everyone_failed = not raw["hung"] and all(c not in (0, None) for c in codes)
    named = all(all(word in raw["messages"][r] for word in must_name) for r in range(len(codes)))
    finished_differently = len(set(raw["checksums"].values())) > 1
    notes = []
    if raw["hung"]:
        notes.append(f"ranks {raw['hung']} still running after {raw['limit_s']:g} s (killed)")
    if raw["checksums"] and not everyone_failed:
        notes.append(f"ranks {sorted(raw['checksums'])} finished"
                     + (" with DIFFERENT parameters" if finished_differently else " with identical parameters"))
    worst = max((m for m in raw["messages"].values()), key=lambda m: all(w in m for w in must_name), default="")
    times = [t for t in raw["exit_after_s"] if t is not None]
    return FaultResult(
        fault=name, category="disagreement", injected=injected, expected=expected,
        detected=everyone_failed, detect_s=max(times) if everyone_failed and times else None,
        exit_codes=codes, message=shorten(worst), recovered="n/a (refused to start or stopped)",
        data_lost="none" if not finished_differently else "silently diverged parameters",
        passed=everyone_failed and named and not finished_differently, notes="; ".join(notes), details=raw)


@fault("model-shape-differs", "disagreement")
def model_shape_differs(cfg: MatrixConfig) -> FaultResult:
    raw = disagreement_experiment(cfg, rank_args={1: ["--model-variant", "wide"]})
    return judge("model-shape-differs", raw, "rank 1 builds a hidden layer one unit wider than rank 0's",
                 "MismatchError on every rank at parallelize(), naming rank 1 and the differing field",
                 ["MismatchError", "rank 1", "shape"])


@fault("model-depth-differs", "disagreement")
def model_depth_differs(cfg: MatrixConfig) -> FaultResult:
    raw = disagreement_experiment(cfg, rank_args={1: ["--model-variant", "deep"]})
    return judge("model-depth-differs", raw, "rank 1's model has one more Linear layer than rank 0's",
                 "MismatchError on every rank at parallelize(), naming rank 1 and the parameter count",
                 ["MismatchError", "rank 1", "parameters"])


@fault("plan-differs", "disagreement")
def plan_differs(cfg: MatrixConfig) -> FaultResult:
    raw = disagreement_experiment(cfg, rank_args={0: ["--plan-bucket-kb", "1"], 1: ["--plan-bucket-kb", "1000"]})
    return judge("plan-differs", raw, "ranks get explicit plans with different buckets (1 kB vs 1 MB caps)",
                 "MismatchError on every rank at parallelize(), listing each rank's plan fingerprint",
                 ["MismatchError", "plan"])


@fault("world-size-differs", "disagreement")
def world_size_differs(cfg: MatrixConfig) -> FaultResult:
    raw = disagreement_experiment(cfg, rank_env={1: {"WORLD_SIZE": "3"}})
    return judge("world-size-differs", raw, "rank 1 is started with WORLD_SIZE=3, rank 0 with 2",
                 "every rank exits non-zero within the timeout, naming the world size",
                 ["world"])


@fault("collective-skipped", "disagreement")
def collective_skipped(cfg: MatrixConfig) -> FaultResult:
    raw = disagreement_experiment(cfg, rank_args={1: ["--skip-step", "7"]}, extra_args=["--check-every", "5"])
    return judge("collective-skipped", raw,
                 "rank 1 runs step 7's backward under no_sync (a data-dependent branch), rank 0 does not",
                 "every rank stops with an error naming the step/collective disagreement; none finishes silently",
                 ["step"])
