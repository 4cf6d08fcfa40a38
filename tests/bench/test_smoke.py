"""A 2-worker bench on loopback, end to end: launcher, harness, strategies, baselines, reports.

Local workers (torchrun --standalone on 127.0.0.1 with a free port), a tiny model and few
steps; the job's own wall-clock limit (--timeout) stops it long before pytest's.
"""
import json
import pytest

from caramel.cli import main

pytestmark = pytest.mark.timeout(150)


def test_two_worker_smoke_bench_on_loopback(tmp_path, capsys):
    out, md, trace = tmp_path / "bench.json", tmp_path / "bench.md", tmp_path / "trace"
    rc = main(["bench", "--model", "tiny_gpt", "--workers", "2", "--network", "loopback",
               "--strategies", "ddp,caramel,caramel:planner=fifo,overlap=backward,ddp:comm_priority=auto",
               "--rounds", "2", "--steps", "3", "--warmup", "1", "--timeout", "100",
               "--json", str(out), "--markdown", str(md), "--trace", str(trace)])
    printed = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["format"] == "caramel.bench/1"
    recs = {r["strategy"]: r for r in data["records"]}
    assert set(recs) == {"ddp", "caramel", "caramel:overlap=backward,planner=fifo", "ddp:comm_priority=auto"}
    for r in recs.values():
        assert r["skipped"] is None, r["skipped"]
        assert r["workers"] == 2 and r["model"] == "tiny_gpt" and r["network"] == "loopback (unshaped)"
        assert r["steps"] == 6  # 2 rounds x 3 measured steps
        assert 0 < r["step_time_median_s"] <= r["step_time_p90_s"]
        assert r["compute_s"] > 0 and r["comm_s"] > 0 and r["concurrent_s"] > 0
        assert r["speedup_vs_ddp"] == pytest.approx(recs["ddp"]["step_time_median_s"] / r["step_time_median_s"])
    assert recs["ddp"]["speedup_vs_ddp"] == 1.0
    assert "caramel:overlap=backward,planner=fifo" in printed and "Targets" in printed
    assert "caramel bench --model tiny_gpt" in md.read_text()
    # the engine wrote one timeline per caramel strategy and rank, and the report summarizes it;
    # rank 0 of each left the profile and cluster its plan was made from beside its timeline
    names = sorted(p.name for p in trace.rglob("*.json"))
    assert len([n for n in names if n.endswith((".rank0.json", ".rank1.json"))]) == 4, names
    assert len([n for n in names if n.endswith((".rank0.profile.json", ".rank0.cluster.json"))]) == 4, names
    assert len(names) == 8, names
    assert recs["caramel"]["timeline"]["compute_s"] > 0 and recs["ddp"]["timeline"] is None
    fifo = recs["caramel:overlap=backward,planner=fifo"]["plan"]
    assert fifo["planner"] == "fifo" and fifo["items"] >= 1 and recs["ddp"]["plan"] is None
    assert "timeline (mean per step)" in md.read_text()
    # the engine's communication threads, and those of DDP's own group when asked: the priority they got
    for name in ("caramel", "ddp:comm_priority=auto"):
        prio = recs[name]["comm_priority"]
        assert prio["mode"] == "auto" and prio["applied"] in ("realtime", "normal"), prio
        assert (prio["applied"] == "realtime") == (prio["reason"] is None) == (prio["threads"] > 0), prio
    assert recs["ddp"]["comm_priority"] is None
    # the comm-only and concurrent baselines ran at the priority the engine's threads get by default
    base = recs["ddp"]["baseline_priority"]
    assert base["mode"] == "auto" and base["applied"] == recs["caramel"]["comm_priority"]["applied"], base
    assert all(r["baseline_priority"] == base for r in recs.values())
    assert ("baselines' communication threads at real-time priority" in md.read_text()) == (base["applied"] == "realtime")


@pytest.mark.parametrize("args", [["--strategies", "ddp,fast"], ["--model", "nope"], ["--bandwidth", "fast"],
                                  ["--workers", "0"], ["--model", "missing.py:f"], ["--quick", "--workers", "2"],
                                  ["--network", "cluster", "--model", "tiny_gpt"], ["--mtu", "jumbo"]])
def test_bad_input_is_one_line_and_exit_2(args, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("caramel bench: error:"), err
