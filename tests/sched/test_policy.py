"""The candidate-scoring PPO policy: its size does not depend on the number of candidates, and
a few hundred PPO steps run on both environments (a smoke test; the training runs are in
experiments/coflow_rl.py and experiments/edge_placement.py)."""
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
    torch.set_num_threads(1)
    for env in (CoflowEnv(TraceOptions(num_jobs=3, max_steps=1), [0, 1]),
                PlacementEnv(InstanceOptions(num_tasks=2, num_layers=3, num_edge=2), [0, 1])):
        model = make_ppo(env, QUICK)
        model.learn(total_timesteps=QUICK.total_timesteps)
        obs, _ = env.reset(seed=0)
        action, _ = model.predict(obs, deterministic=True)
        assert env.action_space.contains(int(action))
