"""Progress bar on rank 0 only, with samples/s, step time, exposed communication; scalars to a writer."""
from __future__ import annotations

import io
import sys
import types

import pytest

from caramel.errors import CaramelError
from caramel.trace.progress import ProgressConfig, TrainingProgress, open_tensorboard

pytestmark = pytest.mark.timeout(60)


class FakeWriter:
    def __init__(self):
        self.scalars: list[tuple[str, float, int]] = []
        self.closed = False

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def close(self):
        self.closed = True


def test_rank0_bar_shows_throughput_step_time_and_exposed_comm():
    out, writer = io.StringIO(), FakeWriter()
    cfg = ProgressConfig(total_steps=3, samples_per_step=64, desc="demo")
    with TrainingProgress(cfg, rank=0, file=out, writer=writer) as p:
        p.update_from_stats({"last_step_s": 0.032, "last_wait_s": 0.004, "step": 1}, loss=2.5)
        # the runtime's EngineStats is an object with attributes, not a dict
        p.update_from_stats(types.SimpleNamespace(last_step_s=0.032, last_wait_s=0.002), loss=2.25)
        values = p.update(step_time_s=0.064, exposed_comm_s=0.003, grad_norm=1.5)
    text = out.getvalue()
    # medians over the window: step 32 ms -> 64 / 0.032 = 2000 samples/s, exposed median 3 ms
    assert "demo" in text and "3/3" in text
    assert "2,000 samples/s" in text and "step 32.0 ms" in text and "exposed 3.0 ms" in text
    assert values == {"step_time_ms": 64.0, "samples_per_s": 1000.0, "exposed_comm_ms": 3.0, "grad_norm": 1.5}
    assert writer.closed
    tags = {(t, s): v for t, v, s in writer.scalars}
    assert tags[("caramel/samples_per_s", 1)] == pytest.approx(2000.0)
    assert tags[("caramel/exposed_comm_ms", 1)] == pytest.approx(4.0)
    assert tags[("train/loss", 2)] == pytest.approx(2.25)
    assert tags[("train/grad_norm", 3)] == pytest.approx(1.5)


def test_other_ranks_are_silent():
    out, writer = io.StringIO(), FakeWriter()
    p = TrainingProgress(ProgressConfig(total_steps=2, samples_per_step=8), rank=1, file=out, writer=writer)
    assert p.update(step_time_s=0.01) == {}
    p.close()
    assert out.getvalue() == "" and writer.scalars == []


def test_wall_clock_step_time_when_not_given():
    out = io.StringIO()
    with TrainingProgress(ProgressConfig(samples_per_step=10), file=out) as p:
        values = p.update()
    assert values["step_time_ms"] >= 0 and "step" in out.getvalue()


def test_missing_tensorboard_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails as if not installed
    with pytest.raises(CaramelError, match="needs the tensorboard package: pip install tensorboard"):
        open_tensorboard(str(tmp_path))
    with pytest.raises(CaramelError, match="tensorboard"):
        TrainingProgress(ProgressConfig(tensorboard_dir=str(tmp_path)), file=io.StringIO())
    # other ranks never import it
    TrainingProgress(ProgressConfig(tensorboard_dir=str(tmp_path)), rank=1).close()


def test_config_validation():
    with pytest.raises(CaramelError, match="samples_per_step"):
        ProgressConfig(samples_per_step=0)
    with pytest.raises(CaramelError, match="window_steps"):
        ProgressConfig(window_steps=0)
