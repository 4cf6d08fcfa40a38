"""The tuned reference: `KEY=tuned` parsing, the screening's choice on injected times, its
record in reports, and the screening across two ranks (the pick must be the same on both)."""

import pytest

from caramel.bench import screening
from caramel.bench.baselines import Runner
from caramel.bench.blocks import balanced_order, round_order
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
    # --quick leaves the tuned DDP out of its defaults; asked for by name, it is screened in 3 rounds
    assert bench_cli.strategies_text(parser.parse_args([])) == ",".join(DEFAULT_STRATEGIES)
    quick = bench_cli.strategies_text(parser.parse_args(["--quick"]))
    assert quick == "ddp,ddp:comm_priority=realtime,caramel" and "tuned" not in bench_cli.command_line(
        parser.parse_args(["--quick"]))
    assert bench_cli.strategies_text(parser.parse_args(["--quick", "--strategies", TUNED])) == TUNED
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


def test_screening_order_gives_every_value_the_same_mean_position_over_a_pair_of_rounds():
    keys = list("abcdefg")  # 7 values, as in the bucket-cap grid
    orders = [balanced_order(keys, r) for r in range(4)]
    assert orders[0] == keys and orders[1] == keys[::-1] and orders[2] == keys[2:] + keys[:2]
    assert all(sorted(o) == keys for o in orders)
    positions = {k: [o.index(k) for o in orders] for k in keys}
    assert all(sum(p) == 2 * (len(keys) - 1) for p in positions.values()), positions
    assert len({o[0] for o in orders}) == 4  # the first slot after the barrier goes round too
    # a rotation alone leaves 4 rounds over 7 values unbalanced (what the screening used before)
    assert len({sum(round_order(keys, r).index(k) for r in range(4)) for k in keys}) > 1


class _Ticker(Runner):
    """A step that advances this worker's fake clock by `step_s` (no sleep: the times the
    screening sees are exact whatever the host's load); counts its steps and its close."""

    def __init__(self, clock: list, step_s: float):
        self.clock, self.step_s, self.steps, self.closed = clock, step_s, 0, False

    def step(self) -> None:
        self.steps += 1
        self.clock[0] += self.step_s

    def close(self) -> None:
        self.closed = True


def _screen_worker(rank: int, world: int) -> dict:
    import time
    from types import SimpleNamespace

    from caramel.bench import blocks

    clock = [0.0]
    blocks.time = SimpleNamespace(perf_counter=lambda: clock[0], time=time.time)  # this worker's, until the end
    try:
        return _screen_on(rank, clock)
    finally:
        blocks.time = time


def _screen_on(rank: int, clock: list) -> dict:
    # "0.5" is fast on rank 0 and slow on rank 1: the job waits for rank 1, so "1" wins on both
    # ranks although rank 0 alone would pick "0.5"
    step_s = {"ddp": 0.020, "ddp:bucket_cap_mb=0.5": [0.001, 0.012][rank], "ddp:bucket_cap_mb=1": 0.005}
    made: dict = {}

    def build(s: Strategy):
        made[s.name] = made.get(s.name, 0) + 1
        if s.name == "ddp:bucket_cap_mb=2":
            return None, "refused on rank 1"  # the error every rank agreed on
        return (_Ticker(clock, step_s[s.name]), None) if s.name in step_s else (None, "not in this test's grid")

    settings = BenchSettings(rounds=1, steps_per_round=3, warmup_steps=1, screen_rounds=3)
    candidates, error = screening.build_candidates(parse_strategy("ddp:bucket_cap_mb=tuned"), build)
    runners = dict(candidates.runners)
    t = screening.screen_candidates(candidates, settings, rank).to_dict()
    screening.release(candidates)
    # a first value that fails ends it there: one build, one error
    first: list = []
    none, first_error = screening.build_candidates(
        parse_strategy("ddp:bucket_cap_mb=tuned"), lambda s: (first.append(s.name), (None, "realtime refused"))[1])
    return {"error": error, "tuning": t, "steps": {n: r.steps for n, r in runners.items()}, "made": made,
            "closed": [r.closed for r in runners.values()], "left": len(candidates.runners),
            "first": first, "first_error": first_error, "none": none}


def _threads() -> int:
    import os
    return len(os.listdir("/proc/self/task"))


def _harness_worker(rank: int, world: int) -> dict:
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _world
    from torch.nn.parallel import DistributedDataParallel

    from caramel.bench import runners as bench_runners
    from caramel.bench.matrix import BenchConfig
    from caramel.bench.strategies import StrategyContext

    config = BenchConfig(model="tiny_gpt", workers=world)
    settings = BenchSettings(rounds=1, steps_per_round=1, warmup_steps=0, screen_rounds=1)
    ctx = StrategyContext(device=torch.device("cpu"), rank=rank, world_size=world)
    events: list[str] = []
    build_strategy, screen = bench_runners.build_strategy, screening.screen
    bench_runners.build_strategy = lambda s, *a, **k: (events.append(s.name), build_strategy(s, *a, **k))[1]
    screening.screen = lambda runners, st: (events.append("screen"), screen(runners, st))[1]
    # "auto" makes every candidate a gloo group of its own, whatever this host's privilege
    groups, threads = len(_world.pg_map), _threads()
    gc.disable()  # no automatic collection: only build_runners' own gc.collect() frees the candidates' cycles
    try:
        runners, skipped, _, tuning = bench_runners.build_runners(
            config, settings, [parse_strategy("ddp:bucket_cap_mb=tuned,comm_priority=auto"), parse_strategy("ddp")], ctx)
        # gc.get_objects() still lists garbage that no collection has freed yet
        ddps = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    finally:
        gc.enable()
    groups, threads = len(_world.pg_map) - groups, _threads() - threads
    # the threads one gloo group holds here, and that destroying it frees them
    before = _threads()
    g = dist.new_group(list(range(world)), backend="gloo")
    per_group = _threads() - before
    dist.barrier(group=g)  # both ranks connected before either closes its end
    dist.destroy_process_group(g)
    del g
    gc.collect()
    t = tuning[TUNED_AUTO]
    kept = runners[TUNED_AUTO]
    fresh = bench_runners.make_workload(config, settings.seed, ctx.device).model
    return {"skipped": skipped, "values": t["values"], "chosen": t["chosen"], "chosen_strategy": t["chosen_strategy"],
            "names": list(runners), "kept_name": kept.name, "events": events,
            "cap_bytes": kept.model.bucket_bytes_cap, "cap_default": kept.model.bucket_bytes_cap_default,
            "first_bucket_bytes": kept.model._bucket_config.first_bucket_bytes_cap,
            "untrained": all(torch.equal(a, b) for a, b in zip(kept.model.module.parameters(), fresh.parameters())),
            "ddps": ddps,
            "groups": groups, "threads": threads, "per_group": per_group, "threads_back": _threads() - before}


def _worker(rank: int, world: int) -> dict:
    return {"fake": _screen_worker(rank, world), "harness": _harness_worker(rank, world)}


TUNED_AUTO = "ddp:bucket_cap_mb=tuned,comm_priority=auto"


def test_every_rank_picks_the_same_value_and_the_harness_keeps_the_chosen_ddp():
    from caramel.testing import run_workers

    results = run_workers(_worker, 2, timeout_s=120)  # one spawn for both checks
    for res in (r["fake"] for r in results):
        t = res["tuning"]
        assert res["error"] is None and t["values"] == [None, 0.5, 1.0], res
        assert t["median_s"] == pytest.approx([0.020, 0.012, 0.005]), res  # the slowest rank's, exactly
        assert (t["chosen"], t["chosen_strategy"]) == (1.0, "ddp:bucket_cap_mb=1"), res
        assert (t["runner_up"], t["runner_up_strategy"]) == (0.5, "ddp:bucket_cap_mb=0.5"), res
        assert t["runner_up_gap"] == pytest.approx(0.012 / 0.005 - 1), res
        assert res["steps"] == {n: 1 + 3 * (1 + 3) for n in res["steps"]}  # warm-up, 3 rounds of entry + 3 timed
        assert sorted(t["skipped"]) == ["ddp:bucket_cap_mb=0.25", "ddp:bucket_cap_mb=2", "ddp:bucket_cap_mb=25",
                                        "ddp:bucket_cap_mb=4"], res
        assert set(res["made"].values()) == {1} and len(res["made"]) == len(BUCKET_CAP_GRID_MB), res
        assert res["closed"] == [True, True, True] and res["left"] == 0, res
        assert res["first"] == ["ddp"] and res["none"] is None, res
        assert res["first_error"].count("realtime refused") == 1 and "ddp" in res["first_error"], res
    assert results[0]["fake"]["tuning"] == results[1]["fake"]["tuning"]
    # real DDP in the harness: every cap built, then the plain ddp, then the screening, then the
    # chosen cap built afresh; only its DDP and group outlive build_runners
    for res in (r["harness"] for r in results):
        cands = [c.name for _, c in parse_strategy(TUNED_AUTO).candidates()]
        assert res["events"] == cands + ["ddp", "screen", res["chosen_strategy"]], res
        assert res["skipped"] == {} and res["values"] == list(BUCKET_CAP_GRID_MB), res
        assert res["names"] == ["compute", "comm", "concurrent", TUNED_AUTO, "ddp"], res
        assert res["kept_name"] == res["chosen_strategy"] and res["untrained"], res
        cap = res["chosen"]
        assert res["cap_bytes"] == int((25.0 if cap is None else cap) * 1024 * 1024), res
        assert res["cap_default"] == (cap is None), res  # torch's default keeps its 1 MiB first bucket
        assert res["first_bucket_bytes"] == (1024 * 1024 if cap is None else res["cap_bytes"]), res
        assert res["ddps"] == 2, res  # the kept one and the plain ddp: no candidate left for a late gc
        assert res["groups"] == 2, res  # the baselines' group and the kept one's
        assert res["per_group"] > 0 and res["threads_back"] == 0, res
        assert res["threads"] <= 2 * res["per_group"] + 1, res  # + the priority governor, where allowed
    assert results[0]["harness"]["chosen"] == results[1]["harness"]["chosen"]
