"""The profiler measures each splittable module's split backward: times, deferred and input bytes."""
import torch
import torch.nn as nn

from caramel.plan.compute_schedule import deferrable_modules, deferred_profile, max_k, schedule_for
from caramel.profile.profiler import profile_model


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 8)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8 * 6, 4)

    def forward(self, ids):
        h = self.emb(ids).transpose(1, 2)                     # (B, 8, 6)
        h = torch.relu(self.conv(h)).transpose(1, 2)          # (B, 6, 8)
        return self.fc(self.norm(h).flatten(1))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(16, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.tok(ids))))


def test_profiler_measures_the_split_backward():
    torch.manual_seed(0)
    model = Small()
    ids, y = torch.randint(0, 32, (5, 6)), torch.randn(5, 4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    prof = profile_model(model, ids, y, nn.functional.mse_loss, steps=2)
    by = {m.name: m for m in prof.modules}
    assert [m.name for m in prof.modules] == ["emb", "conv", "norm", "fc"]
    for name in ("emb", "conv", "fc"):
        m = by[name]
        assert m.splittable and m.weight_grad_time_s is not None and m.input_grad_time_s is not None
        assert m.weight_grad_time_s >= 0 and m.input_grad_time_s >= 0
        assert abs(m.input_grad_time_s + m.weight_grad_time_s - m.backward_time_s) < 1e-12
    assert not by["norm"].splittable and by["norm"].weight_grad_time_s is None and by["norm"].deferred_bytes is None
    # deferred bytes: the input and the output gradient of one step (float32; the embedding's ids are int64)
    assert by["emb"].deferred_bytes == 5 * 6 * 8 + 5 * 6 * 8 * 4
    assert by["conv"].deferred_bytes == 2 * 5 * 8 * 6 * 4
    assert by["fc"].deferred_bytes == 5 * 48 * 4 + 5 * 4 * 4
    assert by["fc"].input_bytes == 5 * 48 * 4 and by["emb"].input_bytes == 5 * 6 * 8
    # the split steps did not touch the parameters (SGD with lr=0) nor leave gradients
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and p.grad is None
    assert "forward" not in model.fc.__dict__  # the split forward was removed
    assert [prof.modules[i].name for i in deferrable_modules(prof)] == ["emb", "conv", "fc"]
    out = deferred_profile(prof, schedule_for(prof, 3))
    assert out.params[0].ready_time_s <= prof.params[0].ready_time_s + 1e-12
    assert max_k(prof, cap_bytes=10**9) == 3


def test_tied_weights_are_not_split():
    torch.manual_seed(0)
    model = Tied()
    ids = torch.randint(0, 16, (4, 5))
    prof = profile_model(model, ids, torch.randn(4, 5, 16), nn.functional.mse_loss, steps=1)
    by = {m.name: m for m in prof.modules}
    assert by["mid"].splittable
    assert not by["tok"].splittable and not by["head"].splittable
    assert [prof.modules[i].name for i in deferrable_modules(prof)] == ["mid"]


def test_caramel_profile_prints_windows_with_and_without_deferral(capsys):
    from caramel.cli import main
    assert main(["profile", "--model", "mlp", "--steps", "1", "--warmup", "0", "--defer", "2", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "deferred weight gradients: 2 of" in out and "extra memory (cap" in out
    assert "deferred: ready ms" in out and "window ms" in out
    assert main(["profile", "--model", "mlp", "--steps", "1", "--warmup", "0", "--defer", "99"]) != 0
    assert "--defer 99" in capsys.readouterr().err
