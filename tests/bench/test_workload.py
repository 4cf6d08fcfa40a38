"""What each rank builds: identical model copies, user models from file.py:factory."""
import textwrap

import pytest
import torch

from caramel.bench.baselines import ComputeOnly
from caramel.bench.harness import make_workload
from caramel.bench.matrix import BenchConfig
from caramel.errors import CaramelError

USER_MODEL = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def factory():
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
        return model, (x, y), F.cross_entropy
''')


def test_copies_are_identical_for_one_seed():
    cfg = BenchConfig("resnet18", workers=2, bandwidth=None, batch_size=2, model_options={"width": 4})
    a, b = make_workload(cfg, 0, torch.device("cpu")), make_workload(cfg, 0, torch.device("cpu"))
    assert a.model is not b.model and a.inputs.shape[0] == 2
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_user_model_from_file(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(USER_MODEL)
    cfg = BenchConfig(f"{path}:factory", workers=1, bandwidth=None)
    w = make_workload(cfg, 0, torch.device("cpu"))
    runner = ComputeOnly(w.model, torch.optim.SGD(w.model.parameters(), lr=0.1), w.inputs, w.targets, w.loss_fn,
                         torch.device("cpu"))
    before = w.model[0].weight.detach().clone()
    runner.step()
    assert not torch.equal(before, w.model[0].weight)  # the baseline really trains


def test_unknown_factory_options_are_user_errors():
    cfg = BenchConfig("mlp", workers=1, bandwidth=None, model_options={"colour": "red"})
    with pytest.raises(CaramelError, match="colour"):
        make_workload(cfg, 0, torch.device("cpu"))
