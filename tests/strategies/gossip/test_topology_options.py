"""Gossip topologies (doubly stochastic, connected, their rates) and options (spec, errors)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from caramel.errors import CaramelError
from caramel.strategies import STRATEGIES
from caramel.strategies.gossip.topology import (check_mixing, connected, describe, mixing_matrix, neighbours, period,
                                                rate, torus_shape)

NAMES = ("ring", "torus", "exponential", "one_peer_exponential", "complete")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8, 12, 16])
def test_every_step_is_doubly_stochastic_and_the_period_connects(name, n):
    mats = [mixing_matrix(name, n, t) for t in range(period(name, n))]
    union = np.zeros((n, n))
    for W in mats:
        check_mixing(W, n, require_connected=False)
        union += W
    assert connected(union)
    for i in range(n):  # what a worker sends is what its peers expect to receive
        for W in mats:
            nb = neighbours(W, i)
            assert all(i in [j for j, _ in neighbours(W, k).recv] for k in nb.send)
            assert nb.self_weight + sum(w for _, w in nb.recv) == pytest.approx(1.0)


def test_known_rates():
    assert describe("ring", 4)["rate_per_step"] == pytest.approx(1 / 3)
    assert describe("ring", 8)["rate_per_step"] == pytest.approx((1 + 2 * np.cos(2 * np.pi / 8)) / 3)
    assert describe("complete", 5)["rate_per_step"] == pytest.approx(0.0, abs=1e-12)
    assert describe("exponential", 8)["rate_per_step"] == pytest.approx(0.5)
    assert describe("exponential", 8)["peers_per_step"] == 3
    one = describe("one_peer_exponential", 8)
    assert one["peers_per_step"] == 1 and one["period_steps"] == 3
    assert one["rate_per_step_over_period"] == pytest.approx(0.0, abs=1e-12)  # 3 steps average exactly
    assert torus_shape(12) == (3, 4) and describe("torus", 16)["peers_per_step"] == 4
    # a bigger ring mixes slower; the exponential graph keeps its gap as the ring's closes
    assert rate(mixing_matrix("ring", 16)) > rate(mixing_matrix("ring", 8)) > rate(mixing_matrix("exponential", 16))


def test_a_user_matrix_is_checked(tmp_path):
    good = tmp_path / "w.json"
    good.write_text(json.dumps([[0.5, 0.5, 0], [0.25, 0.25, 0.5], [0.25, 0.25, 0.5]]))
    assert mixing_matrix(str(good), 3)[1, 2] == 0.5
    with pytest.raises(CaramelError, match="expected a 4 x 4 matrix for 4 workers"):
        mixing_matrix(str(good), 4)
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps([[0.5, 0.5, 0], [0.5, 0.5, 0], [0.5, 0, 0.5]]))
    with pytest.raises(CaramelError, match="not doubly stochastic: column 0 sums to 1.5"):
        mixing_matrix(str(bad), 3)
    split = tmp_path / "s.json"
    split.write_text(json.dumps([[1, 0], [0, 1]]))
    with pytest.raises(CaramelError, match="not connected"):
        mixing_matrix(str(split), 2)
    with pytest.raises(CaramelError, match="cannot read a mixing matrix"):
        mixing_matrix(str(tmp_path / "missing.json"), 2)


def test_options_by_spec_and_their_errors():
    spec = STRATEGIES.spec("gossip:topology=exponential,algorithm=momentum,personalize=head+blocks.1")
    o = spec.options
    assert (o.topology, o.algorithm, o.local_prefixes()) == ("exponential", "momentum", ("head", "blocks.1"))
    assert o.is_local("head.weight") and o.is_local("blocks.1.ln.bias") and not o.is_local("blocks.10.w")
    assert spec.name == "gossip:algorithm=momentum,personalize=head+blocks.1,topology=exponential"
    with pytest.raises(CaramelError, match="topology must be one of ring, torus"):
        STRATEGIES.spec("gossip:topology=star")
    with pytest.raises(CaramelError, match="algorithm must be one of dpsgd, momentum, overlap, overlap_momentum, adam"):
        STRATEGIES.spec("gossip:algorithm=admm")
    with pytest.raises(CaramelError, match="did you mean 'topology'"):
        STRATEGIES.spec("gossip:topolgy=ring")
    with pytest.raises(CaramelError, match="consensus_every must be >= 0"):
        STRATEGIES.spec("gossip", {"consensus_every": -1})


def test_optimizers_the_algorithm_cannot_use_are_refused():
    import torch

    from caramel.strategies.gossip.parallelize import _check_optimizer

    params = [torch.nn.Parameter(torch.zeros(2))]
    spec = lambda text: STRATEGIES.spec(text).options  # noqa: E731
    _check_optimizer(torch.optim.AdamW(params), spec("gossip:algorithm=adam"))
    _check_optimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9), spec("gossip:algorithm=momentum"))
    for opt in (torch.optim.SGD(params, lr=0.1), torch.optim.RMSprop(params), torch.optim.AdamW(params)):
        _check_optimizer(opt, spec("gossip:algorithm=overlap"))  # any optimizer
    assert spec("gossip:algorithm=overlap").mixes_at_update and spec("gossip:algorithm=adam").mixes_at_update
    assert not spec("gossip").mixes_at_update and not spec("gossip:algorithm=overlap").mixes_moments
    with pytest.raises(CaramelError, match="pass torch.optim.Adam or AdamW, got SGD .*algorithm=overlap is"):
        _check_optimizer(torch.optim.SGD(params, lr=0.1), spec("gossip:algorithm=adam"))
    with pytest.raises(CaramelError, match="needs SGD with momentum > 0"):
        _check_optimizer(torch.optim.SGD(params, lr=0.1), spec("gossip:algorithm=momentum"))
    with pytest.raises(CaramelError, match="SGD \\(momentum > 0\\), Adam and AdamW keep; got RMSprop"):
        _check_optimizer(torch.optim.RMSprop(params), spec("gossip:algorithm=momentum"))
    om = spec("gossip:algorithm=overlap_momentum")  # overlap's mix point, momentum's moments
    assert om.mixes_at_update and om.mixes_moments
    _check_optimizer(torch.optim.AdamW(params), om)
    with pytest.raises(CaramelError, match="algorithm=overlap_momentum needs SGD with momentum > 0"):
        _check_optimizer(torch.optim.SGD(params, lr=0.1), om)
    with pytest.raises(CaramelError, match="algorithm=overlap_momentum exchanges .*got RMSprop"):
        _check_optimizer(torch.optim.RMSprop(params), om)


def test_buckets_follow_forward_order_and_the_cap():
    import torch

    from caramel.strategies.gossip.engine import make_buckets

    a, b, c, d = torch.zeros(100), torch.zeros(100), torch.zeros(100), torch.zeros(10, dtype=torch.float64)
    unused = torch.zeros(5)
    owner = {id(a): "late", id(b): "early", id(c): "early", id(d): "mid", id(unused): "never"}
    buckets = make_buckets([("a", a), ("b", b), ("c", c), ("d", d), ("u", unused)], owner,
                           ["early", "mid", "late"], cap_bytes=800)
    # early's two tensors fit one 800-byte bucket; the float64 one starts its own; unused last
    assert [[id(t) for t in bk.tensors] for bk in buckets] == [[id(b), id(c)], [id(d)], [id(a), id(unused)]]
    assert buckets[0].modules == {"early"} and buckets[2].modules == {"late", "never"}
    assert [bk.nbytes for bk in buckets] == [800, 80, 420]


def test_a_matrix_given_from_python():
    W = [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5]]
    o = STRATEGIES.spec("gossip", {"topology": W}).options
    assert mixing_matrix(o.topology, 3).tolist() == W
    assert describe(o.topology, 3)["topology"] == "matrix" and describe(o.topology, 3)["peers_per_step"] == 1
    with pytest.raises(CaramelError, match="topology matrix: expected a 4 x 4 matrix for 4 workers"):
        mixing_matrix(o.topology, 4)
    with pytest.raises(CaramelError, match="must be a list of rows"):
        STRATEGIES.spec("gossip", {"topology": [0.5, 0.5]})
    with pytest.raises(CaramelError, match="topology must be str or list"):
        STRATEGIES.spec("gossip", {"topology": 3})


def test_a_matrix_given_as_a_tensor_or_array_is_kept_as_rows_and_checked():
    W = [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5]]
    for given in (torch.tensor(W), torch.tensor(W, dtype=torch.float64), np.array(W)):
        o = STRATEGIES.spec("gossip", {"topology": given}).options
        assert o.topology == W and mixing_matrix(o.topology, 3).tolist() == W
    assert STRATEGIES.spec("gossip", {"topology": torch.tensor(W)}) == STRATEGIES.spec("gossip", {"topology": W})
    with pytest.raises(CaramelError, match=r"expected a 2 x 2 matrix for 2 workers, got shape \(3, 3\)"):
        mixing_matrix(STRATEGIES.spec("gossip", {"topology": torch.tensor(W)}).options.topology, 2)
    for bad, match in ((torch.ones(3), r"2-D mixing matrix .* got shape \(3,\)"),
                       (torch.ones(2, 2, dtype=torch.bool), "real weights, got dtype torch.bool"),
                       (np.array([["a", "b"], ["c", "d"]]), "real weights")):
        with pytest.raises(CaramelError, match=match):
            STRATEGIES.spec("gossip", {"topology": bad})
    nan = STRATEGIES.spec("gossip", {"topology": torch.tensor([[float("nan"), 1.0], [1.0, 0.0]])}).options
    with pytest.raises(CaramelError, match="weights must be finite numbers"):
        mixing_matrix(nan.topology, 2)
    with pytest.raises(CaramelError, match="not doubly stochastic: row 1 sums to 1.2"):
        mixing_matrix(torch.tensor([[0.4, 0.4], [0.6, 0.6]]).tolist(), 2)


def test_head_steps_needs_a_personalized_head_and_a_mix_it_does_not_move():
    assert STRATEGIES.spec("gossip", {"personalize": "head", "head_steps": 3}).options.head_steps == 3
    for values, match in (({"head_steps": 2}, "name it with personalize="),
                          ({"personalize": "head", "head_steps": -1}, "head_steps must be an integer >= 0"),
                          ({"personalize": "head", "head_steps": 2, "algorithm": "adam"}, "algorithm=adam"),
                          ({"personalize": "head", "head_steps": 2, "algorithm": "overlap"}, "algorithm=overlap mixes")):
        with pytest.raises(CaramelError, match=match):
            STRATEGIES.spec("gossip", values)


def test_overlap_trackers_options_and_caramel_train_clipping_picks_the_reference_path():
    from caramel.strategies.gossip.options import GossipOptions
    from caramel.train.strategy import gossip_options_for_clipping

    spec = STRATEGIES.spec("gossip:algorithm=tracking,tracker_bucket_cap_mb=0.25")
    assert spec.options.overlaps_trackers and spec.options.tracker_cap_mb == 0.25
    assert STRATEGIES.spec("gossip:algorithm=tracking").options.tracker_cap_mb == 1.0
    assert not STRATEGIES.spec("gossip:algorithm=tracking,overlap_trackers=false").options.overlaps_trackers
    with pytest.raises(CaramelError, match="tracker_bucket_cap_mb must be > 0, got 0"):
        GossipOptions(algorithm="tracking", tracker_bucket_cap_mb=0)
    # clipping edits the gradients after backward: the trackers are formed at step() instead...
    assert not gossip_options_for_clipping(spec.options, 1.0).overlaps_trackers
    assert gossip_options_for_clipping(spec.options, 0.0).overlaps_trackers
    dpsgd = GossipOptions()
    assert gossip_options_for_clipping(dpsgd, 1.0) is dpsgd


def test_tracker_options_without_trackers_or_against_clipping_are_errors():
    from caramel.train.strategy import gossip_options_for_clipping

    for algorithm in ("dpsgd", "momentum", "overlap", "adam"):
        for option in ("overlap_trackers=true", "overlap_trackers=false", "tracker_bucket_cap_mb=2"):
            with pytest.raises(CaramelError, match=f"{option.split('=')[0]} .*algorithm={algorithm} has no trackers"):
                STRATEGIES.spec(f"gossip:algorithm={algorithm},{option}")
    # ...but an explicit overlap_trackers=true is the user's choice: not silently dropped
    explicit = STRATEGIES.spec("gossip:algorithm=tracking,overlap_trackers=true").options
    with pytest.raises(CaramelError, match="--clip-grad-norm 1 .*overlap_trackers=true"):
        gossip_options_for_clipping(explicit, 1.0)
    assert gossip_options_for_clipping(explicit, 0.0) is explicit
