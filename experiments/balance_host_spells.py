"""The host's slow spells and the trial's extra passes, read from stored `balance="batch"` runs.

`balance="batch"` decides from each rank's compute (the step's period less its waits), a
median over a 10-step window. On the virtual clock (`tests/strategies/adapt/balance_clock.py`)
that compute was a cost line with independent step noise; on the shared host the controller
settled later (run 9, docs/results/adapt-history.md). This reads a `balance_seed_steps analyze`
file's per-step records (every balanced run, both ranks) and measures what the clock lacked:

- each rank's residual: its compute over its own cost line (fixed + per_sample * n, least
  squares over the run's per-size medians from step 5, each size weighted by its steps);
- step noise: the residual's robust spread (MAD -> SD) outside spells and spikes;
- spells: 5 or more consecutive steps whose rolling median (5 steps) is 10% or more off the
  line, the same side: length in steps, size (the median residual in it), which rank;
- spikes: single steps 30% or more over the line outside spells (a log line, a block's end);
- the trial's passes: how many times the overlap trial's blocks ran (`trial_end_step`).

Its `model` is the seeded noise model `tests/strategies/adapt/balance_host_noise.py` draws from:

    python -m experiments.balance_host_spells docs/results/adapt-train-balance-ab.json \
        --json docs/results/adapt-balance-host-spells.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file too: `experiments.` imports

from caramel.jsonio import format_tag, read_json, write_json  # noqa: E402

KIND = "balance-host-spells"
SOURCE_KIND = "balance-seed-steps-ab"
FIRST_STEP = 5  # profiling steps before: every rank at equal shares, the trial not begun
SPELL_MIN_STEPS = 5
SPELL_OFF = 0.10  # a spell's rolling median is this far off the line ...
ROLL_STEPS = 5  # ... over this many steps
SPIKE_OVER = 0.30
MAD_TO_SD = 1.4826
TRIAL_FIRST_STEP = 5  # the trial's first block starts here; each pass is 30 steps
TRIAL_PASS_STEPS = 30


def rank_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per_sample) through the per-size medians, each size weighted by its step count;
    one size, or a fit that is not physical: all per sample through the origin."""
    by: dict[int, list[float]] = {}
    for n, t in points:
        by.setdefault(n, []).append(t)
    sizes = [(n, statistics.median(ts), len(ts)) for n, ts in by.items() if len(ts) >= 3]
    if not sizes:
        raise ValueError("no local batch size has 3 timed steps")
    total = sum(c for _, _, c in sizes)
    mean_n = sum(n * c for n, _, c in sizes) / total
    mean_t = sum(t * c for _, t, c in sizes) / total
    var = sum(c * (n - mean_n) ** 2 for n, _, c in sizes)
    if var > 0:
        slope = sum(c * (n - mean_n) * (t - mean_t) for n, t, c in sizes) / var
        fixed = mean_t - slope * mean_n
        if slope > 0 and fixed >= 0:
            return fixed, slope
    return 0.0, mean_t / mean_n


def spells_of(residuals: list[float]) -> list[tuple[int, int, float]]:
    """(first index, length, size) of each run of >= SPELL_MIN_STEPS steps whose rolling median
    is SPELL_OFF or more off the line on one side; size is the median residual over the run."""
    half = ROLL_STEPS // 2
    rolled = [statistics.median(residuals[max(0, i - half):i + half + 1]) for i in range(len(residuals))]
    out, i = [], 0
    while i < len(rolled):
        side = (rolled[i] >= SPELL_OFF) - (rolled[i] <= -SPELL_OFF)
        j = i
        while side and j < len(rolled) and side * rolled[j] >= SPELL_OFF:
            j += 1
        if side and j - i >= SPELL_MIN_STEPS:
            out.append((i, j - i, statistics.median(residuals[i:j])))
            i = j
        else:
            i += 1
    return out


def characterize(data: dict[str, Any]) -> dict[str, Any]:
    runs, spells, spikes, sds, passes = [], [], [], [], []
    for run in data["runs"]:
        if run.get("strategy") != "balanced":
            continue
        passes.append(max(1, round((run["trial_end_step"] - TRIAL_FIRST_STEP + 1) / TRIAL_PASS_STEPS)))
        for rank, rows in sorted(run["steps"].items()):
            rows = [r for r in rows if r[0] >= FIRST_STEP and r[6] is not None and r[4] is not None]
            points = [(int(r[1]), r[6] - r[4]) for r in rows]
            fixed, per_sample = rank_line(points)
            residuals = [t / (fixed + per_sample * n) - 1.0 for n, t in points]
            found = spells_of(residuals)
            inside = {k for i, length, _ in found for k in range(i, i + length)}
            for i, length, size in found:
                spells.append({"run": run["run"], "rank": int(rank), "first_step": rows[i][0],
                               "steps": length, "size": round(size, 4)})
            rest = [x for k, x in enumerate(residuals) if k not in inside]
            spiky = [x for x in rest if x >= SPIKE_OVER]
            spikes.extend(round(x, 4) for x in spiky)
            calm = [x for x in rest if x < SPIKE_OVER]
            mid = statistics.median(calm)
            sds.append(MAD_TO_SD * statistics.median(abs(x - mid) for x in calm))
            runs.append({"run": run["run"], "rank": int(rank), "fixed_ms": round(fixed, 2),
                         "per_sample_ms": round(per_sample, 4), "steps": len(points),
                         "spells": len(found), "spikes": len(spiky)})
    rank_steps = sum(r["steps"] for r in runs)
    outside = rank_steps - sum(s["steps"] for s in spells)
    model = {
        "step_noise_sd": round(statistics.median(sds), 4),
        "spell_start_per_rank_step": round(len(spells) / rank_steps, 5),
        "spell_steps": sorted(s["steps"] for s in spells),
        "spell_sizes": sorted(s["size"] for s in spells),
        "spike_per_rank_step": round(len(spikes) / max(outside, 1), 5),
        "spike_sizes": sorted(spikes),
        "trial_passes": sorted(passes),
    }
    slow = [s for s in spells if s["size"] > 0]
    summary = {
        "balanced_runs": len(passes), "rank_series": len(runs), "rank_steps": rank_steps,
        "spells": len(spells), "slow_spells": len(slow), "fast_spells": len(spells) - len(slow),
        "spell_steps_median": statistics.median(model["spell_steps"]) if spells else None,
        "spell_size_median_abs": statistics.median(abs(s["size"]) for s in spells) if spells else None,
        "spells_by_rank": {r: sum(s["rank"] == r for s in spells) for r in (0, 1)},
        "spikes": len(spikes),
        "step_noise_sd_range": [round(min(sds), 4), round(max(sds), 4)],
        "trial_passes_count": {p: passes.count(p) for p in sorted(set(passes))},
    }
    return {"model": model, "summary": summary, "spells": spells, "series": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", help="a `balance_seed_steps analyze` JSON (per-step records of balanced runs)")
    ap.add_argument("--json", help="write the characterization here")
    args = ap.parse_args()
    data = read_json(args.source, SOURCE_KIND)
    out = characterize(data)
    out = {"format": format_tag(KIND), "source": Path(args.source).name, "what": __doc__.split("\n")[0],
           "rules": {"first_step": FIRST_STEP, "spell_min_steps": SPELL_MIN_STEPS, "spell_off": SPELL_OFF,
                     "roll_steps": ROLL_STEPS, "spike_over": SPIKE_OVER}, **out}
    for k, v in out["summary"].items():
        print(f"{k}: {v}")
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
