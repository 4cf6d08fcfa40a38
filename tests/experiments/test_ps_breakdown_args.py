"""experiments/ps_breakdown.py: --latency takes its unit, and a bare number is refused on every
rank before it joins the group (no process group is made here)."""
import sys

import pytest

pytestmark = pytest.mark.timeout(30)


def test_latency_needs_its_unit_before_joining(monkeypatch, capsys):
    from experiments import ps_breakdown

    class Joined(Exception):
        pass

    def join():
        raise Joined

    monkeypatch.setattr(ps_breakdown, "join", join)
    for bare in ("0.00035", "1.2m"):
        monkeypatch.setattr(sys, "argv", ["ps_breakdown.py", "--latency", bare])
        with pytest.raises(SystemExit) as e:
            ps_breakdown.main()
        assert e.value.code == 2 and f"--latency {bare!r}" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["ps_breakdown.py", "--latency", "350us"])
    with pytest.raises(Joined):  # parsed, on to the job
        ps_breakdown.main()
