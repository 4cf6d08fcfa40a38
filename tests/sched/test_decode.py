"""Decoding the learned placement policy: greedy decoding matches the deterministic actor,
sampling keeps the cheapest of N feasible rollouts (rollout 0 is the greedy one, so it never
loses to greedy), is deterministic for a seed, batches the N rollouts into one forward pass
per step, and refuses a bad N."""
import pytest
import torch

pytest.importorskip("stable_baselines3")

from caramel.errors import CaramelError  # noqa: E402
from caramel.sched.placement import InstanceOptions, random_instance  # noqa: E402
from caramel.sched.placement.decode import Decoding, decode, parse_decoding  # noqa: E402
from caramel.sched.placement.env import PlacementEnv, run_policy  # noqa: E402
from caramel.sched.rl import PpoOptions, make_ppo  # noqa: E402

OPTS = InstanceOptions(num_tasks=3, num_layers=4, num_edge=3)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    # untrained, no lean towards row 0: its draws spread over the nodes
    return make_ppo(PlacementEnv(OPTS, [0]), PpoOptions(width=8, prior=0.0, seed=3))


def test_greedy_decoding_is_the_deterministic_actor(model):
    env = PlacementEnv(OPTS, [0])
    for seed in range(3):
        inst = random_instance(OPTS, seed)
        want = run_policy(env, inst, lambda obs: int(model.predict(obs, deterministic=True)[0]))
        got = decode(inst, model.policy, parse_decoding("greedy"))
        assert got.placement == want and got.rollout == 0 and got.costs_s == [inst.cost_s(want)]


def test_sampling_keeps_the_cheapest_feasible_rollout_and_never_loses_to_greedy(model):
    won = 0
    for seed in range(6):
        inst = random_instance(OPTS, seed)
        greedy = decode(inst, model.policy, Decoding(1))
        best = decode(inst, model.policy, parse_decoding("sample:16"), seed=seed)
        assert inst.feasible(best.placement) and len(best.costs_s) == 16
        assert best.costs_s[0] == greedy.cost_s  # rollout 0 is the greedy one
        assert best.cost_s == min(best.costs_s) == inst.cost_s(best.placement) <= greedy.cost_s
        assert best.distinct > 1  # the other rollouts do sample
        won += best.cost_s < greedy.cost_s
    assert won > 0


def test_sampling_is_deterministic_for_a_seed(model):
    inst = random_instance(OPTS, 7)
    a, b = (decode(inst, model.policy, Decoding(8), seed=5) for _ in range(2))
    c = decode(inst, model.policy, Decoding(8), seed=6)
    assert a == b
    assert c.costs_s != a.costs_s


def test_rollouts_share_one_forward_pass_per_step(model):
    calls = []

    class Counting:
        def get_distribution(self, obs):
            calls.append(tuple(obs.shape))
            return model.policy.get_distribution(obs)

    inst = random_instance(OPTS, 1)
    decode(inst, Counting(), Decoding(12), seed=0)
    assert calls == [(12, OPTS.num_edge + 1, 19)] * (OPTS.num_tasks * OPTS.num_layers)


@pytest.mark.parametrize("text", ["sample:0", "sample:-3", "sample:x", "sample:", "sample", "beam:4", "greedy:2",
                                  "sample:+8", "sample:1_6", "sample: 8", "sample:8 :", "sample:\u0663", "sample:8.0",
                                  pytest.param("sample:" + "0" * 5000, id="sample:5000-zeros")])
def test_bad_decodings_are_refused(text):
    with pytest.raises(CaramelError, match="expected 'greedy' or 'sample:N' with N an integer >= 1"):
        parse_decoding(text)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_bad_sample_counts_are_refused(n):
    with pytest.raises(CaramelError, match="decoding samples must be an integer >= 1"):
        Decoding(n)


def test_a_sample_count_over_the_cap_is_refused_naming_it():
    from caramel.sched.placement.decode import MAX_SAMPLES
    assert parse_decoding(f"sample:{MAX_SAMPLES}") == Decoding(MAX_SAMPLES)
    assert parse_decoding("sample:0016") == Decoding(16)
    assert parse_decoding("sample:" + "0" * 5000 + "8") == Decoding(8)  # as in the coflow decodings
    for bad in (f"sample:{MAX_SAMPLES + 1}", "sample:" + "1" * 5000):
        with pytest.raises(CaramelError, match=rf"decode '{bad[:20]}.*': N is over the cap of {MAX_SAMPLES} samples"
                                               rf".*1 <= N <= {MAX_SAMPLES}"):
            parse_decoding(bad)
    with pytest.raises(CaramelError, match=f"decoding samples must be at most {MAX_SAMPLES}"):
        Decoding(MAX_SAMPLES + 1)
