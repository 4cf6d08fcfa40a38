"""Network faults: a link slows to a tenth of its rate mid-run on the emulated cluster, then recovers.

The fault worker runs as a 2-host torchrun job on `caramel.cluster.EmulatedCluster` (network
namespaces, tbf-shaped veths). After `cut_at` steps worker 1's link is set to a tenth of its
rate with `set_bandwidth`, after `restore_at` steps it is set back. The promise: training goes on
through both changes and ends with every rank holding the same parameters; with
`replan="auto"` the engine notices the slower link from its own timings and re-plans, on every
rank at the same step with the same plan. Step times per phase come from the workers' progress
files, so the slowdown itself is measured, not assumed.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from experiments.faults.result import FaultResult, MatrixConfig, fault, shorten
from experiments.faults.worker import DONE_SUFFIX, PROGRESS_SUFFIX

RATE_BPS = 100e6
STEPS, CUT_AT, RESTORE_AT = 150, 40, 90
WIDTH = 128  # about 80 kB of gradients per step: ~13 ms per all-reduce at 100 Mbit/s, ~130 ms at 10


def _progress_times(path: Path) -> dict[int, float]:
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[int(parts[0])] = float(parts[2])
    return out


def _median_step_s(times: dict[int, float], lo: int, hi: int) -> float | None:
    """Median step time over steps (lo, hi], skipping the two steps around each boundary."""
    d = [times[s] - times[s - 1] for s in range(lo + 3, hi + 1) if s in times and s - 1 in times]
    return statistics.median(d) if d else None


def bandwidth_experiment(replan: str = "auto", timeout_s: float = 60.0) -> dict:
    """Run the job, cut and restore worker 1's link; the raw measurements (see module docstring)."""
    from caramel.cluster.config import ClusterConfig, auto_mtu
    from caramel.cluster.emulated import EmulatedCluster
    with tempfile.TemporaryDirectory(prefix="caramel-net-fault-") as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "experiments.faults.worker", "--out", str(out), "--steps", str(STEPS),
               "--step-sleep-s", "0.01", "--width", str(WIDTH), "--replan", replan, "--planner", "caramel",
               "--check-every", "10"]
        events: list[tuple[str, int, float]] = []
        # the MTU of the cut rate, which the link is slowed to mid-run
        config = ClusterConfig(workers=2, bandwidth_bps=RATE_BPS, fallback="error", quiet=True, mtu=auto_mtu(RATE_BPS / 10))
        with EmulatedCluster(config) as cluster:
            result: dict = {}
            log = open(out / "job.log", "w")
            runner = threading.Thread(target=lambda: result.update(rc=cluster.run(
                cmd, env={"CARAMEL_TIMEOUT_S": f"{timeout_s:g}"}, timeout_s=600, out=log)))
            runner.start()
            progress = out / f"rank1{PROGRESS_SUFFIX}"
            for label, step, rate in (("cut", CUT_AT, RATE_BPS / 10), ("restore", RESTORE_AT, RATE_BPS)):
                while runner.is_alive() and (not progress.exists() or _last_step(progress) < step):
                    time.sleep(0.05)
                if not runner.is_alive():
                    break
                cluster.set_bandwidth(1, rate)
                events.append((label, _last_step(progress), time.time()))
            runner.join()
            log.close()
        done = {}
        for r in range(2):
            p = out / f"rank{r}{DONE_SUFFIX}"
            if p.exists():
                done[r] = json.loads(p.read_text())
        times = _progress_times(progress) if progress.exists() else {}
        cut = next((s for label, s, _ in events if label == "cut"), CUT_AT)
        restore = next((s for label, s, _ in events if label == "restore"), RESTORE_AT)
        phases = {"before_s": _median_step_s(times, 0, cut), "cut_s": _median_step_s(times, cut, restore),
                  "after_s": _median_step_s(times, restore, STEPS)}
        log_tail = (out / "job.log").read_text()[-3000:]
    return {"rc": result.get("rc"), "events": events, "phases": phases, "done": done, "log_tail": log_tail}


def _last_step(path: Path) -> int:
    times = _progress_times(path)
    return max(times) if times else 0


@fault("link-cut-to-tenth", "network", slow=True)
def link_cut(cfg: MatrixConfig) -> FaultResult:
    from caramel.cluster.netns import support
    sup = support()
    if not sup.ok:
        return FaultResult("link-cut-to-tenth", "network", "not run", "", None, None, [], "", "n/a", "n/a", False,
                           notes=f"needs the emulated cluster (root, iproute2): {sup.reason}")
    raw = bandwidth_experiment(timeout_s=max(cfg.timeout_s, 60.0))
    done = raw["done"]
    same = len(done) == 2 and len({d["checksum"] for d in done.values()}) == 1
    replans = [d.get("extra", {}).get("bandwidth_replans", []) for d in done.values()]
    agree = len(replans) == 2 and [(x["step"], x["plan"]) for x in replans[0]] == [(x["step"], x["plan"]) for x in replans[1]]
    slow_steps = [x["step"] for x in replans[0]] if replans else []
    reacted = any(CUT_AT <= s <= RESTORE_AT + 5 for s in slow_steps)
    ph = raw["phases"]
    fmt = lambda v: f"{v * 1e3:.0f} ms" if v else "?"  # noqa: E731
    return FaultResult(
        fault="link-cut-to-tenth", category="network",
        injected=f"2 hosts at {RATE_BPS / 1e6:g} Mbit/s; worker 1's link set to {RATE_BPS / 1e7:g} Mbit/s after step "
                 f"{CUT_AT}, restored after step {RESTORE_AT} (of {STEPS}); replan='auto'",
        expected="training continues, ranks end identical; the engine re-plans from its own timings, same step and plan on every rank",
        detected=reacted, detect_s=None, exit_codes=[raw["rc"]],
        message=shorten("; ".join(f"step {x['step']}: measured {x['measured_bps'] / 1e6:.1f} Mbit/s (plan assumed "
                                  f"{x['assumed_bps'] / 1e6:.1f}) -> plan {x['plan']}" for x in (replans[0] if replans else []))
                        or "no re-plan", 400),
        recovered="yes, training continued" if raw["rc"] == 0 and same else "no",
        data_lost="none" if same else "ranks differ or did not finish",
        passed=raw["rc"] == 0 and same and agree and reacted,
        notes=f"median step: {fmt(ph['before_s'])} before, {fmt(ph['cut_s'])} while cut, {fmt(ph['after_s'])} after"
              + ("" if agree else "; ranks disagree on re-plans"),
        details={k: v for k, v in raw.items() if k != "done"} | {"replans": replans})
