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
