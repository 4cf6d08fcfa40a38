"""Each step of an epoch: rank 0's step times within each epoch of the plain loader (remote mode).

The bench's records keep each epoch's mean step only; this runs `run_data_bench` for one round
of 3 epochs and keeps `ModeResult.epoch_step_s` (every step), to see where an epoch that starts
its loader empty pays its edge. `run` takes the measurement (through the bench wrapper, on the
runs' data set: caramel data make /tmp/dm/store --samples 512 --sample-bytes 16kb
--samples-per-shard 16); `pairs` reads its JSON and prints each epoch's pairs of steps (the two
workers of a rank deliver their batches in pairs): the first pair, the other pairs' mean, the
long and short steps' means, and the first pair's excess over the others.

Usage:
  python -m experiments.data_epoch_steps run f200|full OUT.json   # run alone on the host
  python -m experiments.data_epoch_steps pairs NAME=FILE.json...
docs/results/data-epoch-steps-{f200,full}.json were taken with `run` (its output then
/tmp/d32/steps-NAME.json) at 13:10 UTC on 2026-12-07.
"""
from __future__ import annotations

import sys

from caramel.errors import FormatError
from caramel.jsonio import format_tag, read_json, write_json

KIND = "data-epoch-steps"

CONFIGS = {  # the closed-loop runs' full-cache configurations, one round of 3 epochs
    "f200": dict(batch_size=16, compute_s=0.008, store_rate_bps=200e6, store_latency_s=0.001),
    "full": dict(batch_size=8, compute_s=0.004, store_rate_bps=100e6, store_latency_s=0.002),
}


def run(name: str, out_path: str, store: str = "/tmp/dm/store") -> dict:
    """One round of `name`'s configuration, remote mode only, keeping every step of rank 0."""
    import caramel.bench.data_report as dr
    from caramel.bench.data_bench import DataBenchConfig, run_data_bench

    kept: dict = {}
    summarize = dr.summarize

    def keeping(cfg, results, *args, **kwargs):  # the step times the record reduces to epoch means
        kept["steps"] = {m: r.epoch_step_s for m, r in results.items()}
        kept["cal"] = {m: r.calibrations for m, r in results.items()}
        return summarize(cfg, results, *args, **kwargs)

    dr.summarize = keeping
    try:
        cfg = DataBenchConfig(ranks=2, rounds=1, epochs=3, cache_share=1.0, modes=("remote",), **CONFIGS[name])
        report = run_data_bench(cfg, store)
    finally:
        dr.summarize = summarize
    row = report["rows"][0]
    out = dict(format=format_tag(KIND), name=name, step=row["step_s_steady"], pred=row["predicted_step_s"],
               steps=kept["steps"]["remote"], r=[c.get("request_s_under_load") for c in kept["cal"]["remote"]])
    write_json(out_path, out)
    return out


def pairs(name: str, record: dict) -> list[str]:
    """One line per epoch: its steps in pairs, the first pair's excess over the others' mean."""
    lines = []
    for i, steps in enumerate(record["steps"]):
        s = [x * 1e3 for x in steps]
        if len(s) < 4:
            raise SystemExit(f"data_epoch_steps: {name} epoch {i + 1} has {len(s)} steps; the pairs need 4 or "
                             f"more (the first pair and at least one other)")
        others = [s[j] + s[j + 1] for j in range(2, len(s) - 1, 2)]
        other_s = sum(others) / len(others)
        long_s, short_s = s[2::2], s[3::2]
        excess = s[0] + s[1] - other_s
        label = f"{name} epoch {i + 1}{' (first, cold)' if i == 0 else ''}"
        lines.append(f"{label}: steps {len(s)}, first pair {s[0] + s[1]:.1f} ms (first step {s[0]:.1f}), "
                     f"other pairs mean {other_s:.1f} ms, long/short steps mean "
                     f"{sum(long_s) / len(long_s):.1f}/{sum(short_s) / len(short_s):.1f}, "
                     f"epoch-start excess {excess:.1f} ms = {excess / len(s):.2f} ms/step")
    return lines


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"] and len(argv) == 3 and argv[1] in CONFIGS:
        out = run(argv[1], argv[2])
        print(argv[1], "step", out["step"], "pred", out["pred"])
        return 0
    if argv[:1] == ["pairs"] and len(argv) > 1 and all("=" in a for a in argv[1:]):
        for arg in argv[1:]:
            name, path = arg.split("=", 1)
            try:
                record = read_json(path, KIND)
            except FormatError as e:
                print(f"data_epoch_steps: {e}", file=sys.stderr)
                return 2
            print("\n".join(pairs(name, record)))
        return 0
    print(__doc__.split("Usage:")[1].split("docs/")[0].rstrip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
