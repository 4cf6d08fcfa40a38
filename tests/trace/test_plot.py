"""PNG timeline: produced, non-empty, decodes; measured and predicted panels; bad requests error."""
from __future__ import annotations

import copy

import pytest

from caramel.errors import CaramelError
from caramel.trace.events import Trace
from caramel.trace.plot import PlotConfig, plot_timeline, step_window
from tests.trace.tracesynth import two_rank_trace

pytestmark = pytest.mark.timeout(120)


def _predicted() -> Trace:
    t = copy.deepcopy(two_rank_trace((9.0, 9.0, 9.0, 9.0)))
    t.source = "predicted"
    for e in t.events:
        e.start_s -= 100.0  # the simulator's clock starts at 0
    return t


def test_png_is_written_and_decodes(tmp_path):
    import matplotlib.image as mpimg

    single = plot_timeline(two_rank_trace(), tmp_path / "m.png")
    both = plot_timeline(two_rank_trace(), tmp_path / "mp.png", predicted=_predicted())
    for path in (single, both):
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    a, b = mpimg.imread(single), mpimg.imread(both)
    assert a.ndim == 3 and a.shape[0] > 100 and a.shape[1] > 100
    # two panels stacked: the measured+predicted figure is taller, same width
    assert b.shape[1] == a.shape[1] and b.shape[0] > 1.5 * a.shape[0]
    # not a blank canvas: bars in several colours
    assert len({tuple(px) for px in a.reshape(-1, a.shape[2])[::97]}) > 5


def test_step_window_picks_forward_starts():
    t = two_rank_trace()  # steps at 0, 10, 22, 32 ms from 100 s
    t0, t1, chosen = step_window(t, 1, 2)
    assert chosen == [1, 2]
    assert t0 == pytest.approx(100.010) and t1 == pytest.approx(100.032)
    # asking for more than exists shows the last steps; the window ends at the last event
    t0, t1, chosen = step_window(t, 3, 3)
    assert chosen == [1, 2, 3] and t1 == pytest.approx(max(e.end_s for e in t.events))


def test_bad_requests_are_clear_errors(tmp_path):
    with pytest.raises(CaramelError, match="nothing to plot"):
        plot_timeline(None, tmp_path / "x.png")
    with pytest.raises(CaramelError, match="count >= 1"):
        plot_timeline(two_rank_trace(), tmp_path / "x.png", config=PlotConfig(num_steps=0))
    empty = Trace("measured", 1, [])
    with pytest.raises(CaramelError, match="no 'forward' events"):
        plot_timeline(empty, tmp_path / "x.png")
    (tmp_path / "dir.png").mkdir()
    with pytest.raises(CaramelError, match="cannot write the PNG"):
        plot_timeline(two_rank_trace(), tmp_path / "dir.png")
