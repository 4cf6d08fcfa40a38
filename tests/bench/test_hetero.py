"""The bench's heterogeneous workers: --slow-link and --jitter parsing, the seeded jitter
schedule, the slow link's shaping, and gossip's comparison with the faster all-reduce."""

import pytest
import torch

from caramel.bench import hetero, jobs
from caramel.bench.hetero import (JitterSchedule, check_jitter, check_slow_link, describe, jitter_down, link_rates_bps,
                                  versus_best_allreduce)
from caramel.bench.matrix import BenchConfig
from caramel.bench.rates import Calibration
from caramel.cli import main
from caramel.errors import CaramelError

torch.set_num_threads(1)


def test_slow_link_flag_parses_and_bad_values_say_what_is_expected():
    assert check_slow_link("2:4", 4) == [2, 4.0] and check_slow_link([0, 1], 2) == [0, 1.0]
    for bad, match in (("2", "RANK:FACTOR"), ("a:4", "RANK:FACTOR"), ("2:4:1", "RANK:FACTOR"), ("4:4", "between 0 and 3"),
                       ("1:0.5", ">= 1"), ("1:nan", ">= 1"), ([1], r"\[rank, factor\]")):
        with pytest.raises(CaramelError, match=match):
            check_slow_link(bad, 4)


def test_jitter_flag_parses_with_a_default_seed_and_bad_values_say_what_is_expected():
    assert check_jitter("1:0.5:7", 4) == [1, 0.5, 7] and check_jitter("3:0.25", 4) == [3, 0.25, 0]
    for bad, match in (("1", "RANK:FRACTION"), ("1:x", "RANK:FRACTION"), ("1:0.5:2:3", "RANK:FRACTION"),
                       ("-1:0.5", "between 0 and 3"), ("1:0", r"in \(0, 1\)"), ("1:1", r"in \(0, 1\)"),
                       ("1:0.5:-2", "seed"), ("1:0.5:1.5", "RANK:FRACTION")):
        with pytest.raises(CaramelError, match=match):
            check_jitter(bad, 4)


def test_a_configuration_records_both_in_its_label_and_dict():
    cfg = BenchConfig(model="small_cnn", workers=4, comm_ratio=1.0, slow_link="2:4", jitter="1:0.5:3")
    assert cfg.slow_link == [2, 4.0] and cfg.jitter == [1, 0.5, 3]
    assert "rank 2's link /4" in cfg.label and "rank 1 jitter +/-0.5 (seed 3)" in cfg.label
    assert BenchConfig.from_dict(cfg.to_dict()) == cfg
    assert "worker 2's link at 1/4" in describe({"slow_link": cfg.slow_link, "jitter": cfg.jitter})
    with pytest.raises(CaramelError, match="between 0 and 1"):
        BenchConfig(model="small_cnn", workers=2, slow_link="2:4")


def test_jitter_schedule_is_seeded_bounded_and_spread():
    first = JitterSchedule(0.5, 3).next()
    a, b, c = JitterSchedule(0.5, 3), JitterSchedule(0.5, 3), JitterSchedule(0.5, 4)
    xs = [a.next() for _ in range(2000)]
    assert xs == [b.next() for _ in range(2000)] and xs != [c.next() for _ in range(2000)]
    assert first == xs[0]
    assert all(0.5 <= x <= 1.5 for x in xs) and min(xs) < 0.55 and max(xs) > 1.45
    assert abs(sum(xs) / len(xs) - 1.0) < 0.03  # zero-mean: only the variance differs from the other workers
    # the sleep pads to the nominal step, compute / (1 - f) = 2x here, times the draw
    s = JitterSchedule(0.5, 3)
    assert [s.sleep_factor() for _ in range(5)] == pytest.approx([2 * x - 1 for x in xs[:5]])
    steady = JitterSchedule(0.5, 3, jittered=False)
    assert {steady.next() for _ in range(10)} == {1.0} and steady.sleep_factor() == pytest.approx(1.0)


def test_jitter_sleeps_per_sample_of_training_forwards_only(monkeypatch):
    model = torch.nn.Linear(4, 2)
    jitter_down(model, 0.002, JitterSchedule(0.5, 0, jittered=False))  # padded: 1 x compute per sample
    slept = []
    monkeypatch.setattr(hetero.time, "sleep", slept.append)  # what is asked, not a loaded host's clock

    def forward(n, grad=True):
        with torch.set_grad_enabled(grad):
            model(torch.randn(n, 4))
    forward(10), forward(2)
    assert slept == [pytest.approx(0.02), pytest.approx(0.004)]
    forward(10, grad=False)
    assert len(slept) == 2


def test_slow_link_rates_and_the_padded_step_the_rate_is_derived_from():
    assert link_rates_bps(100e6, 4, [2, 4.0]) == [100e6, 100e6, 25e6, 100e6]
    assert link_rates_bps(100e6, 2, None) == [100e6, 100e6]
    cal = Calibration(compute_s=0.1, grad_bytes=1_000_000, collectives=1)
    plain = BenchConfig(model="small_cnn", workers=4, comm_ratio=1.0)
    jittered = BenchConfig(model="small_cnn", workers=4, comm_ratio=1.0, jitter="1:0.5")
    assert cal.step_s(plain) == pytest.approx(0.1) and cal.step_s(jittered) == pytest.approx(0.2)
    # twice the compute step: half the rate for the same comm/compute
    assert float(cal.rate(plain).rstrip("mbit")) == pytest.approx(2 * float(cal.rate(jittered).rstrip("mbit")), rel=0.01)


class _FakeCluster:
    """Records what the bench asks of the emulated cluster, without namespaces."""
    made: list = []

    def __init__(self, config):
        self.config, self.mode, self.rates = config, "netns", {}
        _FakeCluster.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def set_bandwidth(self, worker, bps):
        self.rates[worker] = bps

    def run(self, *args, **kwargs):
        return 0


def test_the_slow_link_is_shaped_at_its_rate_with_the_slowest_rates_mtu(monkeypatch, tmp_path):
    monkeypatch.setattr(jobs, "_emulated_cluster_class", lambda: _FakeCluster)
    job = {"format": "x"}
    rc, _, net, _applied = jobs._run_on_cluster(job, tmp_path / "job.json", 4, "400mbit", ["-c", "pass"], 10.0, None, True, "auto",
                                                [1, 4.0])
    cluster = _FakeCluster.made[-1]
    assert rc == 0 and cluster.rates == {1: 100e6} and cluster.config.mtu == 12486  # auto_mtu(100 Mbit/s)
    assert "worker 1's link 100mbit" in net
    with pytest.raises(CaramelError, match="needs the emulated cluster"):
        jobs.launch_job(job, 2, None, "loopback", 10.0, slow_link=[1, 4.0])


def test_a_slow_link_without_a_link_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--model", "small_cnn", "--workers", "2", "--slow-link", "1:4", "--network", "loopback"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--slow-link 1:4" in err[0] and "loopback" in err[0], err
    assert main(["bench", "--model", "small_cnn", "--workers", "2", "--jitter", "1:2"]) == 2
    assert "--jitter fraction" in capsys.readouterr().err


def _raw(per_strategy: dict[str, list[float]], kinds: dict[str, str], spr: int) -> dict:
    # two ranks; rank 1 a little slower, so the job's step is rank 1's
    return {"settings": {"steps_per_round": spr},
            "strategies": [{"name": n, "kind": kinds[n]} for n in per_strategy],
            "step_times_s": {**{n: [ts, [t * 1.01 for t in ts]] for n, ts in per_strategy.items()},
                             "compute": [[0.01] * 12, [0.01] * 12]}}


def test_gossip_is_compared_with_the_faster_all_reduce_with_a_paired_interval():
    wobble = [1.0, 1.02, 0.98, 1.01] * 3
    raw = _raw({"ddp": [0.20 * w for w in wobble], "caramel": [0.15 * w for w in wobble],
                "gossip": [0.10 * w * (1.0, 1.03, 0.97)[i // 4] for i, w in enumerate(wobble)],  # rounds differ
                "gossip:topology=exponential": [0.30 * w for w in wobble]},
               {"ddp": "ddp", "caramel": "caramel", "gossip": "gossip", "gossip:topology=exponential": "gossip"}, 4)
    rows = {v["gossip"]: v for v in versus_best_allreduce(raw)}
    assert set(rows) == {"gossip", "gossip:topology=exponential"}
    ring, exp = rows["gossip"], rows["gossip:topology=exponential"]
    assert ring["best_allreduce"] == exp["best_allreduce"] == "caramel"
    assert exp["throughput_ratio"] == pytest.approx(0.5)
    assert ring["throughput_ratio"] == pytest.approx(1.5, rel=0.02)
    assert 1.3 < ring["ci95"][0] < ring["throughput_ratio"] < ring["ci95"][1] < 1.7
    assert versus_best_allreduce(_raw({"gossip": wobble}, {"gossip": "gossip"}, 4)) == []
