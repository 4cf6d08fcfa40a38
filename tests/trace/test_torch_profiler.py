"""The torch.profiler wrapper writes per-rank Kineto traces with what HTA requires (CPU run here)."""
from __future__ import annotations

import glob
import json

import pytest

from caramel.errors import CaramelError
from caramel.trace.torch_profiler import ProfilerConfig, caramel_profiler, comm_annotation

pytestmark = pytest.mark.timeout(120)


def _train(prof, steps: int) -> None:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with prof:
        for _ in range(steps):
            loss = model(torch.randn(16, 8)).square().mean()
            loss.backward()
            with torch.profiler.record_function(comm_annotation(0, 1)):
                pass
            opt.step()
            opt.zero_grad()
            prof.step()


def _load(trace_dir) -> list[dict]:
    files = sorted(glob.glob(f"{trace_dir}/*.pt.trace.json"))
    traces = []
    for f in files:
        with open(f) as fh:
            traces.append(json.load(fh))
    return traces, files


def test_single_process_trace_has_rank_and_steps(tmp_path):
    import torch

    torch.set_num_threads(1)
    cfg = ProfilerConfig(str(tmp_path / "prof"), wait_steps=1, warmup_steps=1, active_steps=2, cuda=False)
    _train(caramel_profiler(cfg, rank=3, world_size=4), steps=5)
    traces, files = _load(tmp_path / "prof")
    assert len(files) == 1 and "/rank3." in files[0]
    t = traces[0]
    assert t["distributedInfo"]["rank"] == 3 and t["distributedInfo"]["world_size"] == 4
    names = {e.get("name", "") for e in t["traceEvents"]}
    steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # wait 1 + warmup 1, then 2 active
    assert "caramel/b0c1/allreduce" in names


def test_initialized_group_supplies_its_own_rank(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        cfg = ProfilerConfig(str(tmp_path / "prof"), wait_steps=0, warmup_steps=1, active_steps=1, cuda=False)
        _train(caramel_profiler(cfg, rank=7), steps=3)
    finally:
        dist.destroy_process_group()
    traces, files = _load(tmp_path / "prof")
    assert len(files) == 1 and "/rank0." in files[0]
    assert traces[0]["distributedInfo"]["rank"] == 0 and traces[0]["distributedInfo"]["backend"] == "gloo"


def test_bad_config_is_a_clear_error():
    with pytest.raises(CaramelError, match="active_steps must be >= 1"):
        ProfilerConfig("x", active_steps=0)
    with pytest.raises(CaramelError, match="wait_steps must be >= 0"):
        ProfilerConfig("x", wait_steps=-1)
