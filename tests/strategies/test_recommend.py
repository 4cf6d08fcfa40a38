"""The strategy recommendation: every candidate through its own simulator, the fastest exact one picked."""
import json

import pytest

from caramel.cli import main
from caramel.errors import CaramelError
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies import STRATEGIES
from caramel.strategies.recommend import Prediction, candidates, is_exact, predict, recommend
from caramel.topology.spec import ClusterSpec


def test_exactness_follows_the_training_arithmetic():
    assert is_exact("ddp") and is_exact("caramel") and is_exact("ps") and is_exact("pipeline:schedule=gpipe")
    assert not is_exact("ps:consistency=ssp:2") and is_exact("ps:consistency=ssp:0")
    assert not is_exact("gossip:topology=ring") and not is_exact("pipeline:schedule=pipedream")
    assert not is_exact("caramel:compression=fp16")


def test_predictions_are_each_strategys_own_simulator():
    profile, cluster = synthetic_profile(12, name="chain12"), ClusterSpec.uniform(4, 1e9)
    specs = candidates(4, approximate=True)
    assert specs[:3] == ["ddp", "caramel", "ps"] and "gossip:topology=ring" in specs
    preds = predict(profile, cluster, specs)
    assert [p.strategy for p in preds] == specs
    for p in preds:
        spec = STRATEGIES.spec(p.strategy)
        assert p.step_time_s == pytest.approx(spec.info.simulator()(profile, cluster, spec.options).step_time_s)
    best = recommend(preds)
    assert best.exact and best.step_time_s == min(p.step_time_s for p in preds if p.exact)
    fastest = recommend(preds, approximate=True)
    assert fastest.step_time_s == min(p.step_time_s for p in preds)
    # on a slow network the overlapped one-peer gossip, an approximate candidate, is the fastest
    one_peer = "gossip:topology=one_peer_exponential,bucket_cap_mb=0.5,algorithm=overlap"
    assert one_peer in specs
    slow = predict(profile, ClusterSpec.uniform(4, 1e8), specs)
    assert recommend(slow, approximate=True).strategy == one_peer and not recommend(slow).strategy.startswith("gossip")


def test_an_odd_world_gets_unequal_replica_pipelines_among_the_candidates():
    specs = candidates(3)
    assert "pipeline:stages=2,replicas=2+1,microbatches=4" in specs
    assert "pipeline:stages=2,replicas=1+2,microbatches=4" in specs
    assert not any("+" in s for s in candidates(4))  # an even world splits evenly
    # w - 1 virtual pipelines: offered up to the limit of 16, not past it (19 workers: 18)
    assert "pipeline:stages=2,replicas=16+1,microbatches=32" in candidates(17)
    assert not any("+" in s for s in candidates(19))
    profile, cluster = synthetic_profile(12, name="chain12"), ClusterSpec.uniform(3, 1e9)
    preds = {p.strategy: p for p in predict(profile, cluster, specs)}
    for name in ("pipeline:stages=2,replicas=2+1,microbatches=4", "pipeline:stages=2,replicas=1+2,microbatches=4"):
        assert preds[name].exact and preds[name].step_time_s > 0, preds[name]


def test_a_candidate_the_simulator_cannot_model_carries_its_reason():
    preds = predict(synthetic_profile(3), ClusterSpec.uniform(2, 1e9), ["ddp", "ps:servers=5"])
    assert preds[0].step_time_s > 0 and preds[1].step_time_s is None and "servers=5" in preds[1].error
    assert recommend(preds).strategy == "ddp"
    assert recommend([Prediction("gossip", 1.0, exact=False)]) is None


def test_a_prediction_that_ignores_the_clusters_jitter_is_marked_and_not_ranked():
    # ps's simulator does not read compute_jitter: with the jitter it stays at its even-workers step
    # while ddp's all-reduce waits for each step's longest pause, so unguarded ps would win
    profile, cluster = synthetic_profile(8), ClusterSpec.uniform(2, 1e9)
    cluster.meta["compute_jitter"] = {"rank": 0, "fraction": 0.5, "seed": 0, "pause_after_forward": True,
                                      "pause_unit_s": 0.05}
    ddp, ps = predict(profile, cluster, ["ddp", "ps"])
    assert ps.ignores == ["jitter"] and ddp.ignores is None
    assert ps.step_time_s < ddp.step_time_s
    assert recommend([ddp, ps]).strategy == "ddp"
    assert recommend([ps]) is None
    even = predict(profile, ClusterSpec.uniform(2, 1e9), ["ps"])[0]
    assert even.ignores is None and recommend([even]).strategy == "ps"


def test_a_malformed_candidate_is_one_error_before_any_simulation():
    with pytest.raises(CaramelError, match="nope"):
        predict(synthetic_profile(3), ClusterSpec.uniform(2, 1e9), ["ddp", "nope"])


def test_plan_strategy_auto_ranks_and_writes_the_recommendation(tmp_path, capsys):
    out = tmp_path / "rec.json"
    rc = main(["plan", "--synthetic", "chain8", "--workers", "2", "--bandwidth", "100mbit", "--strategy", "auto",
               "--candidates", "ddp;caramel;gossip:topology=ring", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["format"] == "caramel.recommendation/1"
    preds = {p["strategy"]: p for p in data["predictions"]}
    assert set(preds) == {"ddp", "caramel", "gossip:topology=ring"}
    assert data["recommended"] == min(("ddp", "caramel"), key=lambda n: preds[n]["step_time_s"])
    assert f"recommended: {data['recommended']}" in capsys.readouterr().out


def test_plan_says_which_candidates_ignore_the_clusters_jitter(tmp_path, capsys):
    cluster = ClusterSpec.uniform(2, 1e9)
    cluster.meta["compute_jitter"] = {"rank": 0, "fraction": 0.5, "seed": 0, "pause_after_forward": True,
                                      "pause_unit_s": 0.05}
    (tmp_path / "c.json").write_text(json.dumps(cluster.to_dict()))
    out = tmp_path / "rec.json"
    assert main(["plan", "--synthetic", "chain8", "--cluster", str(tmp_path / "c.json"), "--strategy", "auto",
                 "--candidates", "ddp;ps", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ps" in printed and "not ranked: its simulator ignores the cluster's jitter" in printed
    data = json.loads(out.read_text())
    assert data["recommended"] == "ddp"
    assert {p["strategy"]: p["ignores"] for p in data["predictions"]} == {"ddp": None, "ps": ["jitter"]}


@pytest.mark.parametrize("args, needle", [(["--strategy", "ddp"], "--strategy auto"),
                                          (["--approximate"], "--strategy auto"),
                                          (["--strategy", "auto", "--candidates", ";"], "--candidates")])
def test_plan_recommendation_bad_input_is_one_error(args, needle, capsys):
    assert main(["plan", "--synthetic", "chain4", "--workers", "2"] + args) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("reduce", ["caramel", "ddp"])
def test_a_pipeline_prediction_carries_the_simulators_busy_time_as_computed_and_as_timed(reduce, monkeypatch):
    """The bench's busy line reads both figures from the prediction's plan: they are the settled
    overlapped replay's own (`busy_s`, `timed_s`), and the timed one holds the replicas' wait."""
    from caramel.strategies.pipeline import simulate as sim_module

    replays = []
    real = sim_module.lane_meta
    monkeypatch.setattr(sim_module, "lane_meta", lambda sim, replicas: replays.append(sim) or real(sim, replicas))
    spec = f"pipeline:stages=2,replicas=2,microbatches=4,replica_reduce={reduce}"
    (pred,) = predict(synthetic_profile(12, name="chain12"), ClusterSpec.uniform(4, 1e8), [spec])
    busy, timed = pred.plan["busy_s_per_lane"], pred.plan["timed_busy_s_per_lane"]
    assert busy == replays[-1].busy_s and timed == replays[-1].timed_s and len(busy) == len(timed) == 2
    assert all(t >= b - 1e-12 for t, b in zip(timed, busy))
    # at 100 Mbit/s the reduction outlasts the step's compute: a wait lands inside a timed call
    assert max(t - b for t, b in zip(timed, busy)) > 0.01
