"""Several ranks per emulated host (`caramel bench --nproc-per-node`): the configuration, its
label, the CLI's refusals, the within-host probe and the layout the ps model's hierarchical
predictions read."""
import argparse

import pytest

from caramel.bench.matrix import BenchConfig
from caramel.errors import CaramelError


def test_ranks_per_host_divide_the_ranks_and_label_the_configuration():
    c = BenchConfig(model="resnet18", workers=4, bandwidth="100mbit", nproc_per_node=2)
    assert c.hosts == 2 and c.label.endswith("x4 @ 100mbit, 2 hosts of 2")
    old = BenchConfig(model="resnet18", workers=4, bandwidth="100mbit").to_dict()
    old.pop("nproc_per_node")  # a job file written before the field
    assert BenchConfig.from_dict(old).label.endswith("x4 @ 100mbit") and BenchConfig.from_dict(old).hosts == 4
    with pytest.raises(CaramelError, match="nproc_per_node must be a positive integer dividing the 4 workers"):
        BenchConfig(model="resnet18", workers=4, bandwidth="100mbit", nproc_per_node=3)
    with pytest.raises(CaramelError, match="takes a pinned bandwidth and no uneven workers; got slow_worker"):
        BenchConfig(model="resnet18", workers=4, bandwidth="100mbit", nproc_per_node=2, slow_worker=[1, 2.0])
    with pytest.raises(CaramelError, match="got comm_ratio"):
        BenchConfig(model="resnet18", workers=4, comm_ratio=1.0, nproc_per_node=2)


def test_a_record_labels_its_configuration_as_the_job_did():
    """The saved prediction inputs are keyed by the records' label: both must carry the hosts."""
    from caramel.bench.record import Record, config_label

    c = BenchConfig(model="resnet18", workers=6, bandwidth="100mbit", batch_size=8, model_options={"width": 16},
                    nproc_per_node=2)
    r = Record(model=c.model, workers=c.workers, bandwidth=c.bandwidth, strategy="ps", step_time_median_s=1.0,
               step_time_p90_s=1.0, step_time_mean_s=1.0, compute_s=0.5, comm_s=0.5, exposed_comm_s=0.5,
               reference=None, reference_step_s=None, speedup=None, efficiency=None, comm_compute_ratio=1.0,
               regime="balanced", intended_regime="custom", batch_size=8, model_options={"width": 16},
               network="netns", steps=10, grad_bytes=1, nproc_per_node=2)
    assert config_label(r) == c.label == "resnet18(b=8,width=16) x6 @ 100mbit, 3 hosts of 2"


def _args(**kw):
    base = dict(model=None, workers=None, bandwidth=None, batch_size=None, ratio=None, slow_worker=None,
                slow_link=None, jitter=None, model_option=[], nproc_per_node=None)
    return argparse.Namespace(**{**base, **kw})


def test_the_cli_counts_hosts_and_refuses_what_cannot_run():
    from caramel.bench.cli import single_config

    c = single_config(_args(workers=3, nproc_per_node=2, bandwidth="100mbit"))
    assert (c.workers, c.hosts, c.nproc_per_node) == (6, 3, 2)
    assert single_config(_args(workers=2)).nproc_per_node == 1
    with pytest.raises(CaramelError, match="--nproc-per-node 2 needs a pinned --bandwidth"):
        single_config(_args(nproc_per_node=2))
    with pytest.raises(CaramelError, match="--nproc-per-node must be a positive integer"):
        single_config(_args(nproc_per_node=0, bandwidth="100mbit"))


def test_several_ranks_per_host_never_run_on_unshaped_loopback():
    from caramel.bench.jobs import launch_job

    with pytest.raises(CaramelError, match="2 ranks per host need the emulated cluster"):
        launch_job({}, 2, None, "loopback", timeout_s=5, nproc_per_node=2)


def _profile():
    from caramel.sim.synthetic import synthetic_profile

    return synthetic_profile(sizes_bytes=[400_000 - 30_000 * k for k in range(12)], forward_time_s=0.02,
                             backward_time_s=0.04, optimizer_time_s=0.002)


def test_the_layout_reaches_the_hierarchical_prediction_and_without_it_none_is_made():
    from caramel.bench.prediction import job_predictions

    layout = {"workers_per_node": 2, "backend": "gloo", "node_bandwidth_bps": 8e9}
    args = (_profile(), ["ps", "ps:hierarchical=true"], 4, 4_000_000, 0.5, 1, [0.07] * 4, [[]] * 4, None)
    out = job_predictions(*args, layout=layout)
    meta = out["prediction_inputs"]["clusters"]["base"]["meta"]
    assert {k: meta[k] for k in layout} == layout
    assert out["predicted"]["ps:hierarchical=true"]["step_time_s"] > 0
    assert out["predicted_rate_only"]["ps:hierarchical=true"]["step_time_s"] > 0
    # the within-host rate is a real input: a slower one gives a slower step
    slow = job_predictions(*args, layout=dict(layout, node_bandwidth_bps=1e7))["predicted"]
    assert slow["ps:hierarchical=true"]["step_time_s"] > out["predicted"]["ps:hierarchical=true"]["step_time_s"]
    bare = job_predictions(*args)["predicted"]["ps:hierarchical=true"]
    assert bare["step_time_s"] is None and "meta.workers_per_node" in bare["error"]


class _FakeDist:
    """Rank `rank` of `world`, 3 ranks a host: logs its point-to-point calls; the gather returns
    this rank's value beside fixed ones from the other host (a spawned job would take a minute
    on the loaded host; the bench runs in docs/results/ps_hier_validation/ ran the real one)."""

    def __init__(self, rank, world):
        self.rank, self.world, self.calls = rank, world, []

    def get_rank(self):
        return self.rank

    def get_world_size(self):
        return self.world

    def barrier(self):
        self.calls.append(("barrier",))

    def send(self, buf, dst):
        self.calls.append(("send", dst, buf.numel() * 4))

    def recv(self, buf, src):
        self.calls.append(("recv", src, buf.numel() * 4))

    def all_gather_object(self, out, value):
        out[:] = [value, None, None, 0.004, None, None] if self.rank < 3 else [0.004, None, None, value, None, None]


def test_the_node_probe_pairs_each_hosts_first_rank_with_its_others_and_takes_half_a_round_trip(monkeypatch):
    import caramel.bench.node_probe as probe

    clock = iter(x * 0.002 for x in range(100))  # every perf_counter reading 2 ms after the last
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock))
    fake = _FakeDist(3, 6)  # the second host's first rank
    monkeypatch.setattr(probe, "dist", fake)
    out = probe.probe_node_rate(400_000, 3, reps=2)
    p2p = [c for c in fake.calls if c[0] != "barrier"]
    # one untimed and 2 timed round trips with rank 4, then with rank 5, each a send then a receive
    assert p2p == [(k, peer, 400_000) for peer in (4, 5) for _ in range(3) for k in ("send", "recv")]
    assert out["copy_s"] == [0.004, 0.001] and out["bytes"] == 400_000  # (2 ms) / 2 per one-way copy
    assert out["node_bandwidth_bps"] == pytest.approx(400_000 * 8 / 0.0025)  # over the hosts' median
    assert probe.probe_node_rate(400_000, 1) is None  # one rank per host: nothing to probe
    other = _FakeDist(4, 6)
    monkeypatch.setattr(probe, "dist", other)
    monkeypatch.setattr(probe.time, "perf_counter", lambda: 0.0)
    probe.probe_node_rate(400_000, 3, reps=2)
    assert [c for c in other.calls if c[0] != "barrier"] == [(k, 3, 400_000) for _ in range(3) for k in ("recv", "send")]


def test_one_host_of_several_ranks_is_refused_and_one_rank_per_host_keeps_the_matrix():
    from caramel.bench.cli import select

    with pytest.raises(CaramelError, match=r"several ranks per host need 2\+ hosts \(--workers\), got 1 host of 2"):
        BenchConfig(model="resnet18", workers=2, bandwidth="100mbit", nproc_per_node=2)
    with pytest.raises(CaramelError, match="got 1 host of 2"):
        single_config_of(workers=1, nproc_per_node=2, bandwidth="100mbit")
    # --nproc-per-node 1 is the default layout: the matrix runs, not one default configuration
    matrix, _ = select(_parsed())
    assert len(select(_parsed("--nproc-per-node", "1"))[0]) == len(matrix) > 1
    assert len(select(_parsed("--nproc-per-node", "2", "--bandwidth", "100mbit"))[0]) == 1


def _parsed(*argv):
    import caramel.bench.cli as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def single_config_of(**kw):
    from caramel.bench.cli import single_config

    return single_config(_args(**kw))


def test_the_bench_launches_hosts_of_k_ranks(monkeypatch, tmp_path):
    """`--workers 3 --nproc-per-node 2`: the launcher gets 3 hosts of 2 (6 ranks), not 6 hosts."""
    import caramel.bench.cli as cli

    args = _parsed("--workers", "3", "--nproc-per-node", "2", "--bandwidth", "100mbit",
                   "--strategies", "ps:hierarchical=true", "--json", str(tmp_path / "out.json"))
    seen = []

    class Launched(Exception):
        pass

    def fake_launch(job, hosts, bandwidth, network, **kw):
        seen.append((hosts, kw.get("nproc_per_node"), job["config"]["workers"], bandwidth, network))
        raise Launched

    monkeypatch.setattr(cli, "_network_for", lambda args, config: "cluster")
    monkeypatch.setattr(cli, "launch_job", fake_launch)
    with pytest.raises(Launched):
        cli.run(args)
    assert seen == [(3, 2, 6, "100mbit", "cluster")]


def test_a_job_whose_launcher_started_another_world_is_refused(monkeypatch):
    import caramel.bench.harness as harness
    from caramel.bench.harness import make_job
    from caramel.bench.matrix import BenchSettings, parse_strategies

    config = BenchConfig(model="resnet18", workers=6, bandwidth="100mbit", nproc_per_node=2)
    job = make_job(config, BenchSettings(rounds=1, steps_per_round=1, warmup_steps=0), parse_strategies("ps"),
                   "netns", None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(harness, "_init_process_group", lambda timeout_s: (0, 12, None))  # 6 hosts of 2
    monkeypatch.setattr(harness.dist, "get_backend", lambda: "gloo")
    with pytest.raises(CaramelError, match=r"bench job for 6 ranks \(3 hosts of 2\), but the launcher started 12"):
        harness.run_job(job)


class _TimedDist(_FakeDist):
    """Rank 0 of one host of 3, on a clock the transfers move: each pair's first receive (the
    connection's set-up) takes 50 ms, every later one 2 ms."""

    def __init__(self):
        super().__init__(0, 3)
        self.now, self.first = 0.0, set()

    def recv(self, buf, src):
        super().recv(buf, src)
        self.now += 0.002 if src in self.first else 0.050
        self.first.add(src)

    def all_gather_object(self, out, value):
        out[:] = [value, None, None]


def test_the_node_probe_leaves_each_pairs_first_round_trip_out(monkeypatch):
    import caramel.bench.node_probe as probe

    fake = _TimedDist()
    monkeypatch.setattr(probe, "dist", fake)
    monkeypatch.setattr(probe.time, "perf_counter", lambda: fake.now)
    out = probe.probe_node_rate(400_000, 3, reps=1)  # one timed trip a pair: a timed set-up would show
    assert out["copy_s"] == [pytest.approx(0.001)]  # 2 ms / 2, not (50 ms / 2 + 1 ms) / 2
