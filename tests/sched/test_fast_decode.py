"""The fast placement decoder (numpy forward pass, table lookups for the memory wishes) against
the reference (`decode.decode`, the network through torch): the same probabilities within 1e-6
and the same decisions, greedy and sampled with the same seed, on small and large instances."""
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from caramel.errors import CaramelError  # noqa: E402
from caramel.sched.placement import InstanceOptions, random_instance  # noqa: E402
from caramel.sched.placement.batch import BatchPlacement  # noqa: E402
from caramel.sched.placement.decode import Decoding, decode, step_probabilities  # noqa: E402
from caramel.sched.placement.env import PlacementEnv  # noqa: E402
from caramel.sched.placement.fast_decode import NumpyPolicy, decode_fast  # noqa: E402
from caramel.sched.rl import PpoOptions, make_ppo  # noqa: E402

SMALL = InstanceOptions(num_tasks=3, num_layers=4, num_edge=3)
LARGE = InstanceOptions(num_tasks=30, num_layers=8, num_edge=3, memory_fraction=0.3)


@pytest.fixture(scope="module", params=[(0.0, 3), (2.0, 4)], ids=["no-lean", "lean"])
def model(request):
    """Untrained policies, width 16: without the prior's lean the draws spread over the nodes;
    with it they lean towards row 0 as a trained policy does."""
    torch.set_num_threads(1)
    prior, seed = request.param
    m = make_ppo(PlacementEnv(SMALL, [0]), PpoOptions(width=16, prior=prior, seed=seed))
    m.policy.set_training_mode(False)  # as the experiment leaves it after training
    return m


@pytest.mark.parametrize("opts,seed", [(SMALL, 0), (SMALL, 5), (LARGE, 1)])
def test_probabilities_match_the_torch_network(model, opts, seed):
    """Along sampled rollouts (masked rows included): every row's probability within 1e-6 of
    the reference's, masked rows exactly 0; on the small instances in training mode too (torch's
    attention takes another kernel in eval mode)."""
    fast = NumpyPolicy.from_policy(model.policy)
    inst, rng = random_instance(opts, seed), np.random.default_rng(seed)
    batch, masked = BatchPlacement(inst, 6), 0
    while not batch.done:
        obs = batch.observe()
        got = fast.probabilities(obs)
        for training in (False, True) if opts is SMALL else (False,):
            model.policy.set_training_mode(training)
            want = step_probabilities(model.policy, obs).numpy()
            assert got.dtype == np.float32 and np.abs(got - want).max() <= 1e-6
        model.policy.set_training_mode(False)
        assert np.all(got[obs[..., 0] < 0.5] == 0.0)
        masked += int((obs[..., 0] < 0.5).sum())
        batch.step(rng.integers(inst.num_nodes, size=6))
    assert masked > 0  # the check above saw rows without room


@pytest.mark.parametrize("opts,seeds,samples", [(SMALL, range(6), [1, 16]), (LARGE, [0], [1, 8])],
                         ids=["small", "large"])
def test_same_placements_as_the_reference_decoder(model, opts, seeds, samples):
    """Greedy and sampled (the same seed) decodings: every rollout's cost, the winner and the
    placement equal the reference decoder's."""
    fast = NumpyPolicy.from_policy(model.policy)
    for s in seeds:
        inst = random_instance(opts, s)
        for n in samples:
            want = decode(inst, model.policy, Decoding(n), seed=s)
            got = decode_fast(inst, fast, Decoding(n), seed=s)
            assert got == want
            assert inst.feasible(got.placement)


def test_wish_table_equals_the_walked_continuations():
    """The per-instance table gives each rollout's memory wishes exactly as walking the chain."""
    opts = InstanceOptions(num_tasks=5, num_layers=4, num_edge=4, memory_fraction=0.2)
    for seed in range(3):
        inst, rng = random_instance(opts, seed), np.random.default_rng(seed)
        batch = BatchPlacement(inst, 5)
        while not batch.done:
            t = batch.task.copy()
            batch.step(rng.integers(inst.num_nodes, size=5))
            fast = batch.wish_mb.copy()
            batch._rewish_reference(t)
            assert np.array_equal(batch.wish_mb, fast)


def test_bad_inputs_are_refused(model):
    inst = random_instance(SMALL, 0)
    with pytest.raises(CaramelError, match="policy must be a NumpyPolicy"):
        decode_fast(inst, model.policy, Decoding(1))
    with pytest.raises(CaramelError, match="decoding must be a Decoding"):
        decode_fast(inst, NumpyPolicy.from_policy(model.policy), 4)
