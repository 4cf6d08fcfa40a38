"""experiments/gpu_check.py: a clean exit without CUDA, and its CPU twin (gloo) passes parity."""
import torch

from experiments import gpu_check


def test_exits_cleanly_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_cpu_twin_matches_ddp(capsys):
    assert gpu_check.main(["--cpu", "--steps", "8", "--timing-steps", "2", "--timeout-s", "180"]) == 0
    assert "world=2: parity ok" in capsys.readouterr().out
