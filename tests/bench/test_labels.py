"""caramel.bench.labels keys a stored record the way the bench keyed it (`config_label` of the
`Record`), so torch-free readers of bench JSON find its saved prediction inputs."""
import copy
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "docs/results"


def _records(rel):
    d = json.loads((RESULTS / rel).read_text())
    return d["records"], (d.get("meta") or {}).get("prediction_inputs") or {}


def test_a_stored_records_label_matches_the_records_label_and_its_inputs_key():
    from caramel.bench.labels import config_label_of_dict
    from caramel.bench.record import Record, config_label

    fields = set(Record.__dataclass_fields__)
    as_record = lambda r: config_label(Record(**{k: v for k, v in r.items() if k in fields}))  # noqa: E731
    # flat, ranks sharing hosts, and an older record without `nproc_per_node`
    for rel in ("ps_sim_probe5/w4/bench.json", "ps_sim_probe5/hosts2x2/bench.json",
                "pipeline_contention/run_a/bench.json"):
        records, inputs = _records(rel)
        for r in records:
            assert config_label_of_dict(r) == as_record(r)
        if rel.startswith("ps_sim_probe5"):
            assert {config_label_of_dict(r) for r in records} == set(inputs)
    assert "2 hosts of 2" in config_label_of_dict(_records("ps_sim_probe5/hosts2x2/bench.json")[0][0])
    uneven = copy.deepcopy(_records("ps_sim_probe5/w4/bench.json")[0][0])
    uneven.update(slow_worker={"rank": 1, "factor": 2.0}, slow_link=[2, 4.0], jitter=[0, 0.2, 7])
    assert config_label_of_dict(uneven) == as_record(uneven)
    assert "rank 1 x2 slower" in config_label_of_dict(uneven)
