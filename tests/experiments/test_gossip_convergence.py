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


def test_a_baseline_keeps_its_own_score_and_none_is_its_own():
    names = ["ddp", "ddp_lr_half", "ring"]
    b = _script().resolve_baselines(names, ["ring=ddp_lr_half"])
    assert b == {"ddp_lr_half": "ddp", "ring": "ddp_lr_half"}  # ddp_lr_half is still scored against ddp
    with pytest.raises(SystemExit, match="'ring=ring'.*own baseline"):
        _script().resolve_baselines(names, ["ring=ring"])
    with pytest.raises(SystemExit, match="'ring=dp'.*ddp, ddp_lr_half, ring"):
        _script().resolve_baselines(names, ["ring=dp"])


def test_a_run_that_stopped_early_is_refused_by_name():
    full = {40: 0.5, 80: 0.3}
    curves = {"ddp": {0: full, 1: full}, "ring": {0: {40: 0.6, 80: 0.35}, 1: {40: 0.6}}}
    with pytest.raises(SystemExit, match=r"ring-1 \(step 40\) stop before step 80"):
        _script().final_losses(curves)
    curves["ring"][1] = {40: 0.6, 80: 0.4}
    assert _script().final_losses(curves) == {"ddp": {0: 0.3, 1: 0.3}, "ring": {0: 0.35, 1: 0.4}}


def test_seeds_must_be_integers():
    assert _script().parse_seeds("0,1,2") == [0, 1, 2]
    with pytest.raises(SystemExit, match="--seeds 'a,b': expected comma-separated integers"):
        _script().parse_seeds("a,b")
