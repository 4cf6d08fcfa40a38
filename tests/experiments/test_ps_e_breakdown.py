"""experiments/ps_e_breakdown.py on a hand-built two-rank timeline (each part lands where it
was put, and their E shares add up to the loss of the E the engine logged), a three-rank one
refused, and the stored timelines read back to the numbers docs/ps.md quotes."""
import gzip
import json
from pathlib import Path

import pytest

from caramel.strategies.ps.tictac import efficiency
from experiments.ps_e_breakdown import PARTS, breakdown, load, plan_of, summarize

COMM_S = 0.040


def timeline(land_1: float = 1.050, land_2: float = 1.070, wait_s: float = 0.035) -> dict:
    """Update 10: rank 0 issues at 1.010; rank 1 enters its apply at 1.005, its optimizer runs
    1.012-1.013, it issues at 1.014 and its thread hands bucket 1 over at 1.020 (7 ms after its
    optimizer), bucket 2 at 1.055 (5 ms after bucket 1 landed); forward 11 waits 20 ms for
    bucket 1 and ends at 1.080 as the engine read it, 1.081 after `model()` returned."""
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
                        {"kind": "step", "step": 11, "t": 1.020, "t_fwd_end": 1.081, "t_bwd_end": 1.1, "t_done": 1.2}],
             "predicted": {"comm_s": 0.038, "tac": {"makespan_s": 0.041, "E": 0.85, "S": 0.5}}}
    rank1 = {"rank": 1, "events": [{"kind": "apply", "step": 10, "t": 1.005, "t_issue": 1.014, "t_done": 1.015},
                                   {"kind": "optimizer", "step": 10, "t": 1.012, "t_done": 1.013, "params": 3},
                                   send(1, 1, 1.020), send(2, 1, 1.055)]}
    return {0: rank0, 1: rank1}


def test_each_part_lands_where_it_was_put_and_they_add_up():
    [row] = breakdown(timeline(), warmup=0)
    p = row["parts_ms"]
    # wire_excess is the residual (so the parts add up to m - comm by construction): pinned here
    expected = {"remote_late": 0.0, "push_wait": 2.0, "apply": 1.0, "handoff": 7.0, "wire_gaps": 5.0,
                "wire_excess": 50.0 - 5.0 - 40.0, "tail": 10.0}
    assert p == pytest.approx(expected, abs=1e-6)
    # m and the tail end at the engine's forward end, the one E was logged from, not 1 ms later
    assert row["makespan_ms"] == pytest.approx(70.0) and row["fwd_end_gap_ms"] == pytest.approx(1.0)
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


def _write(d: Path, ranks: dict) -> Path:
    d.mkdir()
    for r, x in ranks.items():
        (d / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(x).encode()))
    return d


def test_a_timeline_with_two_remote_servers_is_refused(tmp_path):
    """Their wire gaps would be counted for one server only, the rest silently as wire excess."""
    ranks = timeline()
    ranks[2] = {"rank": 2, "events": [{**ranks[1]["events"][3], "bucket": 3, "what": "pull of bucket 3 (shard 2)"}]}
    with pytest.raises(SystemExit, match=r"pulls from servers \[1, 2\]: expected one remote server"):
        load(_write(tmp_path / "three", ranks))
    del ranks[2]
    assert breakdown(load(_write(tmp_path / "two", ranks)), warmup=0)


def test_the_plans_prediction_for_the_order_is_read_and_an_unknown_order_refused():
    plan = plan_of(timeline()[0], "tac")
    assert plan["tail_ms"] == pytest.approx(3.0) and plan["E"] == 0.85
    with pytest.raises(SystemExit, match=r"--order 'tic': expected one of the plan's orders \['tac'\]"):
        plan_of(timeline()[0], "tic")


STORED = Path(__file__).resolve().parents[2] / "docs/results/ps_pull_timeline"
# what docs/ps.md ("Where E is lost in a colocated step") quotes: link-bound steps, E lost to
# the hand-off and the tail (mean shares), the forward's median wait for bucket 1 (ms), the
# plan's TAC tail (ms)
QUOTED = {"coloc_e_parts_first_look": (20, 0.083, 0.118, 13.3, 0.8), "coloc_e_parts_a": (4, 0.033, 0.111, 8.5, 2.8),
          "coloc_e_parts_b": (28, 0.045, 0.127, 11.9, 1.4)}


@pytest.mark.parametrize("name", sorted(QUOTED))
def test_the_stored_timelines_break_down_to_the_quoted_numbers(name):
    ranks = load(STORED / name)
    rows = breakdown(ranks, warmup=10)
    s = summarize(rows)
    # the shares add up to the logged E's mean loss over the link-bound steps, exactly
    assert sum(s["E_loss_mean"][k] for k in PARTS) == pytest.approx(1 - s["E_mean_link_bound"], abs=1e-9)
    bound, handoff, tail, wait_1, plan_tail = QUOTED[name]
    assert s["link_bound"] == bound and s["out_of_order"] == 0 and s["parts_ms_median"]["wire_gaps"] == 0
    assert round(s["E_loss_mean"]["handoff"], 3) == handoff and round(s["E_loss_mean"]["tail"], 3) == tail
    assert round(s["wait_by_bucket_ms_median"]["1"], 1) == wait_1
    assert round(plan_of(ranks[0], "tac")["tail_ms"], 1) == plan_tail
