"""The candidate-scoring PPO policy: its size does not depend on the number of candidates, and
a few hundred PPO steps run on both environments (a smoke test; the training runs are in
experiments/coflow_rl.py and experiments/edge_placement.py)."""
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from caramel.sched.coflow import TraceOptions  # noqa: E402
from caramel.sched.coflow.env import CoflowEnv, EnvOptions  # noqa: E402
from caramel.sched.placement import InstanceOptions  # noqa: E402
from caramel.sched.placement.env import PlacementEnv  # noqa: E402
from caramel.sched.rl import PpoOptions, make_ppo, num_policy_parameters  # noqa: E402

QUICK = PpoOptions(total_timesteps=128, n_steps=64, batch_size=32, n_epochs=1, width=8)


def test_policy_size_is_independent_of_the_candidate_count():
    torch.set_num_threads(1)
    trace = TraceOptions(num_jobs=3, max_steps=1)
    sizes = {k: num_policy_parameters(make_ppo(CoflowEnv(trace, [0], EnvOptions(max_candidates=k)), QUICK))
             for k in (4, 16)}
    assert sizes[4] == sizes[16]


def test_ppo_trains_briefly_on_both_environments():
    """Coflow trace 1118 needs no choice (its episode is over at reset, as PPO alone on tiny
    traces draws): training steps through it."""
    torch.set_num_threads(1)
    for env in (CoflowEnv(TraceOptions(num_jobs=3, max_steps=1), [0, 1, 1118]),
                PlacementEnv(InstanceOptions(num_tasks=2, num_layers=3, num_edge=2), [0, 1])):
        model = make_ppo(env, QUICK)
        model.learn(total_timesteps=QUICK.total_timesteps)
        obs, _ = env.reset(seed=0)
        action, _ = model.predict(obs, deterministic=True)
        assert env.action_space.contains(int(action))


def _last_fitting_row(env):
    """A made-up teacher: the last node the layer fits on is best (the prior leans the other way)."""
    fits = [env.state.fits(env.task, k) for k in env.order]
    last = max(i for i, f in enumerate(fits) if f)
    return np.array([1.0 if i == last else (2.0 if f else np.inf) for i, f in enumerate(fits)])


def test_imitation_makes_the_policy_pick_the_teachers_row():
    from caramel.sched.improve import ImproveOptions, best_row, improve
    torch.set_num_threads(1)
    env = PlacementEnv(InstanceOptions(num_tasks=2, num_layers=3, num_edge=2), list(range(50)))
    model = make_ppo(env, PpoOptions(total_timesteps=128, n_steps=64, batch_size=32, n_epochs=1, width=16))

    def agreement() -> float:
        hits = total = 0
        for s in range(100, 110):
            obs, _ = env.reset(seed=s)
            done = False
            while not done:
                want = best_row(_last_fitting_row(env))
                got = int(model.predict(obs, deterministic=True)[0])
                hits, total = hits + (got == want), total + 1
                obs, _, done, _, _ = env.step(got)
        return hits / total

    before = agreement()
    rounds = improve(model, env, _last_fitting_row, ImproveOptions(rounds=2, episodes=10, epochs=150, batch_size=32))
    assert [r["round"] for r in rounds] == [0, 1] and rounds[1]["states"] == 2 * 10 * 6
    assert rounds[1]["accuracy"] > 0.95 and rounds[1]["regret_pct_policy"] < rounds[1]["regret_pct_base"]
    assert before < 0.5 and agreement() >= 0.9  # held-out episodes: it learned the rule


def test_best_row_keeps_the_base_on_near_ties():
    from caramel.sched.improve import best_row, relative_regret
    assert best_row(np.array([1.0, 1.0 - 1e-9, 2.0])) == 0
    assert best_row(np.array([1.0, 0.5, 0.5, np.inf])) == 1
    np.testing.assert_allclose(relative_regret(np.array([2.0, 1.0, np.inf])), [1.0, 0.0, 0.0])


def test_learning_leaves_nothing_in_the_temp_dir(tmp_path, monkeypatch):
    import tempfile

    import torch._dynamo  # noqa: F401  (its first import makes torch's compile cache dir in the temp dir)
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # gettempdir() caches its first answer
    torch.set_num_threads(1)
    env = CoflowEnv(TraceOptions(num_jobs=3, max_steps=1), [0])
    make_ppo(env, QUICK).learn(total_timesteps=QUICK.total_timesteps)
    assert list(tmp_path.iterdir()) == []
