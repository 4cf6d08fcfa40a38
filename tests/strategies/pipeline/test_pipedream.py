"""Asynchronous PipeDream: weight stashing checked version by version and against an oracle."""
from __future__ import annotations

from caramel.testing import run_workers
from tests.strategies.pipeline import workers

STEPS = 3


def test_pipedream_weight_stashing_and_vertical_sync():
    ranks = run_workers(workers.pipedream_worker, 2, args=(STEPS,), timeout_s=150)
    for stage, out in enumerate(ranks):
        for vs in (False, True):
            res = out[vs]
            # the same parameters as PipeDream's semantics computed in one process ...
            assert res["diff"] <= 1e-5, (stage, vs, res["diff"])
            # ... which are not plain sequential SGD: the pipeline really ran stale weights
            assert res["no_stash_diff"] > 1e-4, (stage, vs, res["no_stash_diff"])
            fw = [e for e in res["log"] if e["phase"] == 0]
            bw = [e for e in res["log"] if e["phase"] == 1]
            assert [e["microbatch"] for e in fw] == [e["microbatch"] for e in bw]
            # every backward differentiates the version its forward used
            assert [e["version"] for e in fw] == [e["version"] for e in bw], (stage, vs)
            warmup = 1 if (stage == 0 or vs) else 0
            expected = [s * workers.MICRO + max(0, i - warmup) for s in range(STEPS) for i in range(workers.MICRO)]
            assert [e["version"] for e in fw] == expected, (stage, vs)
    # converges on a small learnable task, as far as the same updates without staleness do
    losses = ranks[0]["losses"]
    assert ranks[1]["losses"] == losses
    seq = workers.sequential_losses(workers.CONVERGE_STEPS)
    start, end, seq_end = sum(losses[:5]) / 5, sum(losses[-5:]) / 5, sum(seq[-5:]) / 5
    assert end < 0.75 * start, losses
    assert end < 1.15 * seq_end, (losses, seq)
