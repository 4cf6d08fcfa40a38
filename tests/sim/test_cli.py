"""`caramel simulate` and `caramel plan`, in process."""
import json

import pytest

from caramel.cli import main
from caramel.topology.spec import ClusterSpec
from caramel.plan.plan import Plan
from caramel.sim.synthetic import synthetic_profile
from caramel.trace.events import Trace

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def profile_path(tmp_path):
    path = tmp_path / "profile.json"
    synthetic_profile(30).save(path)
    return path


def test_simulate_table_and_json(tmp_path, profile_path, capsys):
    out = tmp_path / "sim.json"
    rc = main(["simulate", "--profile", str(profile_path), "--workers", "64", "--bandwidth", "10gbit",
               "--planner", "fifo,caramel", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "fifo" in text and "caramel" in text and "64 workers" in text
    data = json.loads(out.read_text())
    assert data["format"] == "caramel.simulation/1"
    recs = data["records"]
    assert [r["planner"] for r in recs] == ["fifo", "caramel"]
    for r in recs:
        assert r["workers"] == 64 and r["bandwidth_bps"] == 10e9
        assert r["step_time_s"] > 0 and r["exposed_comm_s"] >= 0
        assert r["lower_bound_s"] <= r["step_time_s"] * (1 + 1e-9)
    assert recs[1]["step_time_s"] <= recs[0]["step_time_s"] * (1 + 1e-9)


def test_compute_slowdown_what_if(tmp_path, profile_path, capsys):
    out = tmp_path / "sim.json"
    common = ["simulate", "--profile", str(profile_path), "--workers", "2", "--bandwidth", "1gbit", "--planner", "fifo"]
    assert main(common + ["--json", str(out)]) == 0
    calm = json.loads(out.read_text())["records"][0]
    assert main(common + ["--compute-slowdown", "2", "--json", str(out)]) == 0
    slowed = json.loads(out.read_text())["records"][0]
    assert slowed["compute_slowdown"] == 2.0 and calm["compute_slowdown"] == 1.0
    assert slowed["step_time_s"] > calm["step_time_s"]
    # a cluster spec's own factor is the default, and the flag overrides it
    spec = tmp_path / "cluster.json"
    ClusterSpec.uniform(2, 1e9, compute_slowdown=2.0).save(spec)
    from_spec = ["simulate", "--profile", str(profile_path), "--cluster", str(spec), "--planner", "fifo"]
    assert main(from_spec + ["--json", str(out)]) == 0
    assert json.loads(out.read_text())["records"][0] == slowed
    assert main(from_spec + ["--compute-slowdown", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["records"][0] == calm


def test_plan_then_simulate_the_file(tmp_path, profile_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(profile_path), "--planner", "caramel", "--workers", "4",
                 "--bandwidth", "1gbit", "--json", str(plan_path)]) == 0
    plan = Plan.load(plan_path)
    assert plan.planner == "caramel" and plan.world_size == 4
    out = tmp_path / "sim.json"
    traces = tmp_path / "traces"
    assert main(["simulate", "--profile", str(profile_path), "--workers", "4", "--bandwidth", "1gbit",
                 "--planner", "", "--plan", str(plan_path), "--trace-dir", str(traces), "--json", str(out)]) == 0
    rec = json.loads(out.read_text())["records"][0]
    assert rec["planner"] == "file:plan.json"
    assert rec["step_time_s"] == pytest.approx(plan.predicted_step_time_s, rel=1e-12)
    (trace_file,) = traces.glob("*.trace.json")
    trace = Trace.load(trace_file)
    assert trace.source == "predicted" and trace.world_size == 4


def test_cluster_file_and_overrides(tmp_path, profile_path):
    spec = tmp_path / "cluster.json"
    ClusterSpec.uniform(3, 5e8, 1e-4, collective="tree").save(spec)
    out = tmp_path / "sim.json"
    assert main(["simulate", "--profile", str(profile_path), "--cluster", str(spec), "--bandwidth", "2gbit",
                 "--planner", "fifo", "--overlap", "forward,none", "--json", str(out)]) == 0
    recs = json.loads(out.read_text())["records"]
    assert [(r["workers"], r["bandwidth_bps"], r["collective"], r["overlap"]) for r in recs] == \
        [(3, 2e9, "tree", "forward"), (3, 2e9, "tree", "none")]


def _simulated_cluster(tmp_path, profile_path, *argv: str) -> dict:
    """The cluster a `caramel sim` of the fifo plan with these flags ran on (from its --json)."""
    out = tmp_path / "sim.json"
    assert main(["simulate", "--profile", str(profile_path), "--planner", "fifo", "--json", str(out), *argv]) == 0
    return json.loads(out.read_text())["cluster"]


def test_the_queued_latency_comes_from_the_file_or_the_flag(tmp_path, profile_path, capsys):
    spec = tmp_path / "cluster.json"
    ClusterSpec.uniform(2, 5e8, 1e-3, queued_latency_s=2e-4).save(spec)
    assert _simulated_cluster(tmp_path, profile_path, "--cluster", str(spec))["queued_latency_s"] == 2e-4
    assert "latency 1000 us (200 us queued)" in capsys.readouterr().out
    assert _simulated_cluster(tmp_path, profile_path, "--cluster", str(spec), "--queued-latency", "50us")[
        "queued_latency_s"] == pytest.approx(5e-5)


def test_a_cluster_files_host_sharing_is_kept(tmp_path, profile_path):
    spec = tmp_path / "cluster.json"
    ClusterSpec.uniform(4, 5e8, alone_speedup=2.0, ranks_per_host=4).save(spec)
    kept = _simulated_cluster(tmp_path, profile_path, "--cluster", str(spec))
    assert (kept["alone_speedup"], kept["ranks_per_host"]) == (2.0, 4)
    # on fewer workers, at most that many share a host; one alone: nothing shared
    fewer = _simulated_cluster(tmp_path, profile_path, "--cluster", str(spec), "--workers", "2")
    assert (fewer["alone_speedup"], fewer["ranks_per_host"]) == (2.0, 2)
    one = _simulated_cluster(tmp_path, profile_path, "--cluster", str(spec), "--workers", "1")
    assert (one["alone_speedup"], one["ranks_per_host"]) == (1.0, 1)


def test_synthetic_source(tmp_path):
    out = tmp_path / "sim.json"
    assert main(["simulate", "--synthetic", "chain20", "--workers", "2", "--planner", "fifo", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["model"] == "chain20"


@pytest.mark.parametrize("argv,needle", [
    (["--bandwidth=-1gbit"], "bandwidth"),
    (["--bandwidth", "1 furlong"], "bandwidth"),
    (["--workers", "0"], "--workers"),
    (["--latency", "soon"], "--latency"),
    (["--overlap", "sideways"], "--overlap"),
    (["--planner", "magic"], "unknown planner"),
    (["--option", "novalue"], "--option"),
    (["--compute-slowdown", "0.5"], "compute_slowdown"),
    (["--collective-cpu", "lots"], "--collective-cpu 'lots' is not understood"),
    (["--queued-latency", "soon"], "--queued-latency 'soon' is not understood"),
    # a bare nonzero time is refused, not read as seconds (the unit rule of the --data-* times)
    (["--latency", "0.001"], "--latency '0.001' has no unit; expected a duration >= 0 with its unit (s, ms, us)"),
    (["--queued-latency", "20"], "--queued-latency '20' has no unit"),
    (["--collective-cpu", "2.32"], "--collective-cpu '2.32' has no unit"),
    (["--latency", "1m"], "--latency '1m': expected a duration >= 0 in s, ms, us"),
])
def test_bad_input_is_one_line_and_exit_2(profile_path, capsys, argv, needle):
    rc = main(["simulate", "--profile", str(profile_path), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1


def test_mismatched_plan_and_profile(tmp_path, profile_path, capsys):
    other = tmp_path / "other.json"
    synthetic_profile(5).save(other)
    plan_path = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(other), "--planner", "fifo", "--json", str(plan_path)]) == 0
    rc = main(["simulate", "--profile", str(profile_path), "--plan", str(plan_path), "--planner", ""])
    err = capsys.readouterr().err
    assert rc == 2 and "plan" in err and "parameters" in err


def test_unknown_topology_in_cluster_file(tmp_path, profile_path, capsys):
    spec = tmp_path / "cluster.json"
    data = ClusterSpec.uniform(2, 1e9).to_dict()
    data["topology"] = "hypercube"
    spec.write_text(json.dumps(data))
    rc = main(["plan", "--profile", str(profile_path), "--cluster", str(spec)])
    err = capsys.readouterr().err
    assert rc == 2 and "topology" in err and "hypercube" in err


def test_the_collective_cpu_comes_from_the_file_or_the_flag(tmp_path, profile_path):
    # a spec saved by `caramel cluster probe` keeps its value; the flag overrides it
    spec = tmp_path / "cluster.json"
    ClusterSpec.uniform(2, 5e8, 1e-3, collective_cpu_s=5e-4).save(spec)
    assert _simulated_cluster(tmp_path, profile_path, "--cluster", str(spec))["collective_cpu_s"] == 5e-4
    assert _simulated_cluster(tmp_path, profile_path, "--cluster", str(spec), "--collective-cpu", "0")[
        "collective_cpu_s"] == 0.0
    assert _simulated_cluster(tmp_path, profile_path, "--workers", "2", "--collective-cpu", "300us")[
        "collective_cpu_s"] == pytest.approx(3e-4)
