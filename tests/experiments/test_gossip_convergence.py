"""experiments/gossip_convergence.py's scoring: each configuration against its baseline on the
same seed, the 5% rule counted per seed, and bad configuration specs refused."""
import pytest


def _script():
    from experiments import gossip_convergence
    return gossip_convergence


def test_each_seed_is_scored_against_its_baseline_on_the_same_seed():
    final = {"ddp": {0: 0.10, 1: 0.20}, "ring": {0: 0.104, 1: 0.26, 2: 0.5},
             "sgd_ddp": {0: 1.0, 1: 1.0}, "sgd_ring": {0: 0.9, 1: 1.2}}
    s = _script().score(final, {"ring": "ddp", "sgd_ring": "sgd_ddp"})
    assert s["ring"]["relative"] == pytest.approx({0: 0.04, 1: 0.30})  # seed 2 has no baseline run
    assert (s["ring"]["within"], s["ring"]["seeds"]) == (1, 2)
    assert s["ring"]["mean"] == pytest.approx(0.17)
    assert s["sgd_ring"]["relative"] == pytest.approx({0: -0.1, 1: 0.2})  # against sgd_ddp, not ddp
    assert s["sgd_ring"]["within"] == 1


def test_a_config_is_a_strategy_and_train_flags():
    name, flags = _script().parse_config("sgd=gossip:topology=ring --optimizer sgd --lr 0.05")
    assert name == "sgd" and flags == ["--strategy", "gossip:topology=ring", "--optimizer", "sgd", "--lr", "0.05"]
    for bad in ("ring", "=ddp", "ring="):
        with pytest.raises(SystemExit, match="NAME=STRATEGY"):
            _script().parse_config(bad)
