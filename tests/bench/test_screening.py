"""The tuned reference: `KEY=tuned` parsing, the screening's choice on injected times, its
record in reports, and the screening across two ranks (the pick must be the same on both)."""
import time

import pytest

from caramel.bench import screening
from caramel.bench.baselines import Runner
from caramel.bench.matrix import (BUCKET_CAP_GRID_MB, DEFAULT_STRATEGIES, BenchSettings, Strategy, parse_strategies,
                                  parse_strategy)
from caramel.bench.report import summarize
from caramel.bench.tables import format_markdown, format_points, format_tuning
from caramel.cli import main
from caramel.errors import CaramelError

TUNED = "ddp:bucket_cap_mb=tuned,comm_priority=realtime"


def test_choose_takes_the_lowest_median_and_the_first_in_grid_order_on_a_tie():
    assert screening.choose([0.05, 0.04, 0.045]) == (1, 2)
    assert screening.choose([0.04, 0.05, 0.04]) == (0, 2)  # tie: grid order, never chance
    assert screening.choose([0.04]) == (0, None)
    with pytest.raises(ValueError):
        screening.choose([])


def test_select_records_every_value_the_choice_and_the_runner_ups_paired_gap():
    # 3 rounds of 2 steps; the job's medians: default 0.055, 0.5 MB 0.050, 1 MB 0.051
    series = [[0.055] * 6, [0.050, 0.050, 0.049, 0.051, 0.050, 0.050], [0.051] * 6]
    names = ["ddp", "ddp:bucket_cap_mb=0.5", "ddp:bucket_cap_mb=1"]
    s = screening.select("bucket_cap_mb", [None, 0.5, 1.0], names, series, rounds=3, steps_per_round=2,
                         skipped={"ddp:bucket_cap_mb=4": "no memory"})
    assert s.median_s == pytest.approx([0.055, 0.050, 0.051])
    assert (s.chosen, s.chosen_strategy, s.runner_up) == (0.5, "ddp:bucket_cap_mb=0.5", 1.0)
    assert s.runner_up_gap == pytest.approx(0.051 / 0.050 - 1) and s.steps == 6 and s.rounds == 3
    lo, hi = s.runner_up_ci95  # per-round ratios 1.02, 1.02, 1.02 (round 2's median is 0.050)
    assert lo == pytest.approx(hi) == pytest.approx(1.02)
    assert s.to_dict()["skipped"] == {"ddp:bucket_cap_mb=4": "no memory"}
    one = screening.select("bucket_cap_mb", [0.5], names[1:2], series[1:2], rounds=3, steps_per_round=2)
    assert one.runner_up is None and one.runner_up_gap is None and one.runner_up_ci95 is None
    with pytest.raises(ValueError):
        screening.select("bucket_cap_mb", [None, 0.5], names, series, rounds=3, steps_per_round=2)


def test_tuned_parses_to_the_grid_of_concrete_strategies_and_round_trips():
    s = parse_strategy("ddp:comm_priority=realtime,bucket_cap_mb=tuned")
    assert s.tuned == ("bucket_cap_mb",) and s.name == TUNED and s.spec().options.bucket_cap_mb is None
    values = [v for v, _ in s.candidates()]
    assert values == list(BUCKET_CAP_GRID_MB) and values[0] is None  # torch's default is a candidate
    names = [c.name for _, c in s.candidates()]
    assert names[0] == "ddp:comm_priority=realtime" and names[2] == "ddp:bucket_cap_mb=0.5,comm_priority=realtime"
    assert all(not c.tuned for _, c in s.candidates())
    assert Strategy.from_dict(s.to_dict()) == s and parse_strategy("ddp").to_dict().get("tuned") is None
    assert parse_strategy("ddp").candidates() == []
    # the default strategies keep plain DDP and add the tuned one
    assert [x.name for x in parse_strategies(",".join(DEFAULT_STRATEGIES))] == [
        "ddp", "ddp:comm_priority=realtime", TUNED, "caramel"]


@pytest.mark.parametrize("text, words", [
    ("ddp:bucket_cap_mb=tunde", ["bucket_cap_mb='tunde'", "expected a number or 'tuned'", "0.25, 0.5"]),
    ("caramel:planner=tuned", ["planner=tuned", "screens only ddp:bucket_cap_mb=tuned"]),
    ("ddp:static_graph=tuned", ["static_graph=tuned", "give static_graph a value"]),
    ("ddp:bucket_cap_mb=tuned,comm_priority=fast", ["comm_priority"])])
def test_a_bad_tuned_option_is_one_clear_error(text, words):
    with pytest.raises(CaramelError) as e:
        parse_strategy(text)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_screen_rounds_setting_and_flag(tmp_path, capsys, monkeypatch):
    from caramel.bench import cli as bench_cli

    with pytest.raises(CaramelError, match="screen-rounds"):
        BenchSettings(screen_rounds=0)
    parser = __import__("argparse").ArgumentParser()
    bench_cli.add_arguments(parser)
    assert bench_cli.select(parser.parse_args([]))[1].screen_rounds == 4
    assert bench_cli.select(parser.parse_args(["--quick"]))[1].screen_rounds == 3
    args = parser.parse_args(["--model", "tiny_gpt", "--screen-rounds", "6"])
    assert bench_cli.select(args)[1].screen_rounds == 6 and "--screen-rounds 6" in bench_cli.command_line(args)
    monkeypatch.chdir(tmp_path)
    for argv, word in ((["--screen-rounds", "0", "--model", "tiny_gpt"], "screen-rounds"),
                       (["--strategies", "ddp:bucket_cap_mb=tunde"], "tunde"),
                       (["--data", str(tmp_path), "--screen-rounds", "2"], "--screen-rounds")):
        assert main(["bench", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and word in err[0], err


def _raw_with_tuning():
    tuning = screening.select("bucket_cap_mb", [None, 0.5, 1.0], ["ddp:comm_priority=realtime",
                              "ddp:bucket_cap_mb=0.5,comm_priority=realtime", "ddp:bucket_cap_mb=1,comm_priority=realtime"],
                              [[0.060] * 6, [0.050] * 6, [0.052] * 6], rounds=3, steps_per_round=2).to_dict()
    return {
        "config": {"model": "resnet18", "workers": 2, "bandwidth": "300mbit", "batch_size": 8,
                   "model_options": {"width": 16}, "regime": "balanced"},
        "settings": {"steps_per_round": 2},
        "strategies": [{"kind": "ddp", "options": {}, "name": "ddp"},
                       {"kind": "ddp", "options": {"comm_priority": "realtime"}, "name": TUNED, "tuned": ["bucket_cap_mb"]},
                       {"kind": "caramel", "options": {}, "name": "caramel"}],
        "step_times_s": {"compute": [[0.03] * 6], "comm": [[0.03] * 6], "ddp": [[0.060] * 6], TUNED: [[0.051] * 6],
                         "caramel": [[0.040] * 6]},
        "tuning": {TUNED: tuning}, "lower_bound_s": 0.032, "meta": {"network": "netns+tc 300mbit"},
    }


def test_the_tuned_reference_and_its_screening_reach_the_records_and_the_reports():
    recs = {r.strategy: r for r in summarize(_raw_with_tuning())}
    assert recs["caramel"].reference == TUNED and recs["caramel"].speedup == pytest.approx(0.051 / 0.040)
    assert recs[TUNED].tuning["chosen"] == 0.5 and recs["ddp"].tuning is None
    text = format_tuning(list(recs.values()))
    assert "default 60.0, **0.5 50.0**, 1 52.0 -> 0.5" in text and "runner-up 1 +4.0%" in text, text
    assert "in the rounds 51.0 ms" in text and "3 rounds x 2 steps (6 steps per value)" in text, text
    assert f"reference {TUNED} (bucket_cap_mb=0.5 chosen)" in format_points(list(recs.values()))
    md = format_markdown(list(recs.values()), "caramel bench", {})
    assert "## Tuned references" in md and md.index("## Tuned references") < md.index("## Summary")
    assert "## Tuned references" not in format_markdown([recs["ddp"], recs["caramel"]], "caramel bench", {})


def test_predictions_of_a_tuned_strategy_are_those_of_the_value_it_ran():
    concrete = screening.as_screened(["ddp", TUNED], {TUNED: {"chosen_strategy": "ddp:bucket_cap_mb=0.5"}})
    assert concrete == {"ddp": "ddp", TUNED: "ddp:bucket_cap_mb=0.5"}
    made = {"predicted": {"ddp": {"step_time_s": 0.06}, "ddp:bucket_cap_mb=0.5": {"step_time_s": 0.05}},
            "predicted_rate_only": {}, "link_fit": None}
    out = screening.predictions_by_name(made, concrete)
    assert out["predicted"] == {"ddp": {"step_time_s": 0.06}, TUNED: {"step_time_s": 0.05}}
    assert out["predicted_rate_only"] == {} and out["link_fit"] is None


class _Sleeper(Runner):
    """A step that sleeps this rank's share of `delays_s`; counts its steps."""

    def __init__(self, delay_s: float):
        self.delay_s, self.steps = delay_s, 0

    def step(self) -> None:
        self.steps += 1
        time.sleep(self.delay_s)


def _screen_worker(rank: int, world: int) -> dict:
    # "uneven" is fast on rank 0 and slow on rank 1: the job waits for rank 1, so "even" wins
    # on both ranks although rank 0 alone would pick "uneven"
    delays = {"ddp:bucket_cap_mb=0.5": [0.001, 0.012][rank], "ddp:bucket_cap_mb=1": 0.005}

    def build(s: Strategy):
        if s.name == "ddp":
            return None, "refused on rank 1"  # the error every rank agreed on
        return (_Sleeper(delays[s.name]), None) if s.name in delays else (None, "not in this test's grid")

    tuning: dict = {}
    settings = BenchSettings(rounds=1, steps_per_round=3, warmup_steps=1, screen_rounds=3)
    runner, error = screening.tuned_runner(parse_strategy("ddp:bucket_cap_mb=tuned"), build, settings, rank, tuning)
    t = tuning["ddp:bucket_cap_mb=tuned"]
    return {"error": error, "chosen": t["chosen"], "values": t["values"], "steps": runner.steps,
            "skipped": sorted(t["skipped"]), "medians": t["median_s"]}


def _harness_worker(rank: int, world: int) -> dict:
    import torch

    from caramel.bench import harness
    from caramel.bench.matrix import BenchConfig
    from caramel.bench.strategies import StrategyContext

    config = BenchConfig(model="tiny_gpt", workers=world)
    settings = BenchSettings(rounds=1, steps_per_round=1, warmup_steps=0, screen_rounds=1)
    ctx = StrategyContext(device=torch.device("cpu"), rank=rank, world_size=world)
    runners, skipped, _, tuning = harness.build_runners(config, settings, [parse_strategy("ddp:bucket_cap_mb=tuned")], ctx)
    t = tuning["ddp:bucket_cap_mb=tuned"]
    cap = t["chosen"]
    return {"skipped": skipped, "values": t["values"], "chosen": cap, "names": sorted(runners),
            "cap_bytes": runners["ddp:bucket_cap_mb=tuned"].model.bucket_bytes_cap,
            "expected_bytes": int((25.0 if cap is None else cap) * 1024 * 1024)}


def _worker(rank: int, world: int) -> dict:
    return {"sleepers": _screen_worker(rank, world), "harness": _harness_worker(rank, world)}


def test_every_rank_picks_the_same_value_and_the_harness_keeps_the_chosen_ddp():
    from caramel.testing import run_workers

    results = run_workers(_worker, 2, timeout_s=120)  # one spawn for both checks
    for res in (r["sleepers"] for r in results):
        assert res["error"] is None and res["chosen"] == 1.0 and res["values"] == [0.5, 1.0], res
        assert res["steps"] == 1 + 3 * (1 + 3)  # warm-up, then 3 rounds of an entry step and 3 timed
        assert "ddp" in res["skipped"] and len(res["skipped"]) == 5, res
        assert res["medians"][0] >= 0.012 > res["medians"][1] >= 0.005, res
    assert results[0]["sleepers"]["medians"] == results[1]["sleepers"]["medians"]
    # real DDP in the harness: every cap of the grid built and screened, the chosen one's runner kept
    for res in (r["harness"] for r in results):
        assert res["skipped"] == {} and res["values"] == list(BUCKET_CAP_GRID_MB), res
        assert res["names"] == ["comm", "compute", "concurrent", "ddp:bucket_cap_mb=tuned"], res
        assert res["cap_bytes"] == res["expected_bytes"], res
    assert results[0]["harness"]["chosen"] == results[1]["harness"]["chosen"]
