"""experiments/gossip_convergence.py's scoring: each configuration against its baseline on the
same seed, the 5% rule counted per seed, bad configuration specs refused, and each worker's model
from a checkpoint scored as `caramel train` scores one."""
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
    assert s["sgd_ring"]["within_both"] == 0  # -10% is within on the one-sided rule only


def test_the_mean_gap_has_a_t_interval_over_seeds():
    final = {"ddp": {0: 1.0, 1: 1.0, 2: 1.0}, "ring": {0: 1.1, 1: 0.9, 2: 1.0}}
    s = _script().score(final, {"ring": "ddp"})["ring"]
    half = 4.302653 * 0.1 / 3 ** 0.5  # t(0.975, 2 dof) x sd / sqrt(3)
    assert s["interval95"] == pytest.approx([-half, half])
    assert _script().score({"ddp": {0: 1.0}, "ring": {0: 1.1}}, {"ring": "ddp"})["ring"]["interval95"] is None


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


def test_the_last_checks_are_averaged_over_the_same_steps_in_every_run():
    curves = {"ddp": {0: {20: 0.9, 40: 0.5, 60: 0.3}}, "ring": {0: {20: 0.8, 40: 0.7, 60: 0.1}}}
    two = _script().final_losses(curves, 2)
    assert (two["ddp"][0], two["ring"][0]) == pytest.approx((0.4, 0.4))
    assert _script().final_losses(curves, 1) == {"ddp": {0: 0.3}, "ring": {0: 0.1}}
    curves["ring"][0] = {30: 0.7, 60: 0.1}  # validated every 30 steps: its last two checks differ
    with pytest.raises(SystemExit, match=r"--score-last 2: run ring-0 has checks at steps \[30, 60\]"):
        _script().final_losses(curves, 2)
    with pytest.raises(SystemExit, match="--score-last 4: run ddp-0 has checks at steps"):
        _script().final_losses({"ddp": {0: {20: 0.9, 40: 0.5, 60: 0.3}}}, 4)
    with pytest.raises(SystemExit, match="--score-last 0: expected a positive"):
        _script().final_losses(curves, 0)


def test_a_configuration_against_itself_on_other_seeds():
    sp = _script().seed_spread({0: 1.0, 1: 1.04, 2: 0.9})
    # ordered pairs: 1.04/1 +4%, 1/1.04 -3.8%, 0.9/1 -10%, 1/0.9 +11.1%, 0.9/1.04 -13.5%, 1.04/0.9 +15.6%
    assert (sp["pairs"], sp["within"], sp["within_both"]) == (6, 4, 2)
    ordered = [1.04 / 1 - 1, 1 / 1.04 - 1, 0.9 / 1 - 1, 1 / 0.9 - 1, 0.9 / 1.04 - 1, 1.04 / 0.9 - 1]
    mean = sum(ordered) / 6
    sample_sd = (sum((r - mean) ** 2 for r in ordered) / 5) ** 0.5  # n - 1: the SD the docs quote
    assert sp["sd"] == pytest.approx(sample_sd)
    assert _script().seed_spread({0: 1.0})["pairs"] == 0


def test_seeds_must_be_integers():
    assert _script().parse_seeds("0,1,2") == [0, 1, 2]
    with pytest.raises(SystemExit, match="--seeds 'a,b': expected comma-separated integers"):
        _script().parse_seeds("a,b")


def _checkpoint(run, cfg, model_state, workers=None):
    """A checkpoint as `caramel train` writes it (`loop.save_checkpoint`), written directly."""
    from caramel.train import checkpoint as ckpt

    state = {"step": 7, "epoch": 0, "index": 0, "model": model_state, "optimizer": {}, "scheduler": {},
             "rng": [ckpt.rng_state()], "config": cfg.to_dict()}
    if workers is not None:
        state["gossip_workers"] = workers
    ckpt.save(run / "checkpoints", 7, state, max(1, len(workers or [])), keep_last=2)


def test_evaluate_workers_scores_each_model_as_train_evaluates(tmp_path, monkeypatch):
    """The averaged model and each worker's own, each scored on the validation samples as
    `caramel train`'s `evaluate` scores a model (one rank: its all-reduce is the identity). The
    sample cap is set below the digits set's 180 validation samples, so both read only the first
    100 and a scorer that ignored the cap would differ."""
    from types import SimpleNamespace

    import torch

    from caramel.train import loop
    from caramel.train.config import TrainConfig, apply_dict
    from caramel.train.workloads import build_workload

    cfg = apply_dict(TrainConfig(), {"run": {"workload": "digits", "out_dir": str(tmp_path)}}, "test")
    wl = build_workload(cfg)
    assert len(wl.val_set) > 100
    monkeypatch.setattr(loop, "VAL_MAX_SAMPLES", 100)  # read by both scorers at call time
    base = {k: v.detach().clone() for k, v in wl.model.state_dict().items()}
    torch.manual_seed(1)
    workers = [{k: v + 0.05 * (i + 1) * torch.randn_like(v) if v.is_floating_point() else v.clone()
                for k, v in base.items()} for i in range(2)]
    assert _script().evaluate_workers(tmp_path) is None  # no checkpoint yet
    _checkpoint(tmp_path, cfg, base)
    assert _script().evaluate_workers(tmp_path) is None  # a checkpoint without workers' states (DDP)
    _checkpoint(tmp_path, cfg, base, [{"model": w, "steps": 7} for w in workers])

    got = _script().evaluate_workers(tmp_path)

    monkeypatch.setattr(loop.dist, "all_reduce", lambda t: None)
    d = SimpleNamespace(world_size=1, rank=0, device=torch.device("cpu"))

    def train_loss(weights):
        wl.model.load_state_dict(weights)
        engine = SimpleNamespace(synchronize=lambda: None, eval_module=lambda: wl.model)
        return loop.evaluate(engine, wl, d, cfg.data.batch_size)["val_loss"]

    want = [train_loss(w) for w in (base, *workers)]
    monkeypatch.setattr(loop, "VAL_MAX_SAMPLES", len(wl.val_set))
    assert train_loss(base) != pytest.approx(want[0], rel=1e-6)  # the cap changes the score: it is tested
    assert got["step"] == 7
    assert got["averaged"] == pytest.approx(want[0], rel=1e-6)
    assert got["workers"] == pytest.approx(want[1:], rel=1e-6)
    assert len({round(x, 6) for x in want}) == 3  # three different models, told apart and in rank order


def test_collect_only_scores_stored_runs_on_their_last_checks(tmp_path, monkeypatch, capsys):
    """The path that scores a study: `--collect-only --score-last 2` over run folders as `caramel
    train` leaves them (metrics.jsonl only; no checkpoints, so no workers' models). `scores` is
    the mean of the last two checks, `scores_final_check` the last check alone; they differ here."""
    import json
    import sys

    curves = {"ddp-0": {20: 0.9, 40: 0.5, 60: 0.3}, "ddp-1": {20: 0.8, 40: 0.4, 60: 0.2},
              "ring-0": {20: 0.9, 40: 0.6, 60: 0.3}, "ring-1": {20: 0.8, 40: 0.2, 60: 0.3}}
    for run, curve in curves.items():
        (tmp_path / run).mkdir()
        lines = [{"kind": "train", "step": k, "loss": 1.0} for k in curve]
        lines += [{"kind": "val", "step": k, "val_loss": v} for k, v in curve.items()]
        (tmp_path / run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "scores.json"
    monkeypatch.setattr(sys, "argv", ["gossip_convergence.py", "--runs", str(tmp_path), "--seeds", "0,1",
                                      "--config", "ddp=ddp", "--config", "ring=gossip:topology=ring",
                                      "--score-last", "2", "--collect-only", "--json", str(out)])
    _script().main()
    got = json.loads(out.read_text())
    assert got["score_last"] == 2
    assert got["scores"]["ring"]["relative"] == pytest.approx({"0": 0.45 / 0.4 - 1, "1": 0.25 / 0.3 - 1})
    assert got["scores_final_check"]["ring"]["relative"] == pytest.approx({"0": 0.0, "1": 0.3 / 0.2 - 1})
    assert got["seed_spread"]["ddp"]["pairs"] == 2  # on the primary score: 0.4 against 0.3
    assert got["seed_spread"]["ddp"]["sd"] == pytest.approx(abs((0.4 / 0.3 - 1) - (0.3 / 0.4 - 1)) / 2 ** 0.5)
    assert "ring vs ddp" in capsys.readouterr().out


def _write_runs(root, curves):
    """Run folders as `caramel train` leaves them: metrics.jsonl with the validation records."""
    import json

    for run, curve in curves.items():
        (root / run).mkdir(parents=True)
        lines = [{"kind": "val", "step": k, "val_loss": v} for k, v in curve.items()]
        (root / run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_stored_reference_is_scored_only_where_runs_reproduce_it_exactly(tmp_path, monkeypatch, capsys):
    """`--stored ddp=FILE`: DDP's curves come from an earlier results file; a DDP run in --runs that
    matches it bit for bit is listed as reproduced, one that differs in the last bit of one check
    stops the script naming the run and the step (a reference from other code is reused only if
    it is the same computation)."""
    import json
    import sys

    old = {"workload": "char_gpt", "workers": 4, "configs": {"ddp": "--strategy ddp", "ring": "--strategy gossip"},
           "val_loss": {"ddp": {"0": {"60": 2.0, "120": 0.1 + 0.2}, "1": {"60": 2.5, "120": 1.5}},
                        "ring": {"0": {"60": 2.1, "120": 0.33}, "1": {"60": 2.4, "120": 1.8}}}}
    ref = tmp_path / "old.json"
    ref.write_text(json.dumps(old))
    runs = tmp_path / "runs"
    _write_runs(runs, {"new-0": {60: 2.0, 120: 0.36}, "new-1": {60: 2.5, 120: 1.2}, "ddp-0": {60: 2.0, 120: 0.1 + 0.2}})
    out = tmp_path / "scores.json"
    argv = ["gossip_convergence.py", "--runs", str(runs), "--seeds", "0,1", "--workload", "char_gpt",
            "--config", "new=gossip", "--stored", f"ddp={ref}", "--stored", f"ring={ref}", "--vs", "new=ddp",
            "--vs", "ring=ddp", "--paired", "new=ring", "--collect-only", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=r"--stored ring: no ring-SEED run in --runs reproduces the stored curves"):
        _script().main()  # ring has no run here: its curves are refused unless the study says otherwise
    monkeypatch.setattr(sys, "argv", argv + ["--stored-unverified"])
    _script().main()
    got = json.loads(out.read_text())
    assert got["stored"]["ddp"]["reproduced_seeds"] == [0] and got["stored"]["ring"]["reproduced_seeds"] == []
    assert got["stored"]["ring"]["unverified_allowed"] is True
    assert got["validation"] == {"every_steps": 40, "max_samples": 1024, "val_fraction": {"new": None, "ddp": None,
                                                                                          "ring": None}}
    assert got["configs"]["ddp"] == "--strategy ddp"
    assert got["scores"]["new"]["relative"] == pytest.approx({"0": 0.36 / 0.30000000000000004 - 1, "1": 1.2 / 1.5 - 1})
    p = got["paired"][0]
    want = {"0": 0.36 / 0.3 - 0.33 / 0.3, "1": 1.2 / 1.5 - 1.8 / 1.5}
    assert p["difference"] == pytest.approx(want) and (p["a_higher"], p["seeds"]) == (1, 2)
    assert "reproduce them exactly on seeds [0]" in capsys.readouterr().out
    only_ddp = ["gossip_convergence.py", "--runs", str(runs), "--seeds", "0,1", "--workload", "char_gpt",
                "--config", "new=gossip", "--stored", f"ddp={ref}", "--vs", "new=ddp", "--collect-only",
                "--json", str(out), "--require-reproduced", "0"]
    monkeypatch.setattr(sys, "argv", only_ddp)
    _script().main()  # ddp-0 reproduces: the rule is met
    assert json.loads(out.read_text())["stored"]["ddp"]["required_seeds"] == [0]
    monkeypatch.setattr(sys, "argv", sys.argv[:-1] + ["0,1"])
    with pytest.raises(SystemExit, match=r"--require-reproduced: no run ddp-1 in --runs reproduces the stored ddp"):
        _script().main()
    monkeypatch.setattr(sys, "argv", argv)
    (runs / "ddp-0" / "metrics.jsonl").write_text(json.dumps({"kind": "val", "step": 60, "val_loss": 2.0}) + "\n"
                                                  + json.dumps({"kind": "val", "step": 120, "val_loss": 0.3}) + "\n")
    with pytest.raises(SystemExit, match=r"ddp-0 in .* does not reproduce the stored curve: step 120 reads 0\.3, "
                                         r"stored 0\.30000000000000004"):
        _script().main()


def test_a_stored_file_must_match_the_study_and_hold_every_seed(tmp_path):
    import json

    ref = tmp_path / "old.json"
    ref.write_text(json.dumps({"workload": "digits", "workers": 4, "configs": {"ddp": "--strategy ddp"},
                               "val_loss": {"ddp": {"0": {"60": 1.0}}}}))
    val = {"every_steps": 60, "max_samples": 1024}
    assert _script().load_stored(f"ddp={ref}", "digits", 4, [0], val) == ("ddp", "--strategy ddp", {0: {60: 1.0}}, None)
    with pytest.raises(SystemExit, match="is digits on 4 workers, expected char_gpt on 4"):
        _script().load_stored(f"ddp={ref}", "char_gpt", 4, [0], val)
    with pytest.raises(SystemExit, match=r"has no configuration 'ring' \(it has ddp\)"):
        _script().load_stored(f"ring={ref}", "digits", 4, [0], val)
    with pytest.raises(SystemExit, match=r"has no run of ddp for seeds \[1\]"):
        _script().load_stored(f"ddp={ref}", "digits", 4, [0, 1], val)
    with pytest.raises(SystemExit, match="expected NAME=JSON"):
        _script().load_stored(str(ref), "digits", 4, [0], val)
    with pytest.raises(SystemExit, match="cannot read"):
        _script().load_stored(f"ddp={tmp_path / 'none.json'}", "digits", 4, [0], val)


def test_a_paired_difference_needs_one_baseline():
    scores = _script().score({"ddp": {0: 1.0, 1: 1.0}, "lr": {0: 2.0, 1: 2.0}, "a": {0: 1.1, 1: 0.9},
                              "b": {0: 1.0, 1: 1.0}, "c": {0: 2.2, 1: 2.2}}, {"a": "ddp", "b": "ddp", "c": "lr", "lr": "ddp"})
    p = _script().paired(scores, "a=b")
    assert p["difference"] == pytest.approx({0: 0.1, 1: -0.1}) and p["mean"] == pytest.approx(0.0)
    with pytest.raises(SystemExit, match="a is scored against ddp, c against lr"):
        _script().paired(scores, "a=c")
    with pytest.raises(SystemExit, match="both names must be scored"):
        _script().paired(scores, "a=ddp")


def test_a_stored_file_needs_the_flags_and_the_same_validation(tmp_path):
    """A file with curves but no flags for NAME is refused by name (not a bare KeyError), and one
    that records its validation settings must match this study's; its validation fraction comes
    back for the runs that check it."""
    import json

    ref = tmp_path / "old.json"
    ref.write_text(json.dumps({"workload": "digits", "workers": 4, "configs": {},
                               "val_loss": {"ddp": {"0": {"60": 1.0}}}}))
    val = {"every_steps": 60, "max_samples": 1024}
    with pytest.raises(SystemExit, match=r"has validation curves for 'ddp' but no configs\['ddp'\]"):
        _script().load_stored(f"ddp={ref}", "digits", 4, [0], val)
    ref.write_text(json.dumps({"workload": "digits", "workers": 4, "configs": {"ddp": "--strategy ddp"},
                               "validation": {"every_steps": 60, "max_samples": 512, "val_fraction": {"ddp": 0.3}},
                               "val_loss": {"ddp": {"0": {"60": 1.0}}}}))
    with pytest.raises(SystemExit, match=r"differs in its validation settings \(stored, here\): \{'max_samples': \(512, 1024\)\}"):
        _script().load_stored(f"ddp={ref}", "digits", 4, [0], val)
    assert _script().load_stored(f"ddp={ref}", "digits", 4, [0], {**val, "max_samples": 512})[3] == 0.3


def test_a_run_must_reproduce_every_stored_check_and_the_held_out_fraction(tmp_path):
    """A run with one check fewer or one more than the stored curve does not reproduce it (the
    union of the steps is compared), and neither does one held out with another fraction."""
    import json

    stored = {0: {60: 2.0, 120: 1.5}}
    _write_runs(tmp_path, {"ddp-0": {60: 2.0}})
    with pytest.raises(SystemExit, match=r"ddp-0 .* step 120 reads None, stored 1\.5"):
        _script().check_reproduced("ddp", stored, tmp_path, [0])
    (tmp_path / "ddp-0" / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "val", "step": k, "val_loss": v}) + "\n" for k, v in {60: 2.0, 120: 1.5, 180: 1.2}.items()))
    with pytest.raises(SystemExit, match=r"ddp-0 .* step 180 reads 1\.2, stored None"):
        _script().check_reproduced("ddp", stored, tmp_path, [0])
    stored[0][180] = 1.2
    assert _script().check_reproduced("ddp", stored, tmp_path, [0, 1], 0.3) == [0]  # no config.json: unchecked
    from caramel.jsonio import write_json
    from caramel.train.config import TrainConfig, apply_dict

    cfg = apply_dict(TrainConfig(), {"data": {"val_fraction": 0.1}}, "test")
    write_json(tmp_path / "ddp-0" / "config.json", cfg.to_json())  # as `caramel train` writes it
    with pytest.raises(SystemExit, match=r"ddp-0 .* held out 0\.1 of the data for validation, the stored runs 0\.3"):
        _script().check_reproduced("ddp", stored, tmp_path, [0], 0.3)
    assert _script().check_reproduced("ddp", stored, tmp_path, [0], 0.1) == [0]


def test_a_paired_difference_has_a_t_interval_over_its_own_differences():
    """The interval is over A's gap minus B's per seed, not over either gap alone."""
    scores = _script().score({"ddp": {0: 1.0, 1: 1.0, 2: 1.0}, "a": {0: 1.1, 1: 0.9, 2: 1.3},
                              "b": {0: 1.05, 1: 0.95, 2: 1.0}}, {"a": "ddp", "b": "ddp"})
    p = _script().paired(scores, "a=b")
    diffs = [0.05, -0.05, 0.3]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    half = 4.302653 * sd / 3 ** 0.5  # t(0.975, 2 dof)
    assert p["mean"] == pytest.approx(0.1)
    assert p["interval95"] == pytest.approx([mean - half, mean + half])
