"""The seed-diagnosis script: its arguments, its consensus distance and its run flags."""
import pytest
import torch

from experiments import gossip_seed_diagnosis as gsd


def test_consensus_is_the_mean_squared_distance_to_the_exact_average():
    workers = [{"w": torch.tensor([0.0, 0.0]), "n": torch.tensor(3)},
               {"w": torch.tensor([2.0, 4.0]), "n": torch.tensor(3)}]
    dist, avg = gsd.consensus_sq(workers)
    assert torch.equal(avg["w"], torch.tensor([1.0, 2.0]))
    assert avg["n"] is workers[0]["n"]  # integer buffers are not averaged
    assert dist == pytest.approx((1 + 4 + 1 + 4) / 2)


def test_runs_keep_every_checkpoint_on_the_seed_study_split():
    flags = gsd.configs(gsd.RING, 240, 20)
    assert flags["ring"][:2] == ["--strategy", gsd.RING] and flags["ddp"][:2] == ["--strategy", "ddp"]
    assert flags["ring"][flags["ring"].index("--keep-last") + 1] == "13"
    assert flags["ring"][flags["ring"].index("--val-fraction") + 1] == "0.3"


@pytest.mark.parametrize("argv, message", [
    (["--every", "0"], "--every 0"),
    (["--every", "50", "--steps", "20"], "--every 50"),
    (["--strategy", "ddp"], "expected a gossip strategy"),
    (["--seeds", "6,x"], "--seeds"),
    (["--swap", "0-6"], "--swap '0-6': expected INIT_SEED:DATA_SEED"),
])
def test_bad_arguments_are_named(tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        gsd.main(["--runs", str(tmp_path), "--analyze-only", *argv])


def test_analyzing_a_run_without_checkpoints_says_so(tmp_path):
    (tmp_path / "ddp-6").mkdir()
    (tmp_path / "ddp-6" / "metrics.jsonl").write_text('{"kind": "val", "step": 20, "val_loss": 1.0}\n')
    (tmp_path / "ring-6" / "checkpoints").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no checkpoints"):
        gsd.main(["--runs", str(tmp_path), "--analyze-only", "--seeds", "6"])


def test_a_swap_is_init_seed_then_data_seed():
    assert gsd.parse_swap("0:6") == (0, 6)


def test_a_tiny_pair_of_runs_is_diagnosed(tmp_path):
    """Two hand-written checkpoints (a 2-worker gossip run and a DDP run on digits) go through
    the whole analysis: the workers' spread, the exact average's loss and the sample gap."""
    from caramel.train import checkpoint as ckpt
    from caramel.train.config import TrainConfig
    from caramel.train.workloads import build_workload

    cfg = TrainConfig()
    cfg.run.workload = "digits"
    base = {k: v.clone() for k, v in build_workload(cfg).model.state_dict().items()}
    shift = {k: torch.full_like(v, 0.01) if v.is_floating_point() else torch.zeros_like(v) for k, v in base.items()}
    workers = [{"model": {k: base[k] + shift[k] for k in base}}, {"model": {k: base[k] - shift[k] for k in base}}]
    common = {"step": 20, "epoch": 0, "index": 0, "optimizer": {}, "scheduler": {}, "rng": [{}, {}],
              "config": cfg.to_dict()}
    ckpt.save(tmp_path / "ring-6" / "checkpoints", 20, {**common, "model": base, "gossip_workers": workers}, 2, 5)
    ckpt.save(tmp_path / "ddp-6" / "checkpoints", 20, {**common, "model": base}, 2, 5)
    (tmp_path / "ddp-6" / "metrics.jsonl").write_text('{"kind": "val", "step": 20, "val_loss": 2.0}\n'
                                                      '{"kind": "train", "step": 20, "loss": 2.1}\n')
    (tmp_path / "ring-6" / "metrics.jsonl").write_text('{"kind": "train", "step": 20, "loss": 2.2}\n')
    out = gsd.main(["--runs", str(tmp_path), "--analyze-only", "--seeds", "6", "--json", str(tmp_path / "d.json")])
    (row,) = out["seeds"][0]["checkpoints"]
    n = sum(v.numel() for v in base.values() if v.is_floating_point())
    assert row["consensus_sq"] == pytest.approx(n * 1e-4, rel=1e-4)
    assert row["exact_average"] == pytest.approx(row["eval_model"], rel=1e-6)
    final = out["seeds"][0]["final_samples"]
    assert final["diff_sum"] == pytest.approx(0.0, abs=1e-4) and final["ring_errors"] == final["ddp_errors"]
    assert out["seeds"][0]["train_loss_last_quarter"] == {"ddp": 2.1, "ring": 2.2}
