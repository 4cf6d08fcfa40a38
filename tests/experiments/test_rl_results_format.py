"""The stored results (docs/results/) of the scripts listed here carry the format tag their
scripts write, so a reader can tell them apart: the coflow and placement results
(experiments/coflow_rl.py, edge_placement.py, placement_focus_check.py) and the scripts in
TAGGED_LATER, which wrote plain JSON before. Other scripts (e.g. pipeline_contention.py,
gossip_convergence.py) still write plain JSON; their files are not checked here."""
from pathlib import Path

import pytest

from caramel.jsonio import read_json

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


@pytest.mark.parametrize("pattern, kind, experiment", [
    ("rl/coflow_*.json", "coflow-rl", "coflow_rl"), ("rl/edge_placement*.json", "edge-placement", "edge_placement"),
    ("rl/placement_focus_check*.json", "placement-focus-check", "placement_focus_check")])
def test_every_stored_file_reads_as_its_kind(pattern, kind, experiment):
    paths = sorted(RESULTS.glob(pattern))
    assert paths, pattern
    for path in paths:
        assert read_json(path, kind)["experiment"] == experiment, path.name


# (pattern, kind, a key each holds, how many files): every output of these scripts stored here
TAGGED_LATER = [
    ("rl/placement_decode_profile.json", "placement-decode-profile", "decoders", 1),
    ("pipeline_profile_turns/replay.json", "pipeline-sharing-replay", "docs/results/pipeline_profile_turns/run_m", 1),
    ("pipeline_microbatch_cost/*.json", "pipeline-microbatch-cost", "result", 4),
    ("pipeline_profile_turns/evidence/turns_*.json", "profile-turns", "rows", 2),
    ("gossip-deprl-*.json", "gossip-deprl", "against_ddp", 2),
    ("adapt-balance-seed-spread.json", "balance-seed-spread", "paired", 1),
    ("branch_order.json", "branch_order", "rows", 1),
    ("branch_order_planner.json", "branch_order_planner", "rows", 1),
    ("deferral_screen.json", "deferral_screen", "rows", 1),
]


@pytest.mark.parametrize("pattern, kind, key, count", TAGGED_LATER, ids=[t[1] for t in TAGGED_LATER])
def test_every_stored_output_of_the_other_scripts_reads_as_its_kind(pattern, kind, key, count):
    paths = sorted(RESULTS.glob(pattern))
    assert len(paths) == count, (pattern, [p.name for p in paths])
    for path in paths:
        assert key in read_json(path, kind), path.name
