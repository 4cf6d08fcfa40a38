"""microbatches="auto": the simulator's choice follows the fixed cost each microbatch pays."""
from __future__ import annotations

import pytest

from caramel.errors import CaramelError
from caramel.strategies.pipeline.microbatches import ScalingCost, candidates, choose_microbatches, fit_scaling
from caramel.strategies.pipeline.planner import LayerCost
from caramel.topology.spec import ClusterSpec

BATCH = 32
FREE_LINKS = ClusterSpec.uniform(2, 1e15, 0.0)


def _layers(fixed_s: float) -> list[ScalingCost]:
    """Two equal layers (one per stage): 1 ms forward, 2 ms backward per sample, plus `fixed_s`
    forward and 2 x `fixed_s` backward per microbatch (a weight read again per microbatch)."""
    return [ScalingCost(fixed_s, 1e-3, 2 * fixed_s, 2e-3, 0.0, 4) for _ in range(2)]


def _textbook_step_s(fixed_s: float, m: int, p: int = 2) -> float:
    """GPipe over equal stages and free links: (m + p - 1) slots of one microbatch's F + B."""
    return (m + p - 1) * 3 * (fixed_s + 1e-3 * BATCH / m)


@pytest.mark.parametrize("fixed_s", [0.0, 0.5e-3, 2e-3, 8e-3, 40e-3])
def test_choice_is_the_fastest_count_for_the_fixed_cost(fixed_s):
    choice = choose_microbatches(_layers(fixed_s), BATCH, "gpipe", 2, 2, FREE_LINKS)
    expected = min(candidates(BATCH, "gpipe", 2, 2), key=lambda m: (_textbook_step_s(fixed_s, m), m))
    assert choice.microbatches == expected and choice.plan.boundaries == [1]
    for m, t in choice.predicted_step_s.items():
        assert t == pytest.approx(_textbook_step_s(fixed_s, m))


def test_more_fixed_cost_means_fewer_microbatches():
    chosen = [choose_microbatches(_layers(f), BATCH, "1f1b", 2, 2, FREE_LINKS).microbatches
              for f in (0.0, 0.5e-3, 2e-3, 8e-3, 40e-3)]
    assert chosen == sorted(chosen, reverse=True) and chosen[0] == BATCH and chosen[-1] == 2  # 1F1B needs >= 2


def test_fit_recovers_an_affine_layer_and_never_goes_negative():
    small = [LayerCost(5.0e-3, 10e-3, 8 * 100, 7)]
    large = [LayerCost(9.4e-3, 18.8e-3, 32 * 100, 7)]
    (fit,) = fit_scaling(small, 8, large, 32)
    assert fit.per_sample_forward_s == pytest.approx(4.4e-3 / 24) and fit.fixed_forward_s == pytest.approx(5.0e-3 - 8 * 4.4e-3 / 24)
    assert fit.at(32).forward_s == pytest.approx(9.4e-3) and fit.at(8).backward_s == pytest.approx(10e-3)
    assert fit.output_bytes_per_sample == 100 and fit.param_bytes == 7
    # noise: slower at the smaller size -> no per-sample cost, all fixed; faster than linear -> no fixed cost
    (flat,) = fit_scaling([LayerCost(3e-3, 3e-3, 0, 0)], 8, [LayerCost(2e-3, 2e-3, 0, 0)], 32)
    assert flat.per_sample_forward_s == 0 and flat.fixed_forward_s == 3e-3
    (steep,) = fit_scaling([LayerCost(1e-3, 1e-3, 0, 0)], 8, [LayerCost(8e-3, 8e-3, 0, 0)], 32)
    assert steep.fixed_forward_s == 0 and steep.per_sample_forward_s > 0


def test_candidates_divide_the_batch_and_respect_the_schedule():
    assert candidates(12, "gpipe", 2, 2) == [1, 2, 3, 4, 6, 12]
    assert candidates(12, "1f1b", 3, 3) == [3, 4, 6, 12]
    assert candidates(12, "interleaved", 4, 2) == [2, 4, 6, 12]
    with pytest.raises(CaramelError, match="no microbatch count splits the batch of 3"):
        candidates(3, "1f1b", 4, 4)


def test_the_runtime_scores_counts_as_the_prediction_does():
    """2 gloo ranks. A batch one count splits (2, under 1f1b on 2 stages) on a shared host, no
    profile: the runtime profiles its layers at that one size (it raised in `fit_scaling`, two
    sizes needed) and trains as one process does. With a tied model's profile handed over, the
    runtime's score of every count is `simulate_pipeline`'s for it (the optimizer step and the
    tied weight priced alike), its count and cut the prediction's; one count is scored on a
    shared host only (its cut is then chosen at the speeds the host settles at)."""
    from caramel.testing import run_workers
    from tests.strategies.pipeline import auto_count_workers

    for out in run_workers(auto_count_workers.auto_count_worker, 2, timeout_s=120):
        assert isinstance(out["no_profile"], dict), out["no_profile"]
        assert out["no_profile"]["microbatches"] == 2 and out["no_profile"]["counts"] == [2], out["no_profile"]
        assert out["no_profile"]["diff"] <= 1e-5, out["no_profile"]
        for (shared, schedule), got in ((k, v) for k, v in out.items() if k != "no_profile"):
            scored = got["explicit"] if shared or schedule == "gpipe" else {}
            assert got["table"] == scored and got["predicted"] == got["explicit"], (shared, schedule, got)
            assert got["microbatches"] == got["picked"], (shared, schedule, got)
            assert [got["names"][c] for c in got["cut"]] == got["predicted_cut"], (shared, schedule, got)
