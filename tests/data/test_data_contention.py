"""The data bench's contention calibration: the factor from its step against the parts measured
alone, and the calibration's steps themselves (one process, a real loader worker)."""
import time

import pytest
import torch

from caramel.bench.data_contention import WARMUP_STEPS, contention_factor, loaded_steps
from caramel.errors import CaramelError


def test_the_factor_is_the_loaded_step_over_its_parts_alone():
    # compute + all-reduce 5 ms alone, the batch's trip 1 ms alone; 7.5 ms beside busy workers
    assert contention_factor(7.5e-3, 5e-3, 1e-3) == pytest.approx(1.25)
    assert contention_factor(6e-3, 5e-3, 1e-3) == 1.0  # no slower: no contention
    assert contention_factor(5.5e-3, 5e-3, 1e-3) == 1.0  # faster than alone is noise, not a speedup
    assert contention_factor(None, 5e-3, 1e-3) == 1.0 and contention_factor(7e-3, None, 1e-3) == 1.0  # not measured


@pytest.mark.timeout(60)
def test_loaded_steps_time_the_benchs_step_beside_a_worker():
    samples = [(torch.full((64,), float(i)), torch.tensor(i)) for i in range(8)]
    calls = []

    def sync():
        calls.append(1)
        time.sleep(1e-3)

    out = loaded_steps(samples, batch_size=4, loader_workers=1, prefetch_factor=2, steps=WARMUP_STEPS + 6,
                       compute_s=2e-3, sync=sync)
    assert len(calls) == WARMUP_STEPS + 6  # every step's all-reduce, warm-up included (the ranks stay in step)
    assert out["compute_s"] >= 2e-3 and out["sync_s"] >= 1e-3 and out["wait_s"] > 0
    # a step is its wait, compute and all-reduce (back to back, nothing else timed between them)
    parts = out["wait_s"] + out["compute_s"] + out["sync_s"]
    assert parts <= out["step_s"] <= parts + 1e-3


def test_a_calibration_it_cannot_run_is_named():
    with pytest.raises(CaramelError, match="loader workers >= 1"):
        loaded_steps([(torch.zeros(1),)], 1, loader_workers=0, prefetch_factor=2, steps=10, compute_s=0.0,
                     sync=lambda: None)
    with pytest.raises(CaramelError, match=f"more than {WARMUP_STEPS} steps"):
        loaded_steps([(torch.zeros(1),)], 1, loader_workers=1, prefetch_factor=2, steps=WARMUP_STEPS, compute_s=0.0,
                     sync=lambda: None)
