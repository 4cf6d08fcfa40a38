"""The trace tools on a real 2-rank CPU run of the runtime (gloo on loopback, spawned, time-limited)."""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

from caramel.plan.plan import Plan
from caramel.testing import run_workers
from caramel.trace.chrome import to_chrome
from caramel.trace.load import load_traces
from caramel.trace.plot import plot_timeline
from caramel.trace.summary import summarize
from caramel.trace.validate import check_trace

pytestmark = pytest.mark.timeout(240)
STEPS = 8


def _train(rank: int, world: int, out: str) -> dict:
    import torch

    import caramel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # small fifo buckets: several buckets per step, and a plan that stays fixed for the whole run
    model, opt = caramel.parallelize(model, opt, planner="fifo", trace=f"{out}/run.json", profile_steps=1,
                                     bucket_cap_mb=0.02, first_bucket_mb=0.01)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()
    return opt.engine.plan.to_dict()


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("real")
    plans = run_workers(_train, 2, args=(str(out),), timeout_s=180, collective_timeout_s=60)
    assert plans[0] == plans[1]
    return out, Plan.from_dict(plans[0])


def test_real_trace_executes_its_plan(real_run):
    out, plan = real_run
    trace = load_traces([out])
    assert len(plan.buckets) >= 2
    # the runtime starts on a provisional one-bucket plan while it measures, then switches to `plan`
    readies = defaultdict(int)
    for e in trace.events:
        if e.rank == 0 and e.kind == "ready":
            readies[e.iteration] += 1
    first = min(k for k, n in readies.items() if n == len(plan.buckets))
    assert readies[0] == 1 and 0 < first < STEPS - 1
    # the runtime records a wait only when it blocked, and once per group of buckets waited for
    result = check_trace(trace, plan, require_waits=True, first_step=first)
    assert result.steps_checked == 2 * (STEPS - first)
    assert result.buckets_checked == 2 * (STEPS - first) * len(plan.buckets)


def test_real_trace_merges_nested_and_summarizes(real_run, tmp_path):
    out, plan = real_run
    trace = load_traces([out])
    chrome = to_chrome(trace)
    json.dumps(chrome)  # serializable as is
    by_tid = defaultdict(list)
    for e in chrome["traceEvents"]:
        if e["ph"] == "X":
            by_tid[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        for i, (s1, e1) in enumerate(spans):
            for s2, e2 in spans[i + 1:]:
                if s2 >= e1:
                    break
                assert e2 <= e1, "partial overlap in one lane"
    s = summarize(trace)
    assert s.aggregate["steps"] == STEPS - 1  # the last iteration has no next forward
    assert s.aggregate["bytes_per_step"] >= plan.total_bytes()
    for st in s.rank_steps:
        assert 0 <= st.hidden_comm_s <= st.comm_s <= st.step_time_s + 1e-9
        assert st.compute_s <= st.step_time_s + 1e-9
    png = plot_timeline(trace, tmp_path / "real.png")
    assert (tmp_path / "real.png").stat().st_size > 0 and png.endswith("real.png")
