"""Under `--jitter`, the spec a pipeline's runtime plans at (`caramel.bench.pipeline_plan`) takes a
transfer's CPU share from the unpadded factor, as its prediction does; without jitter it is as
before. No processes: the gathering is faked."""
from __future__ import annotations

import pytest

from caramel.bench.hetero_prediction import Heterogeneity
from caramel.bench.prediction import job_predictions
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.pipeline.sharing import transfer_cpu_share
from caramel.topology.spec import ClusterSpec

# compute 30 ms slowed 1.5x through a 20 ms overlap, then a 40 ms sleep in it (test_hetero_prediction's construction)
C, F, O, SLEEP, BATCH = 0.030, 1.5, 0.020, 0.040, 32
PADDED = [[(C + O - O / F + SLEEP, O + SLEEP, 1)] * 3 for _ in range(2)]
PAUSES = [[[SLEEP, SLEEP, 0]] * 3 for _ in range(2)]


def test_under_jitter_the_runtimes_spec_takes_the_predictions_transfer_share():
    """The runtime's spec was the padded factor's alone (a transfer's share ~0.1 against 0.5):
    with the paddings it carries the prediction's share; without them, no share of its own."""
    from caramel.bench.pipeline_plan import plan_cluster

    hetero = Heterogeneity(jitter={"rank": 1, "fraction": 0.5, "seed": 3, "compute_per_sample_s": SLEEP / BATCH,
                                   "nominal_factor": 2.0}, local_batch=BATCH, unpadded_compute_s=[C, C],
                           concurrent_pauses=PAUSES)
    profile = synthetic_profile(6)
    out = job_predictions(profile, ["pipeline"], 2, 2_000_000, 0.05, 1, [C + SLEEP] * 2, PADDED, None, hetero=hetero)
    base = ClusterSpec.from_dict(out["prediction_inputs"]["clusters"]["base"])
    padding = Heterogeneity(unpadded_compute_s=[C, C], concurrent_pauses=PAUSES)
    plan = plan_cluster(profile, 2, 2_000_000, 0.05, 1, [C + SLEEP] * 2, PADDED, None, padding)
    assert plan.meta["transfer_cpu_share"] == base.meta["transfer_cpu_share"] == pytest.approx(F - 1)
    assert transfer_cpu_share(plan) == transfer_cpu_share(base)
    assert plan.compute_slowdown == base.compute_slowdown < 1.2  # the speeds' own factor stays the padded one
    plain = plan_cluster(profile, 2, 2_000_000, 0.05, 1, [C + SLEEP] * 2, PADDED, None)
    assert "transfer_cpu_share" not in plain.meta
    assert plain.to_dict() == dict(plan.to_dict(), meta={k: v for k, v in plan.meta.items() if k != "transfer_cpu_share"})


class _Runner:
    """A baseline as `measure_plan_cluster` drives it: compute-only steps record their sleep,
    concurrent steps their span and padding, under a jitter only."""

    entry_steps, drain_timed = 1, False  # a pipeline's block: one unmeasured entry step, untimed drain

    def __init__(self, name: str, jitter: object = None):
        self.name, self.jitter = name, jitter
        self.paused_s: list = []
        self.spans: list = []
        self.padding: list = []

    def step(self) -> None:
        if self.name == "compute" and self.jitter is not None:
            self.paused_s.append(0.001)
        if self.name == "concurrent":
            self.spans.append((0.03, 0.02, 1))
            if self.jitter is not None:
                self.padding.append((0.01, 0.01, 0))

    def start_measuring(self) -> None:
        self.paused_s.clear()
        self.spans.clear()
        self.padding.clear()

    def finish(self) -> None:
        pass

    def stats(self) -> dict:
        return {"buckets": 1}


@pytest.mark.parametrize("jitter", [None, "schedule"])
def test_the_plan_rounds_gather_the_paddings_under_jitter_only(monkeypatch, jitter):
    import caramel.bench.pipeline_plan as plan

    monkeypatch.setattr(plan.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(plan.dist, "barrier", lambda: None)
    monkeypatch.setattr(plan.dist, "broadcast_object_list", lambda box, src=0, group=None: None)
    monkeypatch.setattr(plan.dist, "all_gather_object", lambda out, obj: out.__setitem__(slice(None), [obj] * len(out)))
    got: dict = {}
    monkeypatch.setattr(plan, "plan_cluster", lambda *args: got.setdefault("args", args))
    compute = _Runner("compute", jitter)
    runners = {"compute": compute, "comm": _Runner("comm"), "concurrent": _Runner("concurrent", jitter)}
    plan.measure_plan_cluster(runners, 3, 2, 1, object(), 2, 1000, None)
    padding = got["args"][8]
    if jitter is None:
        assert padding is None
        return
    # 2 rounds of an entry step and 3 measured ones: 8 concurrent steps per rank, each padding as recorded
    assert padding.concurrent_pauses == [[[0.01, 0.01, 0]] * 8] * 2
    assert len(padding.unpadded_compute_s) == 2 and all(u < got["args"][5][0] for u in padding.unpadded_compute_s)
