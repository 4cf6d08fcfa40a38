"""Two rows of one `caramel bench` configuration against each other: the ratio of their median
steps (reference / candidate: above 1, the candidate is faster) with its 95% interval from
the rounds they were measured in side by side (`round_medians_s`, `caramel.stats.paired_rounds_interval`).

    python experiments/paired_rows.py docs/results/gossip-tracking-overlap.json \
        --pair gossip:algorithm=tracking,overlap_trackers=false=gossip:algorithm=tracking
"""
from __future__ import annotations

import argparse
import json

from caramel.bench.report import config_label, from_json
from caramel.stats import paired_rounds_interval


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("--pair", action="append", required=True, metavar="REFERENCE=CANDIDATE",
                    help="two strategy names of the same configuration, split at the last '=' that names a row")
    args = ap.parse_args()
    with open(args.bench_json) as f:
        records = from_json(json.load(f), args.bench_json).records
    names = {r.strategy for r in records}
    for pair in args.pair:
        splits = [(pair[:i], pair[i + 1:]) for i, ch in enumerate(pair) if ch == "="]
        match = [(a, b) for a, b in splits if a in names and b in names]
        if not match:
            raise SystemExit(f"--pair {pair!r}: expected REFERENCE=CANDIDATE, two of {sorted(names)}")
        ref_name, cand_name = match[0]
        for ref in (r for r in records if r.strategy == ref_name):
            cand = next((r for r in records if r.strategy == cand_name and config_label(r) == config_label(ref)), None)
            if cand is None:
                raise SystemExit(f"--pair {pair!r}: {args.bench_json} has no {cand_name!r} row for "
                                 f"{config_label(ref)} (it has one for {ref_name!r})")
            if not ref.step_time_median_s or not cand.step_time_median_s:
                raise SystemExit(f"--pair {pair!r}: {config_label(ref)} has no median step time for "
                                 f"{ref_name if not ref.step_time_median_s else cand_name!r} (a failed row?)")
            point = ref.step_time_median_s / cand.step_time_median_s
            ci = (paired_rounds_interval(ref.round_medians_s, cand.round_medians_s, point)
                  if ref.round_medians_s and cand.round_medians_s else None)
            ci_text = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "no rounds recorded"
            print(f"{config_label(ref)}: {cand_name} against {ref_name}: {1e3 * cand.step_time_median_s:.1f} ms "
                  f"against {1e3 * ref.step_time_median_s:.1f} ms, {point:.3f}x ({ci_text})")


if __name__ == "__main__":
    main()
