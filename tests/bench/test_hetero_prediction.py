"""A heterogeneous configuration's slow link, jitter and slow worker in the predictions' cluster."""
import pytest

from caramel.errors import CaramelError

from caramel.bench.hetero import JitterSchedule, link_rates_bps
from caramel.bench.hetero_prediction import Heterogeneity
from caramel.bench.prediction import job_predictions, predict_strategies, prediction_clusters
from caramel.sim.synthetic import synthetic_profile
from caramel.sim.jitter import jitter_factors
from caramel.strategies.gossip.links import link_rate_Bps

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
    assert link_rates_bps(1e9, 4, [2, 4.0]) == [1e9, 1e9, 2.5e8, 1e9]
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
    unit_s = PER_SAMPLE_S * BATCH  # the calibrated compute per step the bench's sleep is a multiple of
    unpadded = [0.100, 0.090, 0.100, 0.110]  # as the harness measured them, step by step
    hetero = _jitter()
    hetero.unpadded_compute_s = unpadded
    padded = [c + unit_s for c in unpadded]
    clusters = prediction_clusters(profile, 4, 2e8, padded, hetero=hetero)
    assert set(clusters) == {"base", "jitter"}
    jit = clusters["jitter"]
    assert jit.meta["compute_jitter"] == {"rank": 1, "fraction": 0.5, "seed": 3, "pause_after_forward": True,
                                          "pause_unit_s": pytest.approx(unit_s)}
    assert [w.speed for w in jit.workers] == pytest.approx([profile.step_time_s / c for c in unpadded])
    assert [w.speed for w in clusters["base"].workers] == pytest.approx([profile.step_time_s / c for c in padded])
    assert "compute_jitter" not in clusters["base"].meta
    # the simulator draws the factors the bench's schedule sleeps by: the same seeded distribution
    draws, nominal = jitter_factors(jit, 20)
    schedule = JitterSchedule(0.5, 3)
    assert draws[1] == pytest.approx([schedule.next() for _ in range(20)]) and nominal == pytest.approx(2.0)
    assert draws[0] == [1.0] * 20

    preds = predict_strategies(profile, NAMES, 4, 2e8, padded, hetero=hetero)
    for name in (GOSSIP, "ddp", "caramel"):  # the all-reduce models pause after the forward (`caramel.sim.jitter`)
        assert preds[name]["cluster"] == "jitter" and "ignores" not in preds[name]
    assert preds["ps"]["cluster"] == "base" and preds["ps"]["ignores"] == ["jitter"]  # no per-step variation
    steady = predict_strategies(profile, [GOSSIP], 4, 2e8, padded)[GOSSIP]["step_time_s"]
    assert preds[GOSSIP]["step_time_s"] != pytest.approx(steady)  # the draws move the gossip prediction


def test_the_all_reduce_prediction_waits_for_the_jittered_draws():
    """ddp and caramel on the jitter cluster: workers of equal speed, so each step is the step
    without pauses plus the longest pause of the step, rank 1's (2 x draw - 1) x 64 ms against
    the others' 64 ms of padding; the prediction is their mean over the steady steps."""
    import dataclasses
    import statistics

    from caramel.sim.jitter import JITTER_STEPS
    from caramel.strategies.recommend import predict

    profile = synthetic_profile(6)
    hetero = _jitter()
    hetero.unpadded_compute_s = [0.1] * 4
    padded = [0.1 + PER_SAMPLE_S * BATCH] * 4
    preds = predict_strategies(profile, ["ddp", "caramel"], 4, 2e8, padded, hetero=hetero)
    jit = prediction_clusters(profile, 4, 2e8, padded, hetero=hetero)["jitter"]
    calm = dataclasses.replace(jit, meta={k: v for k, v in jit.meta.items() if k != "compute_jitter"})
    schedule = JitterSchedule(0.5, 3)
    unit_s = PER_SAMPLE_S * BATCH
    longest = [max(unit_s, schedule.sleep_factor() * unit_s) for _ in range(JITTER_STEPS + 1)][1:]
    for name in ("ddp", "caramel"):
        (p,) = predict(profile, calm, [name])
        assert preds[name]["step_time_s"] == pytest.approx(p.step_time_s + statistics.fmean(longest), rel=1e-9)
        assert preds[name]["step_time_s"] > p.step_time_s + unit_s  # E[max] is above the padding alone


def _jittered_compute():
    """A compute-only runner of a small linear model jittered as the bench's --jitter does
    (fraction 0.5, seed 3, 0.1 ms per sample), and its schedule."""
    import torch

    from caramel.bench.baselines import ComputeOnly
    from caramel.bench.hetero import jitter_down

    model = torch.nn.Linear(4, 2)
    schedule = JitterSchedule(0.5, 3)
    jitter_down(model, 1e-4, schedule)
    compute = ComputeOnly(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 4), torch.randn(8, 2),
                          torch.nn.MSELoss(), torch.device("cpu"))
    compute.jitter = schedule
    return compute, schedule


def test_the_unpadded_compute_takes_out_the_pauses_the_measured_steps_slept():
    """The compute-only runner records its own steps' pauses (not the concurrent baseline's,
    which trains the same model): each measured step less its own pause is the compute."""
    import statistics

    import torch

    from caramel.bench.blocks import measure_block
    from caramel.bench.hetero_prediction import unpadded_median_s

    torch.manual_seed(0)
    compute, schedule = _jittered_compute()
    compute.step()  # a warm-up step
    compute.start_measuring()
    times = measure_block(compute, 5)
    compute.run()  # what the concurrent baseline's compute calls: its draw is not recorded
    times += measure_block(compute, 5)
    assert len(schedule.slept_s) == 1 + 6 + 1 + 6 and len(compute.paused_s) == 12
    measured = schedule.slept_s[2:7] + schedule.slept_s[9:]  # the entry steps and the unrecorded one dropped
    assert [p for i, p in enumerate(compute.paused_s) if i % 6] == measured
    assert unpadded_median_s(times, compute.paused_s, 5) == pytest.approx(
        statistics.median(t - p for t, p in zip(times, measured)))
    with pytest.raises(CaramelError, match="do not align"):
        unpadded_median_s(times[:-1], compute.paused_s, 5)


def test_the_jittered_rank_is_not_faster_than_identical_workers():
    """A file with the padded medians only: the jittered rank's draws in the baseline's steps
    had a median below 1 (fewer than infinitely many), so its padded median is lower; taking
    out the median pause at a draw of 1 would make it a faster worker. The ranks do the same
    work: it runs at the others' pace."""
    profile = synthetic_profile(6)
    hetero = _jitter()
    unit_s = PER_SAMPLE_S * BATCH
    padded = [0.1 + unit_s, 0.1 + (2 * 0.9 - 1) * unit_s, 0.1 + unit_s, 0.1 + unit_s]  # rank 1's draws: median 0.9
    speeds = [w.speed for w in prediction_clusters(profile, 4, 2e8, padded, hetero=hetero)["jitter"].workers]
    assert speeds[1] <= max(speeds[:1] + speeds[2:]) * (1 + 1e-9)
    assert speeds == pytest.approx([profile.step_time_s / 0.1] * 4)


def test_a_pause_beyond_the_measured_compute_marks_the_jitter_ignored():
    """A calibration slower than the compute measured later: the pause is more than the padded
    median, no unpadded speed exists, and the gossip prediction says it ran without the jitter."""
    profile = synthetic_profile(6)
    hetero = _jitter()  # the pause at the median: 64 ms
    padded = [0.05] * 4
    clusters = prediction_clusters(profile, 4, 2e8, padded, hetero=hetero)
    assert set(clusters) == {"base"}
    preds = predict_strategies(profile, [GOSSIP, "ddp"], 4, 2e8, padded, hetero=hetero)
    assert preds[GOSSIP]["cluster"] == "base" and preds[GOSSIP]["ignores"] == ["jitter"]
    assert "at least rank(s) 0, 1, 2, 3's measured compute" in preds[GOSSIP]["note"]
    assert preds[GOSSIP]["step_time_s"] > 0


@pytest.mark.parametrize("hetero, match", [
    ({"slow_links": [1, 2.0]}, r"heterogeneity: unknown key\(s\) 'slow_links'; expected slow_link, jitter"),
    ({"slow_link": [1]}, r"heterogeneity.slow_link must be \[rank, factor >= 1\], got \[1\]"),
    ({"slow_link": [1, 0.5]}, "heterogeneity.slow_link"),
    ({"jitter": {"rank": 1, "fraction": 0.5}}, "heterogeneity.jitter must be a dict with at least rank, fraction, seed"),
    ({"jitter": {"rank": 1, "fraction": 1.5, "seed": 0, "compute_per_sample_s": 1e-3}}, r"a fraction in \(0, 1\)"),
    ({"local_batch": 0}, "heterogeneity.local_batch must be an integer >= 1"),
    ({"slow_worker": {"rank": "1"}}, "heterogeneity.slow_worker must be a dict with an int rank"),
    ([1, 2], "heterogeneity must be a dict"),
])
def test_bad_heterogeneity_is_one_clear_error(hetero, match):
    with pytest.raises(CaramelError, match=match):
        Heterogeneity.from_dict(hetero)


def test_a_rank_outside_the_workers_or_a_jitter_without_its_batch_is_one_clear_error():
    profile = synthetic_profile(6)
    with pytest.raises(CaramelError, match=r"heterogeneity.slow_link: rank must be an int in 0..3 .*got 4"):
        predict_strategies(profile, NAMES, 4, 2e8, hetero=Heterogeneity(slow_link=[4, 2.0]))
    with pytest.raises(CaramelError, match=r"heterogeneity.jitter: rank must be an int in 0..1"):
        prediction_clusters(profile, 2, 2e8, hetero=_jitter(rank=2))
    no_batch = Heterogeneity(jitter=_jitter().jitter)
    with pytest.raises(CaramelError, match="heterogeneity.local_batch: the jitter's pause needs the local batch"):
        predict_strategies(profile, [GOSSIP], 4, 2e8, [0.2] * 4, hetero=no_batch)


def test_a_slow_worker_is_its_speed_and_every_simulator_takes_it():
    profile = synthetic_profile(6)
    hetero = Heterogeneity(slow_worker={"rank": 3, "factor": 3.0, "method": "calibrated delay"})
    compute = [profile.step_time_s] * 3 + [3 * profile.step_time_s]
    (base,) = prediction_clusters(profile, 4, 2e8, compute, hetero=hetero).values()
    assert [w.speed for w in base.workers] == pytest.approx([1, 1, 1, 1 / 3])
    preds = predict_strategies(profile, NAMES, 4, 2e8, compute, hetero=hetero)
    assert all("ignores" not in p for p in preds.values())
    assert Heterogeneity(slow_link=[0, 2.0], slow_worker={"rank": 1}).ignored_by("pipeline") == ["slow_link"]


def test_the_written_file_replays_every_prediction(tmp_path):
    """The bench's path: the job's predictions, its records, the file with meta
    `prediction_inputs` keyed by the records' label; read back, each record's prediction (and
    the rate-only one) replays from the file alone on the cluster the record names."""
    from caramel.bench.report import config_label, read_records, summarize, write_records
    from caramel.profile.model_profile import ModelProfile
    from caramel.strategies.recommend import predict
    from caramel.topology.spec import ClusterSpec

    profile = synthetic_profile(6)
    hetero = _jitter()
    hetero.slow_link, hetero.unpadded_compute_s = [2, 4.0], [profile.step_time_s] * 4
    compute = [profile.step_time_s + hetero.pause_s()] * 4
    names = [GOSSIP, "ddp", "ps"]
    out = job_predictions(profile, names, 4, 2_000_000, 0.05, 1, compute, [[] for _ in range(4)], None, hetero=hetero)
    times = {n: [[0.2] * 4] * 4 for n in ("compute", "comm", *names)}
    raw = {"format": "caramel.bench_raw/1", "settings": {"steps_per_round": 4},
           "config": {"model": "mlp", "workers": 4, "bandwidth": "300mbit", "batch_size": BATCH, "model_options": {},
                      "slow_link": [2, 4.0], "jitter": [1, 0.5, 3]},
           "strategies": [{"kind": n.split(":")[0], "options": {}, "name": n} for n in names],
           "step_times_s": times, "meta": {"network": "netns+tc 300mbit", "grad_bytes": 2_000_000}, **out}
    records = summarize(raw)
    label = config_label(records[0])
    assert label == "mlp(b=32) x4 @ 300mbit, rank 2's link /4, rank 1 jitter +/-0.5 (seed 3)"
    write_records(tmp_path / "bench.json", records, {"prediction_inputs": {label: raw["prediction_inputs"]}})

    back = read_records(tmp_path / "bench.json")
    assert [r.prediction_cluster for r in back.records] == ["jitter", "jitter", "base"]  # ddp pauses too (caramel.sim.jitter)
    for r in back.records:
        inputs = back.meta["prediction_inputs"][config_label(r)]
        replayed = ModelProfile.from_dict(inputs["profile"])
        for clusters, predicted_s in (("clusters", r.predicted_step_s), ("clusters_rate_only", r.predicted_rate_only_s)):
            (p,) = predict(replayed, ClusterSpec.from_dict(inputs[clusters][r.prediction_cluster]), [r.strategy])
            assert p.step_time_s == pytest.approx(predicted_s)
    assert back.records[1].prediction_ignores is None
    assert back.records[2].prediction_ignores == ["slow_link", "jitter"]


def test_a_file_of_the_previous_format_still_loads():
    """docs/results holds caramel.bench/2 files (no slow_link, jitter or prediction_cluster keys)."""
    from pathlib import Path

    from caramel.bench.report import read_records
    from caramel.bench.tables import format_predictions

    path = Path(__file__).resolve().parents[2] / "docs/results/bench-hetero-pred-jitter.json"
    back = read_records(path)
    assert len(back.records) == 4 and all(r.prediction_cluster is None and r.jitter is None for r in back.records)
    assert "[prediction ignores jitter]" in format_predictions(back.records)


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


def _records(predicted: dict, names=("ddp", "caramel", "ps")):
    from caramel.bench.report import summarize

    medians = {"ddp": 0.2, "caramel": 0.25, "ps": 0.3}
    times = {"compute": [[0.1] * 3] * 2, "comm": [[0.08] * 3] * 2, **{n: [[medians[n]] * 3] * 2 for n in names}}
    raw = {"format": "caramel.bench_raw/1",
           "config": {"model": "mlp", "workers": 2, "bandwidth": "300mbit", "batch_size": 8, "model_options": {}},
           "strategies": [{"kind": n, "options": {}, "name": n} for n in names],
           "step_times_s": times, "meta": {"network": "netns+tc 300mbit", "grad_bytes": 1000}, "predicted": predicted}
    return summarize(raw)


def test_the_recommendation_check_leaves_out_the_marked_predictions():
    """ddp is measured fastest, but its prediction ignores the jitter: the check picks among
    caramel and ps only, and says how many rows it left out."""
    from caramel.bench.prediction import recommendation_checks
    from caramel.bench.tables import config_label, format_predictions

    recs = _records({"ddp": {"step_time_s": 0.1, "exact": True, "ignores": ["jitter"]},
                     "caramel": {"step_time_s": 0.3, "exact": True}, "ps": {"step_time_s": 0.2, "exact": True}})
    (check,) = recommendation_checks(recs, config_label)
    assert (check.recommended, check.fastest) == ("ps", "caramel")  # ddp, the measured fastest, is not in the pool
    text = format_predictions(recs)
    assert "parameters; 1 row(s) whose simulator ignores the configuration's heterogeneity left out)" in text
    assert "recommended ps (300.0 ms), measured fastest caramel (250.0 ms): miss, +20%" in text


def test_a_configuration_whose_predictions_are_all_marked_says_so():
    from caramel.bench.tables import format_predictions

    recs = _records({n: {"step_time_s": 0.1, "exact": True, "ignores": ["jitter"]} for n in ("ddp", "caramel")},
                    names=("ddp", "caramel"))
    text = format_predictions(recs)
    assert "Recommendation" not in text and "Accuracy per strategy kind" not in text
    assert "every one of the 2 predicted row(s) comes from a simulator that ignores" in text


def test_the_concurrent_baseline_records_its_steps_padding(monkeypatch):
    """Under --jitter each concurrent step records the sleep its compute took (all of it inside
    the compute), and the heterogeneity carries it to the factor, validated on the way in."""
    import torch

    from caramel.bench.baselines import CommOnly, Concurrent
    from caramel.bench.hetero_prediction import Heterogeneity

    compute, schedule = _jittered_compute()

    class Done:  # a collective already finished when issued
        def get_future(self):
            fut = torch.futures.Future()
            fut.set_result(None)
            return fut

    monkeypatch.setattr(CommOnly, "issue", lambda self: [Done()])
    comm = CommOnly.__new__(CommOnly)
    comm.device = torch.device("cpu")
    concurrent = Concurrent(compute, comm)
    for _ in range(3):
        concurrent.step()
    assert len(concurrent.padding) == len(concurrent.spans) == 3
    for (took_s, _, _), (slept_s, _, started), pause_s in zip(concurrent.spans, concurrent.padding, schedule.slept_s):
        assert pause_s <= slept_s <= took_s and started == 0
    with pytest.raises(CaramelError, match="concurrent_pauses"):
        Heterogeneity.from_dict({"concurrent_pauses": [[[0.1, 0.1]]]})
    with pytest.raises(CaramelError, match="concurrent_pauses"):
        Heterogeneity(unpadded_compute_s=[0.01], concurrent_pauses=[[[0.0, 0.0, 0]]]).contention_inputs(
            [0.02], [[(0.03, 0.01, 1)] * 2])


def test_under_jitter_each_cluster_takes_the_factor_of_its_own_compute():
    """Compute 30 ms slowed 1.5x through a 20 ms overlap, then a 40 ms sleep in it
    (test_contention's construction): the "base" cluster, its speeds from the padded medians,
    takes the factor on the padded spans (diluted, < 1.2); the "jitter" cluster, speeds from the
    unpadded medians, the one on the spans less the sleeps (1.5). Both are recorded."""
    from caramel.bench.contention import job_slowdown
    from caramel.bench.prediction import contention_factors

    c, f, o, sleep = 0.030, 1.5, 0.020, 0.040
    beside = c + o - o / f
    padded = [[(beside + sleep, o + sleep, 1)] * 3 for _ in range(2)]
    hetero = Heterogeneity(jitter={"rank": 1, "fraction": 0.5, "seed": 3, "compute_per_sample_s": sleep / BATCH,
                                   "nominal_factor": 2.0}, local_batch=BATCH, unpadded_compute_s=[c, c],
                           concurrent_pauses=[[[sleep, sleep, 0]] * 3 for _ in range(2)])
    profile = synthetic_profile(6)
    out = job_predictions(profile, ["ddp", "ps"], 2, 2_000_000, 0.05, 1, [c + sleep] * 2, padded, None, hetero=hetero)
    base_f = job_slowdown([c + sleep] * 2, padded, 0.0)
    assert base_f < 1.2
    assert contention_factors([c + sleep] * 2, padded, None, hetero) == pytest.approx((base_f, f))
    clusters = out["prediction_inputs"]["clusters"]
    assert clusters["base"]["compute_slowdown"] == pytest.approx(base_f)
    assert clusters["jitter"]["compute_slowdown"] == pytest.approx(f)
    assert out["compute_slowdown"] == pytest.approx(base_f)
    assert out["prediction_inputs"]["compute_slowdowns"] == pytest.approx({"base": base_f, "jitter": f})
    assert out["predicted"]["ddp"]["cluster"] == "jitter" and out["predicted"]["ps"]["cluster"] == "base"
    # the records keep a per-rank median of the paddings, not every step (the trace keeps those)
    assert "concurrent_pauses" not in out["prediction_inputs"]["heterogeneity"]
    assert out["prediction_inputs"]["concurrent_padding_median"] == [[sleep, sleep, 0]] * 2
    assert Heterogeneity.from_dict(out["prediction_inputs"]["heterogeneity"]).unpadded_compute_s == [c, c]
    # without the paddings, one factor for both
    plain = Heterogeneity(jitter=hetero.jitter, local_batch=BATCH, unpadded_compute_s=[c, c])
    assert contention_factors([c + sleep] * 2, padded, None, plain) == pytest.approx((base_f, base_f))


def test_the_jobs_gathered_pauses_reach_the_jitter_clusters_factor():
    """The harness's path: what the ranks gathered (`job_heterogeneity`) into `job_predictions`;
    the "jitter" cluster's factor is the unpadded one, the "base" one the padded."""
    from caramel.bench.hetero_prediction import job_heterogeneity

    c, f, o, sleep, steps = 0.030, 1.5, 0.020, 0.040, 3
    beside = c + o - o / f
    padded = [[(beside + sleep, o + sleep, 1)] * steps for _ in range(2)]
    jitter = {"rank": 1, "fraction": 0.5, "seed": 3, "compute_per_sample_s": sleep / BATCH, "nominal_factor": 2.0}
    # one round: an unmeasured entry step, then `steps` measured ones, each slept `sleep`
    hetero = job_heterogeneity(None, jitter, None, BATCH, [[c + sleep] * steps] * 2, [[sleep] * (steps + 1)] * 2,
                               [[(sleep, sleep, 0)] * steps] * 2, steps)
    assert hetero.unpadded_compute_s == pytest.approx([c, c])
    out = job_predictions(synthetic_profile(6), ["ddp"], 2, 2_000_000, 0.05, 1, [c + sleep] * 2, padded, None,
                          hetero=hetero)
    clusters = out["prediction_inputs"]["clusters"]
    assert clusters["jitter"]["compute_slowdown"] == pytest.approx(f)
    assert clusters["base"]["compute_slowdown"] < 1.2


def test_the_pipeline_runtime_plans_at_the_factor_its_prediction_runs_on():
    """Under jitter the pipeline is predicted on "base" (padded speeds and factor); the spec its
    runtime plans at (`plan_cluster`) takes the same speeds and factor."""
    from caramel.bench.pipeline_plan import plan_cluster

    c, f, o, sleep = 0.030, 1.5, 0.020, 0.040
    padded = [[(c + o - o / f + sleep, o + sleep, 1)] * 3 for _ in range(2)]
    hetero = Heterogeneity(jitter={"rank": 1, "fraction": 0.5, "seed": 3, "compute_per_sample_s": sleep / BATCH,
                                   "nominal_factor": 2.0}, local_batch=BATCH, unpadded_compute_s=[c, c],
                           concurrent_pauses=[[[sleep, sleep, 0]] * 3 for _ in range(2)])
    profile = synthetic_profile(6)
    out = job_predictions(profile, ["pipeline"], 2, 2_000_000, 0.05, 1, [c + sleep] * 2, padded, None, hetero=hetero)
    assert out["predicted"]["pipeline"]["cluster"] == "base"
    base = out["prediction_inputs"]["clusters"]["base"]
    plan = plan_cluster(profile, 2, 2_000_000, 0.05, 1, [c + sleep] * 2, padded, None)
    assert plan.compute_slowdown == pytest.approx(base["compute_slowdown"]) and plan.compute_slowdown < 1.2
    assert [w.speed for w in plan.workers] == pytest.approx([w["speed"] for w in base["workers"]])
