"""The `caramel_ps` checkpoint entry: what a resumed run refuses, and when it plans again."""
from types import SimpleNamespace

import pytest

from caramel.errors import CaramelError
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.ps.resume import restore


def _run(**options):
    engine = SimpleNamespace(plan=SimpleNamespace(params=[0, 1]), stale=None, steps=0, version={})
    return SimpleNamespace(options=PsOptions(**options), groups=SimpleNamespace(dedicated=False), engine=engine,
                           pull_comm_s=None)


def _entry(**plan_options):
    return {"version": 1, "steps": 4, "plan": {"not": "read"}, "waits": {}, "unused": [], "pull_comm_s": None,
            "staleness": None, "plan_options": {"order": "tac", "placement": "balanced", "seed": 0,
                                                "bucket_cap_mb": PsOptions().bucket_cap_mb, **plan_options}}


def test_a_plan_made_with_other_options_is_not_adopted(capsys):
    run = _run(order="fifo")
    engine = run.engine
    restore(run, _entry())
    assert run.engine is engine and engine.steps == 4  # the step count is kept, the plan is made again
    assert "profiling again" in capsys.readouterr().out


def test_a_plan_made_with_another_pull_cap_is_not_adopted(capsys):
    run = _run(pull_bucket_cap_mb=0.25)
    restore(run, _entry(pull_bucket_cap_mb=1.0))
    assert "profiling again" in capsys.readouterr().out


def test_an_entry_saved_before_pull_buckets_reads_as_pulls_equal_pushes(capsys, monkeypatch):
    import caramel.strategies.ps.resume as resume
    seen = []
    monkeypatch.setattr(resume, "_fitting_plan", lambda run, plan: seen.append(plan))
    restore(_run(), _entry())  # no pull_bucket_cap_mb saved; the default pull cap is bucket_cap_mb's
    assert seen == [{"not": "read"}] and "profiling again" not in capsys.readouterr().out
    restore(_run(pull_bucket_cap_mb=0.5), _entry())
    assert "profiling again" in capsys.readouterr().out


@pytest.mark.parametrize("entry, message", [
    ([1, 2], "must be a mapping"),
    ({"version": 1, "steps": 3}, "lacks plan, waits, unused"),
])
def test_a_malformed_entry_is_one_error(entry, message):
    with pytest.raises(CaramelError, match=message):
        restore(_run(), entry)
