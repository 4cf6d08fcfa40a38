"""experiments/pipeline_reduce_cpu.py on the stored run V: the engine's buckets and the charge
quoted in docs/pipeline.md and docs/results/pipeline_reduce_cpu/ come out of the script."""
from pathlib import Path

import pytest

RUN_V = Path(__file__).resolve().parents[2] / "docs" / "results" / "pipeline_reduce_cpu" / "run_v"
TRACE = RUN_V / "trace" / "00-resnet18-w4-329mbit"


def test_run_v_engine_buckets_from_the_trace():
    from experiments import pipeline_reduce_cpu as script

    layer3 = script.engine_buckets(str(TRACE), "pipeline:microbatches=2,partition=layer3,replicas=2")
    assert [(e["rank"], e["stage"], e["buckets"]) for e in layer3] == [(0, 0, 5), (1, 0, 5), (2, 1, 7), (3, 1, 7)]
    # every kept step issued its whole plan; the last stage's 2.6 MB finish well after its backward
    assert all(e["per_step"] == e["buckets"] for e in layer3)
    assert [e["bytes"] for e in layer3] == [171704, 171704, 2634408, 2634408]
    assert all(50 < e["last_done_after_last_backward_end_ms"] < 65 for e in layer3[2:])
    hand = script.engine_buckets(str(TRACE), "pipeline:microbatches=4,replicas=2")
    assert [e["buckets"] for e in hand] == [3, 3, 7, 7]
    # a strategy with no trace files: nothing
    assert script.engine_buckets(str(TRACE), "ddp") is None


def test_the_charge_per_stage_by_hand():
    from experiments import pipeline_reduce_cpu as script

    # 2 replicas of 4 ranks: collective_cpu_s / 3 per bucket; 4 and 3 parameter layers
    assert script._charge_ms("pipeline:microbatches=2,partition=layer3,replicas=2,stages=2", 0.003, 4,
                             [4, 3]) == pytest.approx([4.0, 3.0])
    # unequal counts reduce after the drain: not charged
    assert script._charge_ms("pipeline:microbatches=4,replicas=2+1", 0.003, 3, [4, 3]) is None
