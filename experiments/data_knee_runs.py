"""Fresh runs of one or more modes (the plain loader by default) on both sides of the knee,
interleaved, into one runs file.

Runs `caramel bench --data STORE --workers 2 --rounds 3 --data-epochs 3 --cache-share 1
--data-modes MODES` (`--data-modes`, default remote) at 100 Mbit/s (2 ms, batch 8, 4 ms compute:
the defaults) and at 200 Mbit/s (1 ms, batch 16, 8 ms compute), alternating, until `--runs` of
each are done or starting another would pass `--budget-s` (the longest run so far is the guess of
the next's); a run still going when the budget is spent is killed (its process group) and the
runs stop. Each run's record (caramel.data-bench/6 or later: every probe read kept) goes into a
`caramel.data-bench-runs/1` file with its command, UTC times and the host's load at both ends,
rewritten (temp file + rename) after every run that succeeds, so a kill loses at most the run
in progress; OUT is not touched until one has. Meant to run inside the bench lock; scored
afterwards by experiments.data_knee_spread (plain loader) or experiments.data_locality_breakdown
(locality).

Usage: python -m experiments.data_knee_runs STORE_DIR OUT.json [--runs N] [--budget-s S] [--data-modes M]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

if __package__ in (None, ""):  # run as a file: `caramel` is found from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caramel.data.store import Store  # noqa: E402
from caramel.errors import CaramelError  # noqa: E402

CONFIGS = {
    "f100": [],
    "f200": ["--batch-size", "16", "--compute", "8ms", "--store-rate", "200mbit", "--store-latency", "1ms"],
}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _utc() -> str:
    return datetime.now(timezone.utc).strftime("%H:%M:%S")


def _run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """`cmd` in a session of its own, killed with every process it started (the bench's ranks and
    loader workers) if it is still going after `timeout_s`: subprocess.TimeoutExpired."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


NOTES = {
    "remote": "fresh plain-loader runs at 100 and 200 Mbit/s, interleaved, one bench-lock call, "
              "not used to build the link queue's spread term (docs/data.md, \"The knee's queue\")",
    "locality": "fresh locality-mode runs at 100 and 200 Mbit/s, full cache, interleaved, one bench-lock call, "
                "not used to build anything (docs/data.md, \"The locality rows' error, term by term\")",
}


def note(modes: str) -> str:
    """The runs file's note for `--data-modes` `modes`, whatever their order ("a,b" as "b,a")."""
    key = ",".join(sorted(modes.split(",")))
    return NOTES.get(key, f"fresh runs of the modes {key} at 100 and 200 Mbit/s, interleaved")


def _write(out: str, runs: dict[str, dict], modes: str = "remote") -> None:
    """The runs file at `out`, replaced whole (a temp file renamed over it): never half written."""
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format": "caramel.data-bench-runs/1", "note": note(modes),
                   "runs": runs}, f, indent=1)
        f.write("\n")
    os.replace(tmp, out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", metavar="STORE_DIR")
    parser.add_argument("out", metavar="OUT.json")
    parser.add_argument("--runs", type=int, default=6, help="runs of each configuration (default 6)")
    parser.add_argument("--budget-s", type=float, default=510.0, help="wall seconds for all runs (default 510)")
    parser.add_argument("--data-modes", default="remote", help="the bench's --data-modes (default remote)")
    args = parser.parse_args(argv)
    if args.runs < 1 or not args.budget_s > 0:
        parser.error(f"--runs must be >= 1 and --budget-s > 0, got {args.runs}, {args.budget_s}")
    modes = args.data_modes.split(",")
    if not modes or not set(modes) <= {"remote", "cached", "locality"} or len(set(modes)) != len(modes):
        parser.error(f"--data-modes: distinct modes of remote, cached, locality, comma-separated; got {args.data_modes!r}")
    try:  # a wrong store would fail every bench inside the lock
        Store(args.store).index()
    except (OSError, CaramelError) as e:
        parser.error(f"STORE_DIR must be a data store (caramel data make): {e}")
    base = ["caramel", "bench", "--data", args.store, "--workers", "2", "--rounds", "3", "--data-epochs", "3",
            "--cache-share", "1", "--data-modes", args.data_modes]
    runs: dict[str, dict] = {}
    t0, longest_s = time.monotonic(), 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1, args.runs + 1):
            for name, extra in CONFIGS.items():
                if time.monotonic() - t0 + longest_s > args.budget_s:
                    print(f"budget: stopped before {name}-{k}", flush=True)
                    break
                path = os.path.join(tmp, f"{name}-{k}.json")
                cmd = base + extra + ["--json", path]
                start, load_start, t1 = _utc(), _load(), time.monotonic()
                try:
                    done = _run([sys.executable, "-m", "caramel.cli"] + cmd[1:],
                                max(args.budget_s - (time.monotonic() - t0), 1.0))
                except subprocess.TimeoutExpired:
                    print(f"budget: {name}-{k} killed at the budget", flush=True)
                    break
                last_s = time.monotonic() - t1
                longest_s = max(longest_s, last_s)
                print(f"{name}-{k}: exit {done.returncode} in {last_s:.1f} s, load {_load()}", flush=True)
                if done.returncode != 0:
                    print(done.stderr[-2000:], file=sys.stderr)
                    continue
                with open(path) as f:
                    record = json.load(f)
                runs[f"{name}-{k}"] = {"command": " ".join(cmd[:-2]), "start_utc": start, "end_utc": _utc(),
                                       "load_start": load_start, "load_end": _load(), "record": record}
                _write(args.out, runs, args.data_modes)
            else:
                continue
            break  # the budget is spent
    if not runs:
        print(f"no run succeeded: {args.out} not written", file=sys.stderr)
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
