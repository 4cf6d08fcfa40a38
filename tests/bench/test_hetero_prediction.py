"""A heterogeneous configuration's slow link, jitter and slow worker in the predictions' cluster."""
import pytest

from caramel.bench.hetero import JitterSchedule, link_rates_bps
from caramel.bench.hetero_prediction import Heterogeneity
from caramel.bench.prediction import job_predictions, predict_strategies, prediction_clusters
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.gossip.links import jitter_factors, link_rate_Bps

GOSSIP = "gossip:topology=ring"
NAMES = ["ddp", "caramel", GOSSIP, "ps"]
BATCH, PER_SAMPLE_S = 32, 2e-3


def _jitter(rank=1, fraction=0.5, seed=3):
    return Heterogeneity(jitter={"rank": rank, "fraction": fraction, "seed": seed, "compute_per_sample_s": PER_SAMPLE_S,
                                 "nominal_factor": 1 / (1 - fraction)}, local_batch=BATCH)


def test_the_slow_link_is_each_workers_rate_in_the_shaped_ratio_at_the_achieved_bottleneck():
    profile = synthetic_profile(6)
    hetero = Heterogeneity(slow_link=[2, 4.0])
    (base,) = prediction_clusters(profile, 4, 2e8, [profile.step_time_s] * 4, hetero=hetero).values()
    # the emulated cluster shapes rank 2's veth at a quarter of the others'; the ring all-reduce
    # the rate was measured on runs at that link's rate, so the others get four times it
    shaped = link_rates_bps(1e9, 4, [2, 4.0])
    assert base.meta["worker_bandwidth_bps"] == pytest.approx([2e8 * r / min(shaped) for r in shaped])
    assert base.meta["worker_bandwidth_bps"] == pytest.approx([8e8, 8e8, 2e8, 8e8])
    assert base.bandwidth_bps == 2e8  # the all-reduce models' one rate: the bottleneck as measured
    assert link_rate_Bps(base) == pytest.approx([1e8, 1e8, 2.5e7, 1e8])  # what the gossip simulator reads, bytes/s
    preds = predict_strategies(profile, NAMES, 4, 2e8, [profile.step_time_s] * 4, hetero=hetero)
    assert preds["ps"]["ignores"] == ["slow_link"]  # prices every link at the bottleneck
    assert all("ignores" not in preds[n] for n in ("ddp", "caramel", GOSSIP))
    assert all(p["cluster"] == "base" and p["step_time_s"] > 0 for p in preds.values())
    assert "worker_bandwidth_bps" not in next(iter(prediction_clusters(profile, 4, 2e8).values())).meta


def test_the_jitter_is_the_bench_schedule_with_the_pause_after_forward_on_unpadded_speeds():
    profile = synthetic_profile(6)
    hetero = _jitter()
    pause_s = (2.0 - 1.0) * PER_SAMPLE_S * BATCH  # nominal 2 at +/-50%, the draws' median 1
    compute = [0.100, 0.100 + pause_s, 0.100 + pause_s, 0.100 + pause_s]
    padded = [c + pause_s for c in compute]
    clusters = prediction_clusters(profile, 4, 2e8, padded, hetero=hetero)
    assert set(clusters) == {"base", "jitter"}
    jit = clusters["jitter"]
    assert jit.meta["compute_jitter"] == {"rank": 1, "fraction": 0.5, "seed": 3, "pause_after_forward": True}
    assert [w.speed for w in jit.workers] == pytest.approx([profile.step_time_s / c for c in compute])
    assert [w.speed for w in clusters["base"].workers] == pytest.approx([profile.step_time_s / c for c in padded])
    assert "compute_jitter" not in clusters["base"].meta
    # the simulator draws the factors the bench's schedule sleeps by: the same seeded distribution
    draws, nominal = jitter_factors(jit, 20)
    schedule = JitterSchedule(0.5, 3)
    assert draws[1] == pytest.approx([schedule.next() for _ in range(20)]) and nominal == pytest.approx(2.0)
    assert draws[0] == [1.0] * 20

    preds = predict_strategies(profile, NAMES, 4, 2e8, padded, hetero=hetero)
    assert preds[GOSSIP]["cluster"] == "jitter" and "ignores" not in preds[GOSSIP]
    for name in ("ddp", "caramel", "ps"):  # their simulators take no per-step variation
        assert preds[name]["cluster"] == "base" and preds[name]["ignores"] == ["jitter"]
    steady = predict_strategies(profile, [GOSSIP], 4, 2e8, padded)[GOSSIP]["step_time_s"]
    assert preds[GOSSIP]["step_time_s"] != pytest.approx(steady)  # the draws move the gossip prediction


def test_a_slow_worker_is_its_speed_and_every_simulator_takes_it():
    profile = synthetic_profile(6)
    hetero = Heterogeneity(slow_worker={"rank": 3, "factor": 3.0, "method": "calibrated delay"})
    compute = [profile.step_time_s] * 3 + [3 * profile.step_time_s]
    (base,) = prediction_clusters(profile, 4, 2e8, compute, hetero=hetero).values()
    assert [w.speed for w in base.workers] == pytest.approx([1, 1, 1, 1 / 3])
    preds = predict_strategies(profile, NAMES, 4, 2e8, compute, hetero=hetero)
    assert all("ignores" not in p for p in preds.values())
    assert Heterogeneity(slow_link=[0, 2.0], slow_worker={"rank": 1}).ignored_by("pipeline") == ["slow_link"]


def test_the_job_records_what_a_replay_of_its_predictions_needs():
    profile = synthetic_profile(6)
    hetero = _jitter()
    compute = [profile.step_time_s + hetero.pause_s()] * 4
    out = job_predictions(profile, [GOSSIP, "ddp"], 4, 2_000_000, 0.05, 1, compute, [[] for _ in range(4)], None,
                          hetero=Heterogeneity(slow_link=[2, 4.0], jitter=hetero.jitter, local_batch=BATCH))
    inputs = out["prediction_inputs"]
    assert inputs["rank_compute_s"] == compute and inputs["heterogeneity"]["slow_link"] == [2, 4.0]
    assert inputs["heterogeneity"]["jitter"]["seed"] == 3 and inputs["heterogeneity"]["local_batch"] == BATCH
    assert set(inputs["clusters"]) == {"base", "jitter"}
    assert inputs["clusters"]["jitter"]["meta"]["compute_jitter"]["pause_after_forward"] is True
    assert len(inputs["clusters"]["base"]["meta"]["worker_bandwidth_bps"]) == 4
    assert out["predicted"]["ddp"]["ignores"] == ["jitter"] and out["predicted_rate_only"]["ddp"]["ignores"] == ["jitter"]
    # the record alone replays the predictions: the profile and each strategy's cluster
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies.recommend import predict
    from caramel.topology.spec import ClusterSpec

    replayed = ModelProfile.from_dict(inputs["profile"])
    for name, which in ((GOSSIP, "jitter"), ("ddp", "base")):
        (p,) = predict(replayed, ClusterSpec.from_dict(inputs["clusters"][which]), [name])
        assert p.step_time_s == pytest.approx(out["predicted"][name]["step_time_s"])


def test_a_prediction_that_ignores_an_input_is_marked_and_left_out_of_the_accuracy():
    from caramel.bench.report import summarize
    from caramel.bench.tables import format_predictions

    times = {"compute": [[0.1] * 3] * 2, "comm": [[0.08] * 3] * 2, "ddp": [[0.2] * 3] * 2, GOSSIP: [[0.15] * 3] * 2}
    raw = {"format": "caramel.bench_raw/1",
           "config": {"model": "mlp", "workers": 2, "bandwidth": "300mbit", "batch_size": 8, "model_options": {}},
           "strategies": [{"kind": s.split(":")[0], "options": {}, "name": s} for s in ("ddp", GOSSIP)],
           "step_times_s": times, "meta": {"network": "netns+tc 300mbit", "grad_bytes": 1000},
           "predicted": {"ddp": {"step_time_s": 0.14, "exact": True, "ignores": ["jitter"]},
                         GOSSIP: {"step_time_s": 0.16, "exact": False}},
           "prediction_inputs": {"rank_compute_s": [0.1, 0.1], "profile": {"model": "mlp"}}}
    recs = {r.strategy: r for r in summarize(raw)}
    assert recs["ddp"].prediction_ignores == ["jitter"] and recs[GOSSIP].prediction_ignores is None
    assert recs["ddp"].prediction_inputs == {"rank_compute_s": [0.1, 0.1]}
    text = format_predictions(list(recs.values()))
    assert "ddp 140.0 ms vs 200.0 ms (-30%) [prediction ignores jitter]" in text
    assert "1 row(s) whose simulator ignores" in text
    assert "- gossip: median 7%" in text and "- ddp:" not in text
