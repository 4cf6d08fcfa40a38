"""Damaged checkpoints: refused with a CaramelError naming the checkpoint, `latest_valid` falls
back to the previous one, `caramel train --resume <damaged>` exits 2 with one line."""
import pytest

from experiments.faults.storage import OLD_STEP, checkpoint_experiment, flip_byte, truncate_half

DAMAGES = {
    "bit-flip": (lambda d: flip_byte(d / "state.pt"), "corrupt"),
    "truncated-state": (lambda d: truncate_half(d / "state.pt"), "corrupt"),
    "truncated-meta": (lambda d: truncate_half(d / "meta.json"), "meta.json"),
    "garbage-meta": (lambda d: (d / "meta.json").write_bytes(b"\x00\xff\xfe garbage"), "meta.json"),
    "missing-state": (lambda d: (d / "state.pt").unlink(), "state.pt is missing"),
    "missing-meta": (lambda d: (d / "meta.json").unlink(), "meta.json"),
    "state-replaced": (lambda d: (d / "state.pt").write_bytes(b"not a torch file"), "corrupt"),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_checkpoint_is_refused_and_the_previous_one_used(damage):
    fn, words = DAMAGES[damage]
    raw = checkpoint_experiment(fn, cli=damage in ("bit-flip", "truncated-meta"))
    assert raw["error_type"] == "CaramelError", raw["error"]
    assert "ckpt-000000020" in raw["error"] and words in raw["error"], raw["error"]
    assert raw["fallback_step"] == OLD_STEP
    if raw["cli_rc"] is not None:
        lines = [line for line in raw["cli_stderr"].splitlines() if line.strip()]
        assert raw["cli_rc"] == 2 and len(lines) == 1, raw["cli_stderr"]
        assert lines[0].startswith("caramel train: error:") and "ckpt-000000020" in lines[0]
