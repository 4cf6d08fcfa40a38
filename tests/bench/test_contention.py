"""Compute's slowdown beside the collectives, from the concurrent baseline, into the predictions."""
import pytest

from caramel.bench.contention import MAX_SLOWDOWN, job_slowdown, rank_slowdown
from caramel.bench.prediction import bench_cluster, predict_strategies
from caramel.errors import CaramelError, FormatError
from caramel.sim.synthetic import synthetic_profile
from caramel.topology.spec import ClusterSpec


def test_the_extra_compute_beside_the_transfers_is_charged_to_the_overlap_only():
    # 30 ms of compute alone; beside collectives in flight for 20 ms of it, it took 36 ms: those
    # 20 ms did 14 ms of its work, 20/14 times slower
    assert rank_slowdown(0.030, [(0.036, 0.020, 2)] * 3) == pytest.approx(20 / 14)
    # in flight through all of it (a communication-bound step): 45 ms over 30 ms
    assert rank_slowdown(0.030, [(0.045, 0.045, 1), (0.044, 0.044, 1), (0.046, 0.046, 1)]) == pytest.approx(1.5)
    # faster beside than alone (noise) is no slowdown; too little overlap to tell is no evidence
    assert rank_slowdown(0.030, [(0.029, 0.020, 1)]) == 1.0
    assert rank_slowdown(0.030, [(0.040, 0.002, 1)]) is None and rank_slowdown(0.030, []) is None


def test_the_pause_each_collective_costs_is_not_counted_again_as_slowdown():
    # two starts pausing it 1 ms each (the engine's collective_cpu_s): the other 18 ms of overlap
    # did 14 ms of work
    assert rank_slowdown(0.030, [(0.036, 0.020, 2)], collective_cpu_s=0.001) == pytest.approx(18 / 14)
    assert rank_slowdown(0.030, [(0.032, 0.020, 2)], collective_cpu_s=0.001) == pytest.approx(1.0)
    assert rank_slowdown(0.030, [(0.036, 0.003, 3)], collective_cpu_s=0.001) is None  # pauses only


def test_the_factor_is_the_engines_own_inverse_and_is_capped():
    from caramel.sim.event_loop import Busy

    for f, cpu_s in ((1.3, 0.0), (2.0, 0.0005)):
        busy = Busy(f, cpu_s)
        busy.add(0.0, 0.012)  # two collectives back to back from the compute's start
        busy.add(0.012, 0.020)
        beside = busy.advance(0.0, 0.030)
        assert rank_slowdown(0.030, [(beside, 0.020, 2)], cpu_s) == pytest.approx(f)
    # the factor grows without bound as the delay nears the overlap: a stall, capped, never "none"
    for beside in (0.0540, 0.0549, 0.05499, 0.0550, 0.09):
        f = rank_slowdown(0.030, [(beside, 0.025, 1)])
        assert 1.0 < f <= MAX_SLOWDOWN
    assert rank_slowdown(0.030, [(0.0550, 0.025, 1)]) == MAX_SLOWDOWN


def test_the_job_takes_its_slowest_rank_and_no_evidence_means_no_contention():
    spans = [[(0.036, 0.020, 1)], [(0.045, 0.045, 1)], [(0.050, 0.001, 1)]]
    assert job_slowdown([0.030, 0.030, 0.030], spans) == pytest.approx(1.5)
    assert job_slowdown([0.030], [[(0.050, 0.001, 1)]]) == 1.0


def test_the_slowdown_travels_in_the_cluster_spec_and_slows_the_event_engine_models():
    spec = bench_cluster(2, 2e8, None, None, 1.4)
    assert spec.compute_slowdown == 1.4
    assert ClusterSpec.from_dict(spec.to_dict()).compute_slowdown == 1.4
    assert ClusterSpec.from_dict({k: v for k, v in spec.to_dict().items() if k != "compute_slowdown"}).compute_slowdown == 1.0
    profile = synthetic_profile(sizes_bytes=[2 << 20] * 6)  # buckets that reduce while backward runs
    calm = predict_strategies(profile, ["ddp", "caramel"], 2, 2e9)  # compute-bound: the overlap is on the path
    slowed = predict_strategies(profile, ["ddp", "caramel"], 2, 2e9, None, None, 1.4)
    for name in ("ddp", "caramel"):
        assert slowed[name]["step_time_s"] > calm[name]["step_time_s"]


@pytest.mark.parametrize("bad", [0.5, float("nan"), True, "2"])
def test_a_slowdown_under_one_is_an_error_naming_the_field(bad):
    with pytest.raises(FormatError, match="compute_slowdown"):
        ClusterSpec.uniform(2, 1e9, compute_slowdown=bad)


def test_span_padding_counts_the_sleeps_inside_the_compute_and_the_overlap():
    from caramel.bench.contention import span_padding
    # compute 0..10, overlap to 6; sleeps 2..4 (inside both), 5..8 (1 s inside the overlap), 11..12 (after)
    sleeps = [(2.0, 4.0), (5.0, 8.0), (11.0, 12.0)]
    slept, in_overlap, started = span_padding(0.0, 10.0, 6.0, [0.0, 3.0, 4.0, 7.0, 10.5], sleeps)
    assert (slept, in_overlap) == pytest.approx((5.0, 3.0))
    assert started == 2  # 3.0 and 7.0; 4.0 is the sleep's end, 10.5 after the compute
    assert span_padding(0.0, 10.0, 6.0, [0.0, 3.0], []) == (0.0, 0.0, 0)


def test_unpadded_spans_recover_the_factor_the_padding_dilutes():
    """Compute C = 30 ms slowed 1.5x through a 20 ms overlap, then a 40 ms sleep inside the
    overlap (collectives still in flight): the padded spans read a smaller factor; less their
    padding, against the unpadded compute, they read 1.5 again."""
    from caramel.bench.contention import unpadded_spans
    c, f, o, sleep = 0.030, 1.5, 0.020, 0.040
    beside = c + o - o / f  # o / f of the work done during the overlap
    padded = [(beside + sleep, o + sleep, 1)] * 3
    assert rank_slowdown(c, [(beside, o, 1)] * 3) == pytest.approx(f)
    assert rank_slowdown(c + sleep, padded) < 1.2  # diluted by the sleep
    assert rank_slowdown(c, unpadded_spans(padded, [(sleep, sleep, 0)] * 3)) == pytest.approx(f)
    with pytest.raises(ValueError, match="do not align"):
        unpadded_spans(padded, [(sleep, sleep, 0)] * 2)


def test_no_padding_leaves_the_factor_bit_for_bit_unchanged():
    """Runs without --jitter record no paddings: the factor's inputs are the measured ones, and
    zero paddings subtract to the very same floats."""
    from caramel.bench.contention import unpadded_spans
    from caramel.bench.hetero_prediction import Heterogeneity
    compute = [0.0301, 0.0297, 0.0312]
    spans = [[(0.0451, 0.0213, 2), (0.0437, 0.0199, 2)], [(0.0409, 0.0250, 1)] * 2,
             [(0.0398, 0.0311, 3), (0.0512, 0.0300, 3)]]
    alone, given = Heterogeneity().contention_inputs(compute, spans)
    assert alone is compute and given is spans
    zeros = [unpadded_spans(s, [(0.0, 0.0, 0)] * len(s)) for s in spans]
    assert zeros == spans
    assert job_slowdown(compute, zeros, 0.0004) == job_slowdown(compute, spans, 0.0004)
    jittered = Heterogeneity(unpadded_compute_s=[0.01, 0.01, 0.01], concurrent_pauses=[[[0.0, 0.0, 0]] * 2] * 3)
    assert jittered.contention_inputs(compute, spans) == ([0.01, 0.01, 0.01], spans)


@pytest.mark.parametrize("step", [[-0.01, 0.0, 0], [0.01, 0.02, 0], [0.01, -0.001, 0], [0.01, 0.0, 1.5],
                                  [0.01, 0.0, -1], [0.01, 0.0], [0.01, float("nan"), 0], [0.01, 0.0, True]])
def test_a_bad_recorded_padding_is_an_error_naming_its_rank_and_step(step):
    from caramel.bench.hetero_prediction import Heterogeneity
    good = [0.02, 0.01, 1]
    data = {"unpadded_compute_s": [0.03, 0.03], "concurrent_pauses": [[good, good], [good, step]]}
    with pytest.raises(CaramelError, match=r"concurrent_pauses\[1\]\[1\]: expected \[slept_s >= 0, 0 <= "
                                           r"slept_in_overlap_s <= slept_s, int collectives_started >= 0\]") as e:
        Heterogeneity.from_dict(data)
    assert str(e.value).count("[0.02, 0.01, 1]") == 0  # the bad step only, not the whole list
    assert Heterogeneity.from_dict({**data, "concurrent_pauses": [[good, good]] * 2}).concurrent_pauses


def test_paddings_without_the_unpadded_compute_or_per_other_ranks_are_errors():
    from caramel.bench.hetero_prediction import Heterogeneity
    pauses = [[[0.02, 0.01, 1]]] * 2
    with pytest.raises(CaramelError, match="concurrent_pauses needs heterogeneity.unpadded_compute_s"):
        Heterogeneity.from_dict({"concurrent_pauses": pauses})
    with pytest.raises(CaramelError, match="concurrent_pauses needs heterogeneity.unpadded_compute_s"):
        Heterogeneity(concurrent_pauses=pauses).contention_inputs([0.05, 0.05], [[(0.06, 0.03, 1)]] * 2)
    with pytest.raises(CaramelError, match="lists 2 ranks, unpadded_compute_s 3"):
        Heterogeneity.from_dict({"concurrent_pauses": pauses, "unpadded_compute_s": [0.03] * 3})
