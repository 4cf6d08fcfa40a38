"""experiments/pipeline_reduce_cpu.py on the stored run V: the engine's buckets and the charge
quoted in docs/pipeline.md and docs/results/pipeline_reduce_cpu/ come out of the script."""
import json
from pathlib import Path

import pytest

RUN_V = Path(__file__).resolve().parents[2] / "docs" / "results" / "pipeline_reduce_cpu" / "run_v"
TRACE = RUN_V / "trace" / "00-resnet18-w4-329mbit"


def test_run_v_engine_buckets_from_the_trace():
    from experiments import pipeline_reduce_cpu as script

    layer3 = script.engine_buckets(str(TRACE), "pipeline:microbatches=2,partition=layer3,replicas=2")
    assert [(e["rank"], e["stage"], e["buckets"]) for e in layer3] == [(0, 0, 5), (1, 0, 5), (2, 1, 7), (3, 1, 7)]
    # every kept step issued its whole plan; the last stage's 2.6 MB finish well after its backward
    assert all(e["per_step"] == e["collectives_planned"] == e["buckets"] for e in layer3)
    assert [e["bytes"] for e in layer3] == [171704, 171704, 2634408, 2634408]
    assert all(50 < e["last_done_after_last_backward_end_ms"] < 65 for e in layer3[2:])
    hand = script.engine_buckets(str(TRACE), "pipeline:microbatches=4,replicas=2")
    assert [e["buckets"] for e in hand] == [3, 3, 7, 7]
    # a strategy with no trace files: nothing
    assert script.engine_buckets(str(TRACE), "ddp") is None


def test_the_charge_per_stage_is_the_simulators():
    from experiments import pipeline_reduce_cpu as script

    # layer3 2+2 on run V: the simulator's one bucket per parameter layer (4 and 3) under
    # Caramel's engine, each collective_cpu_s (r - 1) / (n - 1) = collective_cpu_s / 3
    (row,) = script.score_run(str(RUN_V), only=["pipeline:microbatches=2,partition=layer3,replicas=2"])
    from pipeline_contention import inputs_cluster  # on the path once the script is imported

    cpu_ms = 1e3 * inputs_cluster(json.loads((TRACE / "prediction_inputs.json").read_text()))[1].collective_cpu_s
    assert row["simulator_buckets_per_stage"] == [4, 3]
    assert row["charge_ms_per_stage"] == pytest.approx([4 * cpu_ms / 3, 3 * cpu_ms / 3])
    assert row["none"]["predicted_s"] < row["messages"]["predicted_s"]
