"""`caramel train` on unequal replicas (`replicas=2+1`, 3 processes, gloo): stop and resume.

N steps straight against N/2, stop, then a resume in fresh processes (a second spawn: nothing
of the first run's process state survives but the checkpoint) for the other N/2. Dropout is on,
so the random states must come back too; the resumed run must end with the straight run's
parameters, merged optimizer state and LR schedule, and log its losses, bit for bit.

The first half runs inside the 3-worker spawn of `tests/strategies/pipeline/test_unequal.py`
(`first_half`), which then spawns `resume_worker` and calls `check` (one spawn saved).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.train.test_pipeline import STEPS, _cfg, _final_state, _flat

# stage 0 (before the digits view's hidden layers) on ranks 0 and 1, stage 1 on rank 2
STRATEGY = "pipeline:stages=2,replicas=2+1,schedule=gpipe,microbatches=4,partition=4"


def first_half(root: str) -> dict:
    """The straight run, then the first half of the stopped one (in a spawned worker)."""
    from caramel.train.loop import train

    straight = train(_cfg(Path(root) / "straight", STRATEGY))
    half = train(_cfg(Path(root) / "resumed", STRATEGY, run={"stop_after_steps": STEPS // 2}))
    return {"straight": straight, "half": half}


def resume_worker(rank: int, world: int, root: str) -> dict:
    from caramel.train.loop import train

    return train(_cfg(Path(root) / "resumed", STRATEGY, checkpoint={"resume": "auto"}))


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["kind"] == "train"]


def check(root: Path, first: list[dict], resumed: list[dict]) -> None:
    """`first`: every rank's `first_half`; `resumed`: every rank's `resume_worker`."""
    assert first[0]["half"]["end_step"] == STEPS // 2 and not first[0]["half"]["finished"], first[0]["half"]
    straight = first[0]["straight"]
    assert resumed[0]["start_step"] == STEPS // 2 and resumed[0]["finished"], resumed[0]
    a, b = _flat(_final_state(straight)), _flat(_final_state(resumed[0]))
    keys = [k for k in a if k.startswith(("/model", "/optimizer", "/scheduler", "/pipeline"))]
    # both stages' optimizer state, merged into the whole model's (stage 1 lives on rank 2 only)
    owned = {k.split("/")[3] for k in keys if k.startswith("/optimizer/state/")}
    assert len(owned) == sum(k.startswith("/model/") for k in keys), owned
    differ = [k for k in keys if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]
    assert differ == []
    losses = _losses(root / "straight")
    assert len(losses) == STEPS and losses == _losses(root / "resumed")
    # every rank reports the whole batch's loss (rank 2 computes it, ranks 0 and 1 receive it)
    assert len({(r["straight"]["first_loss"], r["straight"]["final_loss"]) for r in first}) == 1
