"""experiments/ps_e_measures.py: both kinds of run are scored as `stats_dict()` scores E, the
paired difference and table come from the jobs, and bad options are one clear error."""
import pytest

from experiments.ps_e_measures import markdown, parse_args, steady_parts, summarize


def log_of(es: list[float]) -> list[dict]:
    return [{"E": e, "S": 0.5, "wait_s": 0.01 * k, "forward_s": 0.03, "makespan_s": 0.05} for k, e in enumerate(es)]


def test_e_is_the_median_of_the_logs_last_three_quarters():
    log = log_of([0.0, 0.0, 0.9, 0.7, 0.8, 0.6, 0.5, 0.95])  # the first quarter (2 entries) left out
    parts = steady_parts(log + [{"step": 8, "forward_s": 0.03, "wait_s": 0.0}], pull_comm_s=0.036)  # a step without E
    assert parts["E_median"] == pytest.approx(0.75) and parts["E_steps"] == 6
    assert parts["pull_comm_ms"] == pytest.approx(36.0) and parts["makespan_ms"] == pytest.approx(50.0)
    # S as `stats_dict()` gives it: the median over E's steps, not the last step's
    varied = [{**x, "S": s} for x, s in zip(log, [9.0, 9.0, 0.4, 0.5, 0.6, 0.7, 0.8, 2.0])]
    assert steady_parts(varied, pull_comm_s=0.036)["S"] == pytest.approx(0.65)
    with pytest.raises(SystemExit, match="logged no E"):
        steady_parts([{"forward_s": 0.1, "wait_s": 0.0}] * 4, 0.03)


def test_the_difference_is_paired_by_round_and_tabled():
    def job(r, kind, e, step):
        return {"round": r, "kind": kind, "E_median": e, "step_s": [step] * 3, "median_step_ms": step * 1e3,
                "wait_ms": 5.0, "forward_ms": 30.0, "makespan_ms": 45.0, "pull_comm_ms": 36.0, "S": 0.8,
                "load_before": 1.0, "load_after": 2.0}
    jobs = [job(0, "plain", 0.70, 0.100), job(0, "timeline", 0.80, 0.110),
            job(1, "timeline", 0.78, 0.108), job(1, "plain", 0.72, 0.100)]
    jobs[3]["wait_ms"] = 7.0
    s = summarize(jobs, per_round=3)
    assert s["E_runs"] == {"plain": [0.70, 0.72], "timeline": [0.80, 0.78]}
    d = s["against_plain"]["timeline"]
    assert d["E_minus_plain"]["mean"] == pytest.approx(0.08)
    assert d["E_minus_plain"]["interval_95"][0] < 0.08 < d["E_minus_plain"]["interval_95"][1]
    assert d["wait_ms_minus_plain"]["mean"] == pytest.approx(-1.0)  # rounds: 0 and -2 ms
    assert d["step_plain_over"]["point"] == pytest.approx(0.100 / 0.109)
    text = markdown({"what": "ps", "command": "python experiments/ps_e_measures.py", "tree": "abc",
                     "summary": s, "jobs": jobs})
    assert "| E of the run, median (runs) | 0.71 (0.70, 0.72) | 0.79 (0.80, 0.78) |" in text
    assert "timeline against plain, paired by round: E +0.080" in text and "wait -1.0 ms" in text


@pytest.mark.parametrize("extra, message", [
    (["--spec", "ddp"], "--spec: expected a ps spec"),
    (["--workers", "1"], "expected --workers >= 2"),
    (["--rounds", "0"], "expected --rounds >= 1"),
    (["--steps", "10", "--warmup", "10"], "0 <= --warmup < --steps"),
    (["--kinds", "timeline,plain"], "--kinds: expected plain then one or more of"),
    (["--kinds", "plain"], "--kinds: expected plain then one or more of"),
    (["--kinds", "plain,timeline,timeline"], "each once"),
    (["--kinds", "plain,bogus"], "got 'plain,bogus'"),
])
def test_bad_options_are_one_error(extra, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", *extra])
    assert message in capsys.readouterr().err
