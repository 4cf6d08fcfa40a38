"""The pipeline simulator: bubbles against (p-1)/(m+p-1), transfers, interleaving, the registry entry."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.simulate import (StageCosts, replay, schedule_actions, simulate_pipeline)
from caramel.topology.spec import ClusterSpec


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 16), (3, 7)])
def test_bubble_fraction_is_the_closed_form(schedule, p, m):
    f, b = 1.0, 2.0
    sim = replay(StageCosts([f] * p, [b] * p, [0.0] * (p - 1)), schedule_actions(schedule, p, p, m))
    assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert sim.step_time_s == pytest.approx((m + p - 1) * (f + b))


def test_interleaving_shrinks_the_bubble_and_transfers_stretch_the_step():
    p, m, v = 2, 4, 2
    plain = replay(StageCosts([1.0] * p, [2.0] * p, [0.0]), schedule_actions("1f1b", p, p, m))
    inter = replay(StageCosts([0.5] * (p * v), [1.0] * (p * v), [0.0] * (p * v - 1)),
                   schedule_actions("interleaved", p * v, p, m))
    assert inter.bubble_fraction < plain.bubble_fraction
    # GPipe streams its forwards: one forward and one backward hop show; 1F1B waits a round trip per microbatch
    slow = replay(StageCosts([1.0] * p, [2.0] * p, [0.5]), schedule_actions("gpipe", p, p, m))
    assert slow.step_time_s == pytest.approx(plain.step_time_s + 2 * 0.5)
    slow = replay(StageCosts([1.0] * p, [2.0] * p, [0.5]), schedule_actions("1f1b", p, p, m))
    assert slow.step_time_s == pytest.approx(17.0)  # by hand: 15 s of compute, stage 0's last backward at 15-17


def test_replica_allreduce_ends_the_step_and_deadlock_is_an_error():
    acts = schedule_actions("gpipe", 2, 2, 2)
    base = replay(StageCosts([1.0, 1.0], [1.0, 1.0], [0.0]), acts)
    synced = replay(StageCosts([1.0, 1.0], [1.0, 1.0], [0.0], [0.0, 3.0]), acts)
    assert synced.step_time_s == pytest.approx(max(base.finish_s[0], base.finish_s[1] + 3.0))
    with pytest.raises(CaramelError, match="deadlocks"):
        replay(StageCosts([1.0, 1.0], [1.0, 1.0], [0.0]), [[(0, "B", 0)], [(1, "F", 0), (1, "B", 0)]])


def test_simulate_from_a_profile():
    from caramel.profile.profiler import profile_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))
    prof = profile_model(model, x, y, nn.functional.cross_entropy, steps=1)
    fast = simulate_pipeline(prof, ClusterSpec.uniform(2, 1e10), PipelineOptions(stages=2, microbatches=4))
    slow = simulate_pipeline(prof, ClusterSpec.uniform(2, 1e6), PipelineOptions(stages=2, microbatches=4))
    assert 0 < fast.step_time_s < slow.step_time_s
    assert fast.meta["boundaries"] and 0 < fast.meta["bubble_fraction"] < 1
    cut = simulate_pipeline(prof, ClusterSpec.uniform(2, 1e10), PipelineOptions(stages=2, partition="4"))
    assert cut.meta["boundaries"] == ["4"]
