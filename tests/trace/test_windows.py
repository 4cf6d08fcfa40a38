"""The first-needed bucket's window lead, from a timeline (caramel.trace.windows)."""
from types import SimpleNamespace

from caramel.trace.events import Trace, TraceEvent
from caramel.trace.windows import first_bucket_leads, mean_lead, window_meta


def ev(rank, lane, kind, name, start, dur, it, bucket=None):
    return TraceEvent(rank, lane, kind, name, start, dur, it, bucket=bucket)


def step(rank, it, t0, deferred):
    """Backward 0.1 s from t0; bucket 1 (needed first) ready after the first deferred weight
    gradient when `deferred`, else at the end of backward; bucket 0 ready mid-backward."""
    out = [ev(rank, "compute", "forward", "forward", t0 - 0.05, 0.05, it),
           ev(rank, "compute", "backward", "backward", t0, 0.1, it),
           ev(rank, "comm", "ready", "ready:b0", t0 + 0.05, 0.0, it, bucket=0)]
    if deferred:
        out += [ev(rank, "compute", "deferred", "wgrad:a", t0 + 0.1, 0.01, it),
                ev(rank, "comm", "ready", "ready:b1", t0 + 0.11, 0.0, it, bucket=1),
                ev(rank, "compute", "deferred", "wgrad:b", t0 + 0.11, 0.03, it)]
    else:
        out.append(ev(rank, "comm", "ready", "ready:b1", t0 + 0.1, 0.0, it, bucket=1))
    return out


def trace(deferred, meta):
    events = [e for r in (0, 1) for it in range(3) for e in step(r, it, 1.0 * it + 0.1 * r, deferred)]
    return Trace("measured", 2, events, meta)


def test_lead_is_the_deferred_work_after_the_first_needed_bucket():
    t = trace(True, {"first_needed_bucket": 1})
    leads = first_bucket_leads(t, skip_iterations=1)
    assert [(x.rank, x.iteration) for x in leads] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    for x in leads:
        assert abs(x.lead_s - 0.03) < 1e-9 and abs(x.deferred_s - 0.04) < 1e-9
    m = mean_lead(t)
    assert abs(m["first_bucket_lead_s"] - 0.03) < 1e-9 and abs(m["deferred_s"] - 0.04) < 1e-9


def test_without_deferral_the_window_opens_as_backward_ends():
    m = mean_lead(trace(False, {"first_needed_bucket": 1}))
    assert abs(m["first_bucket_lead_s"]) < 1e-9 and m["deferred_s"] == 0.0
    # another bucket's lead is measured the same way: bucket 0 is ready mid-backward
    assert abs(mean_lead(trace(False, {"first_needed_bucket": 0}))["first_bucket_lead_s"] - 0.05) < 1e-9


def test_a_trace_that_names_no_bucket_has_no_lead():
    assert mean_lead(trace(True, {})) is None


def test_window_meta_names_the_bucket_needed_first_and_the_deferred_modules():
    b = lambda i, need: SimpleNamespace(id=i, need_time_s=need)  # noqa: E731
    plan = SimpleNamespace(buckets=[b(0, 0.3), b(1, None), b(2, 0.01), b(3, 0.2)],
                           compute_schedule=SimpleNamespace(modules=["conv1", "layer1.0.conv1"]))
    assert window_meta(plan) == {"first_needed_bucket": 2, "deferred_modules": ["conv1", "layer1.0.conv1"]}
    assert window_meta(SimpleNamespace(buckets=[b(0, None)], compute_schedule=None)) == \
        {"first_needed_bucket": None, "deferred_modules": []}
