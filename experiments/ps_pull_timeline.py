"""Where a ps step's pull time goes: every pull and push of every rank on one clock.

Runs as `examples/ps_servers.py` does (under `caramel cluster run`), with the engine's
transfers timed from the outside: each rank records when its sender hands a pull to the
backend and when that send completes, when each received pull bucket lands (a thread polls
the backend's works every 0.5 ms), when each push is handed over, when each update's pulls are
issued (`last_issue_t`) and each forward's waits. All ranks share the host's monotonic
clock, so one rank's sends and another's landings line up. Each rank writes
`DIR/rank{r}.json`; `--analyse DIR` prints, per steady step of rank 0, the pull makespan
as TicTac measures it, the remote servers' issue lag and the pulls' achieved rate against
the profile's `pull_comm_s`.

When a push lands is not measured: a gloo point-to-point work reports `is_completed()`
False until someone calls `wait()`, so polling sees a push end only when the engine's
`_apply` waits on it. Push events carry their hand-off `t` only (timelines recorded
before this carry a `t_done` that is that wait's return, not the landing; it is ignored).
A broadcast work completes on its own, so the pull times are what the wire did.

    caramel cluster run --workers 2 --bandwidth 300mbit -- python experiments/ps_pull_timeline.py --out DIR
    python experiments/ps_pull_timeline.py --analyse DIR

A diagnostic: the polling thread costs CPU, so its step times are not a benchmark, and it
lowers the forward's measured waits (so raises E) at an unchanged makespan
(`experiments/ps_e_measures.py`; `--poll-ms 0` runs without it).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

import caramel
from caramel.models import get_model
from caramel.strategies.ps import engine as ps_engine
from caramel.strategies.ps import pulls as ps_pulls
from caramel.strategies.ps import sender as ps_sender


class Recorder:
    """Events on this rank's clock; a thread notes when polled works complete."""

    def __init__(self, poll_s: float = 0.0005) -> None:
        self.events: list[dict] = []
        self.watch: list[tuple[dict, object]] = []
        self.lock = threading.Lock()
        self.stop = False
        self.poll_s = poll_s
        if poll_s > 0:  # 0: no thread, so no landing times (a control for what the polling costs)
            threading.Thread(target=self._poll, daemon=True).start()

    def note(self, **kw) -> dict:
        kw.setdefault("t", time.perf_counter())
        with self.lock:
            self.events.append(kw)
        return kw

    def track(self, ev: dict, work: object) -> None:
        with self.lock:
            self.watch.append((ev, work))

    def _poll(self) -> None:
        while not self.stop:
            with self.lock:
                live = list(self.watch)
            done = []
            for ev, w in live:
                try:
                    ok = w.is_completed()
                except Exception:
                    ok = True
                if ok:
                    ev["t_done"] = time.perf_counter()
                    done.append(ev)
            if done:
                with self.lock:
                    self.watch = [(e, w) for e, w in self.watch if "t_done" not in e]
            time.sleep(self.poll_s)


def instrument(rec: Recorder) -> None:
    eng = ps_engine.PsEngine

    # `_issue` exists only in 16506fc (the caller hands an idle sender's first pull over; measured
    # and reverted, docs/ps.md "Where E is lost"): kept so that tree's timelines can be recorded
    # again. Elsewhere the thread issues in `_send` and the hand-off is `_send`'s start.
    orig_issue = getattr(ps_sender.SerialSender, "_issue", None)

    def timed_issue(self, item):  # the hand-off: by the sender thread, or by `submit` when idle
        item.t_handoff = time.perf_counter()
        return orig_issue(self, item)
    if orig_issue is not None:
        ps_sender.SerialSender._issue = timed_issue

    orig_send = ps_sender.SerialSender._send

    def timed_send(self, item) -> None:  # the hand-off and the broadcast's return noted
        t0 = time.perf_counter()
        orig_send(self, item)
        rec.note(kind="send", bucket=item.tag, what=item.what, t=getattr(item, "t_handoff", t0),
                 t_done=time.perf_counter(), bytes=item.buf.numel() * item.buf.element_size())
    ps_sender.SerialSender._send = timed_send

    orig_expect = ps_pulls.PsPulls._expect

    def expect(self, members, version, work, buf):
        b = next((k for k, m in enumerate(self.plan.pull_buckets) if m == list(members)), -1)
        ev = rec.note(kind="recv", bucket=b, version=version, bytes=buf.numel() * buf.element_size())
        rec.track(ev, work)
        return orig_expect(self, members, version, work, buf)
    ps_pulls.PsPulls._expect = expect

    orig_push = eng._push

    def push(self, b):
        n = len(self.current.works) if self.current is not None else 0
        orig_push(self, b)
        u = self.current
        for _ in u.works[n:]:  # not tracked: a gloo point-to-point work completes only at wait()
            rec.note(kind="push", bucket=b, step=u.step)
    eng._push = push

    orig_apply = eng._apply

    def apply(self, u):
        t0 = time.perf_counter()
        orig_apply(self, u)
        rec.note(kind="apply", step=u.step, t=t0, t_issue=self.last_issue_t, t_done=time.perf_counter())
    eng._apply = apply

    orig_step_shard = eng._step_shard

    def step_shard(self, idx, u):  # its start: every push of the update is in (the works waited)
        t0 = time.perf_counter()
        orig_step_shard(self, idx, u)
        rec.note(kind="optimizer", step=u.step, t=t0, t_done=time.perf_counter(), params=len(idx))
    eng._step_shard = step_shard

    orig_catch = ps_pulls.PsPulls.catch_up

    def catch_up(self, idx, required=None, forward=False):
        t0 = time.perf_counter()
        w = orig_catch(self, idx, required, forward)
        if w > 0:
            rec.note(kind="wait", t=t0, t_done=time.perf_counter(), waited=w, forward=forward, step=self.steps)
        return w
    ps_pulls.PsPulls.catch_up = catch_up


def run(args: argparse.Namespace) -> None:
    rec = Recorder(args.poll_ms / 1e3)
    instrument(rec)
    caramel.init_distributed()
    w = get_model("resnet18")(batch_size=args.batch_size, seed=0, width=16)
    optimizer = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = caramel.parallelize(w.model, optimizer, args.strategy)
    workers = optimizer.ps.engine.workers
    rank = dist.get_rank()
    for step in range(args.steps):
        batch = get_model("resnet18")(batch_size=args.batch_size, seed=1 + step * workers + rank, width=16)
        t0 = time.perf_counter()
        out = model(batch.inputs)
        t1 = time.perf_counter()
        w.loss_fn(out, batch.targets).backward()
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        rec.note(kind="step", step=step, t=t0, t_fwd_end=t1, t_bwd_end=t2, t_done=time.perf_counter())
    optimizer.synchronize()
    stats = optimizer.ps.stats_dict()
    rec.stop = True
    plan = optimizer.ps.engine.plan
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with rec.lock:
        events = list(rec.events)
    (out_dir / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "strategy": args.strategy, "events": events, "log": optimizer.ps.log,
        "pull_comm_s": stats["pull_comm_s"], "E_median": stats["E_median"], "predicted": stats["predicted"],
        "pull_buckets": plan.pull_buckets, "bucket_pull": plan.bucket_pull, "owner": {str(k): v for k, v in plan.owner.items()},
    }))
    caramel.shutdown()


def analyse(d: Path, warmup: int) -> None:
    ranks = {}
    for p in sorted(d.glob("rank*.json*")):
        x = json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_text())
        ranks[x["rank"]] = x
    if 0 not in ranks:
        raise SystemExit(f"ps_pull_timeline: {d} holds no rank0.json (found ranks {sorted(ranks)}); give the DIR "
                         f"that --out recorded")
    r0 = ranks[0]
    print(f"{d}: {r0['strategy']}, ranks {sorted(ranks)}, pull_comm_s {r0['pull_comm_s'] * 1e3:.1f} ms, "
          f"E_median {r0['E_median']}, planned bucket order {r0['bucket_pull']}")
    # the server of each pull bucket: the rank whose sender sent it as a pull (not a relay)
    servers = {e["bucket"]: r for r, x in ranks.items() for e in x["events"]
               if e["kind"] == "send" and e["what"].startswith("pull")}
    applies = {r: {e["step"]: e for e in x["events"] if e["kind"] == "apply"} for r, x in ranks.items()}
    sends = {r: [e for e in x["events"] if e["kind"] == "send"] for r, x in ranks.items()}
    recvs = [e for e in r0["events"] if e["kind"] == "recv"]
    steps = {e["step"]: e for e in r0["events"] if e["kind"] == "step"}
    log = {x["step"]: x for x in r0["log"]}
    rows = []
    for u in sorted(applies[0]):
        if u < warmup or u + 1 not in steps:
            continue
        t_issue = applies[0][u]["t_issue"]
        mine = [e for e in recvs if e.get("version") == u + 1 and "t_done" in e]
        if not mine:
            continue
        lag = {r: applies[r][u]["t_issue"] - t_issue for r in sorted(set(servers.values())) if u in applies[r]}
        land = sorted(mine, key=lambda e: e["t_done"])
        nbytes = sum(e["bytes"] for e in mine)
        first_remote_issue = min(applies[servers[e["bucket"]]][u]["t_issue"] for e in mine)
        span = land[-1]["t_done"] - first_remote_issue
        # each bucket's rate from when the wire could take it (its server's issue, or the
        # landing of the bucket before it): below the link's, something shared the link
        rates, prev = [], first_remote_issue
        for x in land:
            start = max(prev, applies[servers[x["bucket"]]][u]["t_issue"])
            rates.append(round(x["bytes"] * 8 / max(x["t_done"] - start, 1e-9) / 1e6))
            prev = x["t_done"]
        st = steps[u + 1]
        e = log.get(u + 1, {})
        rows.append({"u": u, "lag_ms": {r: round(v * 1e3, 1) for r, v in lag.items()},
                     "land_order": [x["bucket"] for x in land], "Mbit_s": rates,
                     "recv_span_ms": span * 1e3, "recv_MB": nbytes / 1e6,
                     "fwd_ms": (st["t_fwd_end"] - st["t"]) * 1e3, "wait_ms": e.get("wait_s", 0) * 1e3,
                     "issue_to_fwd_start_ms": (st["t"] - t_issue) * 1e3,
                     "makespan_ms": (st["t_fwd_end"] - t_issue) * 1e3,
                     "after_last_landing_ms": (st["t_fwd_end"] - land[-1]["t_done"]) * 1e3, "E": e.get("E")})
    if not rows:
        raise SystemExit(f"ps_pull_timeline: {d}: no update to analyse: --warmup {warmup} leaves none of rank 0's "
                         f"{len(applies[0])} recorded updates with a pull received; give a smaller --warmup")
    for x in rows:
        print(json.dumps(x))
    med = lambda k: statistics.median(x[k] for x in rows)
    print(f"medians: recv span {med('recv_span_ms'):.1f} ms for {med('recv_MB'):.2f} MB "
          f"(profile pull_comm_s {r0['pull_comm_s'] * 1e3:.1f} ms); wait {med('wait_ms'):.1f}; fwd {med('fwd_ms'):.1f}; "
          f"issue->fwd start {med('issue_to_fwd_start_ms'):.1f}; makespan {med('makespan_ms'):.1f}; E {med('E'):.2f}")
    # an update's lag: the latest other server's issue after rank 0's (rank 0's own is 0)
    lag = lambda x: max((v for r, v in x["lag_ms"].items() if r != 0), default=0.0)
    early = [x for x in rows if lag(x) <= 0]
    late = [x for x in rows if lag(x) > 0]
    for name, part in (("every other server issued at or before rank 0", early),
                       ("some server issued after rank 0", late)):
        if part:
            first = sorted(x["Mbit_s"][0] for x in part)
            lags = sorted(lag(x) for x in part)
            print(f"{name}: {len(part)} updates, median E {statistics.median(x['E'] for x in part):.2f}, "
                  f"first bucket {statistics.median(first)} Mbit/s ({first[0]}-{first[-1]}), "
                  f"lag {lags[0]:.1f} to {lags[-1]:.1f} ms, wait {statistics.median(x['wait_ms'] for x in part):.1f} ms")
    print(f"forward end after the last pull landed: median {med('after_last_landing_ms'):.1f} ms")
    for r, ss in sends.items():
        if ss:
            durs = [(s["t_done"] - s["t"]) * 1e3 for s in ss[-20:]]
            print(f"rank {r} sender: last sends' hand-off->complete ms {[round(v, 1) for v in durs]}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", default="ps")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", help="DIR for the per-rank timelines")
    ap.add_argument("--analyse", metavar="DIR", help="print the analysis of a recorded DIR")
    ap.add_argument("--warmup", type=int, default=8, help="updates left out of the analysis")
    ap.add_argument("--poll-ms", type=float, default=0.5, help="how often the thread polls pending pulls "
                    "(0: no thread; landings are then not recorded and --analyse has nothing to read)")
    args = ap.parse_args(argv)
    # nan would pass a `< 0` check and silently run the no-thread control; inf would stop the
    # polling after its first pass and leave an incomplete timeline
    if not math.isfinite(args.poll_ms) or args.poll_ms < 0:
        ap.error(f"--poll-ms: expected finite milliseconds >= 0, got {args.poll_ms}")
    return args


def main() -> None:
    args = parse_args()
    if args.analyse:
        analyse(Path(args.analyse), args.warmup)
    elif args.out:
        run(args)
    else:
        raise SystemExit("ps_pull_timeline: give --out DIR (record) or --analyse DIR")


if __name__ == "__main__":
    main()
