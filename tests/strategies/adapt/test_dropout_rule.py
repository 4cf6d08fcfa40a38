"""The balance="dropout" decision rule alone (no processes): equal workers with noisy step times
drop nothing, a 2x slower worker drops, and only once two consecutive decisions agree."""
import random

from caramel.profile.dropout_table import DropoutTable
from caramel.strategies.caramel.balance import WINDOW_STEPS
from caramel.strategies.caramel.dropout_rule import Confirmation, propose, slow_ranks, window_stats

# the measured table of the zoo's mlp (docs/results/adapt-dropout-table-mlp.json): any slowness
# above 1.05 picks 0.5, so only the rule's margins keep equal workers from dropping half
TABLE = DropoutTable.from_dict({"format": "caramel.dropout-table/1", "model": "mlp", "groups": ["layers.0"],
                                "entries": [{"fraction": 0.0, "time_ratio": 1.0, "val_loss": 2.3201, "loss_increase": 0.0},
                                            {"fraction": 0.125, "time_ratio": 1.395, "val_loss": 2.3204, "loss_increase": 0.0003},
                                            {"fraction": 0.25, "time_ratio": 1.123, "val_loss": 2.3208, "loss_increase": 0.0007},
                                            {"fraction": 0.5, "time_ratio": 0.587, "val_loss": 2.3223, "loss_increase": 0.0023}]})


def _window(rng: random.Random, mean_s: float, noise: float) -> list[float]:
    """A window of step times as a shared host makes them: +-noise around the mean, and now and
    then a step hit by other work (1.5-3x)."""
    return [mean_s * (1 + rng.uniform(-noise, noise)) * (rng.uniform(1.5, 3.0) if rng.random() < 0.1 else 1.0)
            for _ in range(WINDOW_STEPS)]


def _run(slowness: list[float], windows: int, seed: int, noise: float = 0.15) -> list[list[float]]:
    """The fractions in force after each of `windows` decisions, every rank's window drawn anew."""
    rng, conf, current, out = random.Random(seed), Confirmation(), [0.0] * len(slowness), []
    for _ in range(windows):
        stats = [window_stats(_window(rng, 0.04 * s, noise)) for s in slowness]
        new = conf.confirm(propose(stats, TABLE), current)
        current = new if new is not None else current
        out.append(current)
    return out


def test_equal_workers_with_noisy_steps_drop_nothing():
    for seed in range(50):
        assert _run([1.0, 1.0], 10, seed) == [[0.0, 0.0]] * 10, seed


def test_one_noisy_window_proposes_but_does_not_start_a_drop():
    quiet = window_stats([0.040] * WINDOW_STEPS)
    hit = window_stats([0.046, 0.045, 0.047, 0.046, 0.045, 0.046, 0.047, 0.045, 0.046, 0.046])  # 15% slower, steady
    conf = Confirmation()
    assert propose([quiet, hit], TABLE) == [0.0, 0.5]
    assert conf.confirm(propose([quiet, hit], TABLE), [0.0, 0.0]) is None  # first window: not yet
    assert conf.confirm(propose([quiet, quiet], TABLE), [0.0, 0.0]) is None  # the next is even: never
    # a gap inside the windows' own spread is no slowness, however the medians fall
    assert slow_ranks([window_stats([0.03, 0.05] * 5), window_stats([0.035, 0.055] * 5)]) == [1.0, 1.0]


def test_a_2x_slower_worker_drops_from_the_second_decision_on():
    for seed in range(20):
        runs = _run([1.0, 2.0], 6, seed)
        assert runs[0] == [0.0, 0.0] and runs[1:] == [[0.0, 0.5]] * 5, (seed, runs)


def test_no_measurement_yet_proposes_nothing():
    assert propose([(0.0, 0.0), (0.08, 0.001)], TABLE) == [0.0, 0.0]
    assert window_stats([]) == (0.0, 0.0)
