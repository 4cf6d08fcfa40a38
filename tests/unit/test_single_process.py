"""One process, no torchrun: the same script runs unchanged and trains exactly like plain PyTorch."""
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent("""
    import copy, torch, caramel
    from caramel.models import get_model
    info = caramel.init_distributed()
    assert caramel.init_distributed() == info          # idempotent
    assert (info.rank, info.world_size) == (0, 1), info
    w = get_model("tiny_gpt")(batch_size=4)
    ref = copy.deepcopy(w.model)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    sched_r = torch.optim.lr_scheduler.StepLR(ropt, 3, 0.5)
    opt = torch.optim.AdamW(w.model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)   # created before parallelize
    model, opt = caramel.parallelize(w.model, opt)
    for step in range(10):
        for m, o, s in ((model, opt, sched), (ref, ropt, sched_r)):
            loss = w.loss_fn(m(w.inputs), w.targets); loss.backward(); o.step(); s.step(); o.zero_grad()
    opt.synchronize()
    diff = max(float((a - b).abs().max()) for a, b in zip(model.module.parameters(), ref.parameters()))
    assert diff == 0.0, diff
    assert opt.engine.stats.step == 10
    assert isinstance(opt, torch.optim.AdamW)
    print("OK")
""")


@pytest.mark.timeout(120)
def test_single_process_without_torchrun(tmp_path):
    script = tmp_path / "single.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning:torch.optim.lr_scheduler", str(script)],
                          capture_output=True, text=True, timeout=110, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout


TEARDOWN_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist, caramel

    def gloo_threads():
        names = []
        for t in os.listdir("/proc/self/task"):
            try:
                names.append(open(f"/proc/self/task/{t}/comm").read().strip())
            except OSError:
                pass
        return sorted(n for n in names if "gloo" in n)

    caramel.init_distributed()
    end = time.monotonic() + 10  # the backend's threads name themselves once running
    while len(gloo_threads()) < 2 and time.monotonic() < end:
        time.sleep(0.01)
    assert gloo_threads(), "no gloo thread to look for"
    assert "torch._dynamo" not in sys.modules  # else the step below imports nothing
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(3, 2)).sum().backward()
    opt.step()
    assert "torch._dynamo" in sys.modules  # the import that would pin the group
    dist.destroy_process_group()
    assert gloo_threads() == [], gloo_threads()
    print("OK")
""")


@pytest.mark.timeout(60)
def test_destroying_the_group_after_an_optimizer_step_stops_its_threads(tmp_path):
    """The first optimizer step imports torch modules whose default arguments would hold the
    default group: destroy_process_group() must still end its gloo threads, not leave them to
    the interpreter's teardown (where a rank can abort while its peer exits)."""
    script = tmp_path / "teardown.py"
    script.write_text(TEARDOWN_SCRIPT)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout


@pytest.fixture
def no_group_left_behind():
    """A check that fails after `parallelize` set up the default group (world size 1) must not
    leave that group to the tests that run after it in this process."""
    import torch.distributed as dist
    had = dist.is_initialized()
    yield
    if dist.is_initialized() and not had:
        dist.destroy_process_group()


def test_parallelize_rejects_bad_arguments(no_group_left_behind):
    import caramel
    model = torch.nn.Linear(2, 2)
    with pytest.raises(caramel.CaramelError, match="split_tied"):
        caramel.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), split_tied="yes")
    with pytest.raises(caramel.CaramelError, match="overlap"):
        caramel.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), overlap="sideways")
    with pytest.raises(caramel.CaramelError, match="optimizer"):
        caramel.parallelize(model, "sgd")
    other = torch.nn.Linear(3, 3)
    with pytest.raises(caramel.CaramelError, match="not a parameter of the model"):
        caramel.parallelize(model, torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(caramel.CaramelError, match="replan"):
        caramel.parallelize(model, torch.optim.SGD(model.parameters(), lr=0.1), replan="sometimes")


@pytest.mark.timeout(30)
def test_parallelize_bad_plan_or_profile_leaves_nothing_behind(tmp_path, no_group_left_behind):
    """A plan or profile that cannot be read fails before any group, hook or optimizer wrapper
    exists: the same model and optimizer parallelize cleanly afterwards."""
    import torch.distributed as dist

    import caramel
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    had = dist.is_initialized()
    for kwargs in ({"plan": tmp_path / "missing.json"}, {"plan": bad}, {"profile": tmp_path / "missing.json"}):
        with pytest.raises(caramel.CaramelError):
            caramel.parallelize(model, opt, **kwargs)
        assert dist.is_initialized() == had, kwargs
        assert not hasattr(opt, "_caramel_engine"), kwargs
    wrapped, opt = caramel.parallelize(model, opt)
    wrapped(torch.randn(3, 2)).sum().backward()
    opt.step()
    opt.synchronize()
