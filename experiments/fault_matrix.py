#!/usr/bin/env python
"""Run Caramel's fault matrix and write docs/reliability.md (and a JSON of the raw results).

    .venv/bin/python experiments/fault_matrix.py                    # everything (about 6 minutes on 2 cores)
    .venv/bin/python experiments/fault_matrix.py --only sigkill-worker plan-differs --no-write
    .venv/bin/python experiments/fault_matrix.py --quick            # skip the restart and emulated-cluster rows

Exit code 0 when every experiment behaved as promised, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caramel.errors import CaramelError  # noqa: E402
from experiments.faults.matrix import render_markdown, run_matrix  # noqa: E402
from experiments.faults.result import FAULTS, MatrixConfig  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--only", nargs="+", metavar="FAULT", help=f"run only these ({', '.join(FAULTS)})")
    p.add_argument("--quick", action="store_true", help="skip the slow experiments (torchrun restart, emulated cluster)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="CARAMEL_TIMEOUT_S for the jobs (seconds)")
    p.add_argument("--seed", type=int, default=0, help="chooses the steps at which faults land")
    p.add_argument("--out", default=str(ROOT / "docs" / "reliability.md"), help="Markdown file to write")
    p.add_argument("--json", metavar="OUT", help="also write the raw results as caramel.fault-matrix/1 JSON")
    p.add_argument("--no-write", action="store_true", help="print the table instead of writing --out")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfg = MatrixConfig(timeout_s=args.timeout_s, seed=args.seed, include_slow=not args.quick)
    command = "python experiments/fault_matrix.py" + (" --quick" if args.quick else "") + \
        (f" --seed {args.seed}" if args.seed else "") + (f" --timeout-s {args.timeout_s:g}" if args.timeout_s != 10.0 else "")

    def report(res, elapsed):
        print(f"{res.fault:28s} {'ok' if res.passed else 'NOT AS PROMISED':16s} ({elapsed:.0f} s) {res.message[:100]}",
              file=sys.stderr, flush=True)

    try:
        results = run_matrix(cfg, args.only, on_result=report)
    except CaramelError as e:
        print(f"fault_matrix: error: {e}", file=sys.stderr)
        return 2
    text = render_markdown(results, command, cfg)
    if args.no_write or args.only:
        print(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.json:
        from caramel.jsonio import write_json
        write_json(args.json, {"format": "caramel.fault-matrix/1", "results": [r.to_dict() for r in results]})
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
