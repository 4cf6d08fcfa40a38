"""The bench's emulated slow worker: the flag's parsing and a delay that scales with the batch."""
import time

import pytest
import torch

from caramel.bench.matrix import BenchConfig, check_slow_worker
from caramel.errors import CaramelError
from caramel.profile.slowdown import slow_down

torch.set_num_threads(1)


def test_slow_worker_flag_parses_and_bad_values_say_what_is_expected():
    assert check_slow_worker("1:2", 2) == [1, 2.0] and check_slow_worker("0=1.5", 2) == [0, 1.5]
    cfg = BenchConfig(model="small_cnn", workers=2, slow_worker="1:2")
    assert cfg.slow_worker == [1, 2.0] and "rank 1 x2 slower" in cfg.label
    assert BenchConfig.from_dict(cfg.to_dict()) == cfg
    for bad, match in (("1", "RANK:FACTOR"), ("2:2", "between 0 and 1"), ("1:0.5", ">= 1"), ("a:b", "RANK:FACTOR")):
        with pytest.raises(CaramelError, match=match):
            check_slow_worker(bad, 2)


def test_the_delay_follows_the_local_batch_and_skips_evaluation():
    model = torch.nn.Linear(4, 2)
    slow_down(model, 0.004)

    def timed(n, grad=True):
        with torch.set_grad_enabled(grad):
            t0 = time.perf_counter()
            model(torch.randn(n, 4))
            return time.perf_counter() - t0
    assert timed(8) >= 0.032 and timed(2) >= 0.008
    assert timed(8, grad=False) < 0.01  # evaluation runs at full speed
