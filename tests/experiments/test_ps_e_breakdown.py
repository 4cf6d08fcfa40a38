"""experiments/ps_e_breakdown.py on a hand-built two-rank timeline (each part lands where it
was put, the parts add up to the makespan minus the pull time alone, and their E shares to
E's loss), and the stored timelines read back to the numbers docs/ps.md quotes."""
from pathlib import Path

import pytest

from caramel.strategies.ps.tictac import efficiency
from experiments.ps_e_breakdown import PARTS, breakdown, load, summarize

COMM_S = 0.040


def timeline(land_1: float = 1.050, land_2: float = 1.070, wait_s: float = 0.035) -> dict:
    """Update 10: rank 0 issues at 1.010; rank 1 enters its apply at 1.005, its optimizer runs
    1.012-1.013, it issues at 1.014 and its thread hands bucket 1 over at 1.020 (7 ms after its
    optimizer), bucket 2 at 1.055 (5 ms after bucket 1 landed); forward 11 waits 20 ms for
    bucket 1 and ends at 1.080."""
    m = 1.080 - 1.010
    E, S = efficiency(m - wait_s, COMM_S, m)
    send = lambda b, r, t: {"kind": "send", "bucket": b, "what": f"pull of bucket {b} (shard {r})", "t": t,
                            "t_done": t + 0.001, "bytes": 100}
    rank0 = {"rank": 0, "pull_comm_s": COMM_S, "bucket_pull": [0, 1, 2],
             "log": [{"step": 11, "wait_s": wait_s, "makespan_s": m, "E": E, "S": S}],
             "events": [{"kind": "apply", "step": 10, "t": 1.000, "t_issue": 1.010, "t_done": 1.011},
                        {"kind": "optimizer", "step": 10, "t": 1.008, "t_done": 1.009, "params": 3},
                        send(0, 0, 1.0105),
                        {"kind": "recv", "bucket": 1, "version": 11, "bytes": 100, "t": 1.011, "t_done": land_1},
                        {"kind": "recv", "bucket": 2, "version": 11, "bytes": 100, "t": 1.011, "t_done": land_2},
                        {"kind": "wait", "step": 11, "forward": True, "t": land_1 - 0.020, "t_done": land_1 + 0.0002,
                         "waited": 0.020},
                        {"kind": "step", "step": 11, "t": 1.020, "t_fwd_end": 1.080, "t_bwd_end": 1.1, "t_done": 1.2}]}
    rank1 = {"rank": 1, "events": [{"kind": "apply", "step": 10, "t": 1.005, "t_issue": 1.014, "t_done": 1.015},
                                   {"kind": "optimizer", "step": 10, "t": 1.012, "t_done": 1.013, "params": 3},
                                   send(1, 1, 1.020), send(2, 1, 1.055)]}
    return {0: rank0, 1: rank1}


def test_each_part_lands_where_it_was_put_and_they_add_up():
    [row] = breakdown(timeline(), warmup=0)
    p = row["parts_ms"]
    expected = {"remote_late": 0.0, "push_wait": 2.0, "apply": 1.0, "handoff": 7.0, "wire_gaps": 5.0,
                "wire_excess": 50.0 - 5.0 - 40.0, "tail": 10.0}
    assert p == pytest.approx(expected, abs=1e-6)
    assert sum(p.values()) == pytest.approx(row["makespan_ms"] - row["comm_ms"])
    assert row["link_bound"] and not row["out_of_order"] and row["lag_server"] == 1
    assert row["wait_by_bucket_ms"] == pytest.approx({"1": 20.0})  # the forward waited for bucket 1
    s = summarize([row])
    assert sum(s["E_loss_mean"][k] for k in PARTS) == pytest.approx(1 - row["E"])


def test_pulls_landing_out_of_plan_are_counted_and_compute_bound_steps_left_out():
    [row] = breakdown(timeline(land_1=1.072, land_2=1.060), warmup=0)
    assert row["out_of_order"]
    [bound] = breakdown(timeline(wait_s=0.005), warmup=0)  # compute 65 ms > comm 40: L = compute
    s = summarize([bound])
    assert not bound["link_bound"] and s["link_bound"] == 0 and s["E_loss_mean"]["tail"] is None


def test_the_warmup_leaves_updates_out():
    assert breakdown(timeline(), warmup=11) == []


STORED = Path(__file__).resolve().parents[2] / "docs/results/ps_pull_timeline"
# what docs/ps.md ("Where E is lost in a colocated step") quotes: link-bound steps, E lost to
# the hand-off and the tail (mean shares), the forward's median wait for bucket 1 (ms)
QUOTED = {"coloc_e_parts_first_look": (20, 0.082, 0.121, 13.3), "coloc_e_parts_a": (4, 0.033, 0.114, 8.5),
          "coloc_e_parts_b": (28, 0.045, 0.130, 11.9)}


@pytest.mark.parametrize("name", sorted(QUOTED))
def test_the_stored_timelines_break_down_to_the_quoted_numbers(name):
    s = summarize(breakdown(load(STORED / name), warmup=10))
    bound, handoff, tail, wait_1 = QUOTED[name]
    assert s["link_bound"] == bound and s["out_of_order"] == 0 and s["parts_ms_median"]["wire_gaps"] == 0
    assert round(s["E_loss_mean"]["handoff"], 3) == handoff and round(s["E_loss_mean"]["tail"], 3) == tail
    assert round(s["wait_by_bucket_ms_median"]["1"], 1) == wait_1
