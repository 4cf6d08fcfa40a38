"""experiments/ps_sim_bsp_terms.py: each push bucket is read from its server's own works."""
from __future__ import annotations

from experiments.ps_sim_bsp_terms import breakdown_pushes


def test_a_buckets_landing_is_its_servers_receives_for_it():
    """3 ranks, buckets served by ranks 1, 0, 1: rank 1's works are bucket 0's two receives
    (works 0, 1), bucket 1's send (2) and bucket 2's two receives (3, 4)."""
    works = {f"work_{j}_waited": t for j, t in enumerate([10.0, 12.0, 30.0, 40.0, 44.0])}
    ranks = [{"handed_0": 1.0, "handed_1": 2.0, "handed_2": 3.0, "work_0_waited": 99.0, "work_1_waited": 99.0,
              "work_2_waited": 99.0, "work_3_waited": 99.0},
             {"handed_0": 1.5, "handed_1": 2.5, "handed_2": 5.0, **works},
             {"handed_0": 1.2, "handed_1": 2.2, "handed_2": 4.0}]
    d = {"ps": {"timeline_ms_per_rank": ranks, "bucket_owner": [1, 0, 1]},
         "model": {"timeline_ms": {"pushes": [[0, 1, 0.0, 9.0], [1, 0, 1.0, 8.0], [2, 1, 2.0, 12.0]]}}}
    got = breakdown_pushes(d)
    assert got[0] == (0, 1, 1.0, 1.5, 12.0, 9.0)
    assert got[1][4] == 99.0  # rank 0's receives for bucket 1: its works 1 and 2 (after its send for bucket 0)
    assert got[2] == (2, 1, 3.0, 5.0, 44.0, 10.0)
