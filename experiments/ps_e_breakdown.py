"""Where TicTac's E is lost in a colocated ps step: rank 0's pull makespan against E's bound.

Reads timelines recorded by `experiments/ps_pull_timeline.py` (every rank's transfers on the
host's one clock) and, per steady update u of rank 0, splits the gap between the measured
makespan m (rank 0's first pull handed over, T0, to the end of forward u + 1: the engine's own
`makespan_s`, the one its E is computed from) and the profile's pull time alone
(`pull_comm_s`, E's comm term) into parts that add up to it:

- `remote_late`: the remote server entered `step()` (its `_apply`) after T0: its backward ran on;
- `push_wait`: it was in `_apply` after T0 waiting for the last pushes (the reductions' waits);
- `apply`: its optimizer ran after T0;
- `handoff`: from its optimizer's end (or T0) to its sender handing the first pull over
  (bsp's buffer send, the sender thread's wake-up);
- `wire_gaps`: the wire idle between two remote pull buckets (a bucket handed over after the
  one before it landed);
- `wire_excess`: the remote pulls' time on the wire beyond `pull_comm_s` less the gaps
  (negative where a remote server's head start beat the profile). It is what is left once the
  others are taken, so whatever the others miss lands here;
- `tail`: the forward after the last pull landed (the modules that use it and those after),
  up to the forward's end as the engine read it (T0 + m; the timeline's own forward end comes
  after the module's post-forward hooks, `fwd_end_gap_ms`, outside m).

The first four add up to the remote server's issue lag (0 when it handed over first);
lag + wire + tail = m, so the parts add up to m - comm. Where the step is link-bound (comm
>= m - wait, TicTac's L = comm) E = 1 - (m - comm) / (U - L), and each part's share of E is
part / (U - L): the shares add up to 1 - E of the engine's log. Steps whose compute exceeds
comm are counted and left out of the shares (there m - L is the forward's wait, not this sum).
One remote server only (two colocated ranks): with more, the other servers' wire gaps would
land in `wire_excess`, so such timelines are refused. The plan's own makespan, tail and E
for the run's order (rank 0's `predicted`) are reported beside the measured ones. Which pulls landed out of planned order
is counted too, and the forward's waits are put on the pull that landed as each ended
(`wait_by_bucket_ms`). The timeline's polling thread slows the forward (docs/ps.md, "E in the
timeline against the A/B runs"): these are untimed diagnostic runs, not E's A/B numbers.

    python experiments/ps_e_breakdown.py DIR [DIR ...] --warmup 10 --json docs/results/NAME.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

from caramel.jsonio import format_tag, write_json

WAIT_MATCH_S = 0.002  # a forward wait ending this close to a pull's landing was a wait for that pull
PARTS = ("remote_late", "push_wait", "apply", "handoff", "wire_gaps", "wire_excess", "tail")


def load(d: Path) -> dict[int, dict]:
    ranks = {}
    for p in sorted(d.glob("rank*.json*")):
        x = json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_text())
        ranks[x["rank"]] = x
    if 0 not in ranks:
        raise SystemExit(f"ps_e_breakdown: {d} holds no rank0.json (found ranks {sorted(ranks)})")
    if not any(e["kind"] == "optimizer" for e in ranks[0]["events"]):
        raise SystemExit(f"ps_e_breakdown: {d} has no optimizer events: record it with this tree's "
                         f"experiments/ps_pull_timeline.py")
    remote = sorted(r for r, x in ranks.items() if r != 0 and any(
        e["kind"] == "send" and e["what"].startswith("pull") for e in x["events"]))
    if len(remote) > 1:
        raise SystemExit(f"ps_e_breakdown: {d} has pulls from servers {remote}: expected one remote server "
                         f"(two colocated ranks); the others' wire gaps would be counted as wire excess")
    return ranks


def plan_of(r0: dict, order: str) -> dict:
    """The plan's prediction for `order` on rank 0's profile: makespan, tail (makespan beyond
    the pulls alone, `comm_s`) and E, in the units of the rows."""
    predicted = r0.get("predicted", {})
    if not isinstance(predicted.get(order), dict):
        known = sorted(k for k, v in predicted.items() if isinstance(v, dict) and "makespan_s" in v)
        raise SystemExit(f"ps_e_breakdown: --order {order!r}: expected one of the plan's orders {known}")
    p = predicted[order]
    return {"order": order, "makespan_ms": p["makespan_s"] * 1e3, "comm_ms": predicted["comm_s"] * 1e3,
            "tail_ms": (p["makespan_s"] - predicted["comm_s"]) * 1e3, "E": p["E"]}


def by_update(events: list[dict], kind: str) -> dict[int, dict]:
    return {e["step"]: e for e in events if e["kind"] == kind}


def first_sends(x: dict) -> dict[int, list[dict]]:
    """A server's pull sends per update: those handed over after that update's issue and
    before the next one's."""
    applies = sorted((e for e in x["events"] if e["kind"] == "apply"), key=lambda e: e["t_issue"])
    sends = sorted((e for e in x["events"] if e["kind"] == "send" and e["what"].startswith("pull")),
                   key=lambda e: e["t"])
    out: dict[int, list[dict]] = {}
    for k, a in enumerate(applies):
        end = applies[k + 1]["t_issue"] if k + 1 < len(applies) else float("inf")
        out[a["step"]] = [s for s in sends if a["t_issue"] <= s["t"] < end]
    return out


def clip(a: float, b: float) -> float:
    return max(0.0, b - a)


def breakdown(ranks: dict[int, dict], warmup: int) -> list[dict]:
    r0 = ranks[0]
    comm = r0["pull_comm_s"]
    planned = r0["bucket_pull"]
    server_of = {b: r for r, x in ranks.items() for e in x["events"]
                 if e["kind"] == "send" and e["what"].startswith("pull") for b in [e["bucket"]]}
    apply_ev = {r: by_update(x["events"], "apply") for r, x in ranks.items()}
    opt_ev = {r: by_update(x["events"], "optimizer") for r, x in ranks.items()}
    sends = {r: first_sends(x) for r, x in ranks.items()}
    steps = by_update(r0["events"], "step")
    log = {e["step"]: e for e in r0["log"]}
    recvs = [e for e in r0["events"] if e["kind"] == "recv" and "t_done" in e]
    rows = []
    for u in sorted(apply_ev[0]):
        if u < warmup or u + 1 not in steps or u + 1 not in log or "makespan_s" not in log[u + 1]:
            continue
        t0 = apply_ev[0][u]["t_issue"]
        mine = sorted((e for e in recvs if e.get("version") == u + 1), key=lambda e: e["t_done"])
        remote = sorted({server_of[e["bucket"]] for e in mine})
        if not mine or any(u not in apply_ev[r] or u not in opt_ev[r] or not sends[r].get(u) for r in remote):
            continue
        # the remote server whose first hand-off came last decides the lag
        r = max(remote, key=lambda s: sends[s][u][0]["t"])
        a, o, h = apply_ev[r][u], opt_ev[r][u], sends[r][u][0]["t"]
        parts = {"remote_late": clip(t0, min(a["t"], h)),
                 "push_wait": clip(max(a["t"], t0), min(o["t"], h)),
                 "apply": clip(max(o["t"], t0), min(o["t_done"], h)),
                 "handoff": clip(max(o["t_done"], t0), h)}
        # the wire: from when the first remote bucket could move to the last landing
        hand = {s["bucket"]: s["t"] for s in sends[r][u]}
        start = max(t0, h)
        gaps, prev = 0.0, None
        for e in mine:
            if prev is not None and e["bucket"] in hand:
                gaps += clip(max(prev, t0), hand[e["bucket"]])
            prev = e["t_done"]
        wire = mine[-1]["t_done"] - start
        m = log[u + 1]["makespan_s"]  # E's own makespan: from T0 to the engine's forward end
        fwd_end = t0 + m
        parts.update(wire_gaps=gaps, wire_excess=wire - gaps - comm, tail=fwd_end - mine[-1]["t_done"])
        wait = log[u + 1]["wait_s"]
        compute = m - wait
        U, L = compute + comm, max(compute, comm)
        land_order = [e["bucket"] for e in mine]
        # the forward's waits, each put on the pull that landed as it ended (within 2 ms)
        waits: dict[str, float] = {}
        for w in (e for e in r0["events"] if e["kind"] == "wait" and e.get("forward") and e["step"] == u + 1):
            near = [e for e in mine if abs(e["t_done"] - w["t_done"]) < WAIT_MATCH_S]
            key = str(near[0]["bucket"]) if near else "none"
            waits[key] = waits.get(key, 0.0) + w["waited"] * 1e3
        rows.append({"u": u, "makespan_ms": m * 1e3, "fwd_end_gap_ms": (steps[u + 1]["t_fwd_end"] - fwd_end) * 1e3,
                     "comm_ms": comm * 1e3, "compute_ms": compute * 1e3, "wait_ms": wait * 1e3,
                     "E": log[u + 1]["E"], "link_bound": comm >= compute, "U_minus_L_ms": (U - L) * 1e3,
                     "lag_server": r, "out_of_order": land_order != [b for b in planned if b in land_order],
                     "parts_ms": {k: v * 1e3 for k, v in parts.items()}, "wait_by_bucket_ms": waits})
    return rows


def summarize(rows: list[dict]) -> dict:
    bound = [x for x in rows if x["link_bound"]]
    med = lambda xs: statistics.median(xs) if xs else None
    out = {"updates": len(rows), "link_bound": len(bound), "out_of_order": sum(x["out_of_order"] for x in rows),
           "E_median": med([x["E"] for x in rows]), "makespan_ms_median": med([x["makespan_ms"] for x in rows]),
           "comm_ms": med([x["comm_ms"] for x in rows]), "wait_ms_median": med([x["wait_ms"] for x in rows]),
           "compute_ms_median": med([x["compute_ms"] for x in rows]),
           "lagged_updates": sum(x["parts_ms"]["remote_late"] + x["parts_ms"]["push_wait"] + x["parts_ms"]["apply"]
                                 + x["parts_ms"]["handoff"] > 0 for x in bound)}
    # per part: its median in ms, its mean share of E over the link-bound steps (the means add
    # up to the mean E loss, medians do not)
    out["parts_ms_median"] = {k: med([x["parts_ms"][k] for x in bound]) for k in PARTS}
    out["E_loss_mean"] = {k: statistics.fmean(x["parts_ms"][k] / x["U_minus_L_ms"] for x in bound) if bound else None
                          for k in PARTS}
    buckets = sorted({b for x in rows for b in x["wait_by_bucket_ms"]})
    out["wait_by_bucket_ms_median"] = {b: med([x["wait_by_bucket_ms"].get(b, 0.0) for x in rows]) for b in buckets}
    out["wait_by_bucket_ms_max"] = {b: max(x["wait_by_bucket_ms"].get(b, 0.0) for x in rows) for b in buckets}
    out["E_mean_link_bound"] = statistics.fmean(x["E"] for x in bound) if bound else None
    out["fwd_end_gap_ms_max"] = max(abs(x["fwd_end_gap_ms"]) for x in rows) if rows else None
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="timeline DIRs recorded by ps_pull_timeline.py --out")
    ap.add_argument("--warmup", type=int, default=10, help="updates left out (profile and warm-up)")
    ap.add_argument("--order", default="tac", help="the run's pull order, for the plan's prediction")
    ap.add_argument("--json", type=Path, help="write the per-update rows and summaries here")
    args = ap.parse_args(argv)
    if args.warmup < 0:
        ap.error(f"--warmup: expected updates >= 0, got {args.warmup}")
    runs, every = {}, []
    for d in args.dirs:
        ranks = load(d)
        rows = breakdown(ranks, args.warmup)
        if not rows:
            raise SystemExit(f"ps_e_breakdown: {d}: no update left after --warmup {args.warmup}")
        runs[str(d)] = {"summary": summarize(rows), "plan": plan_of(ranks[0], args.order), "rows": rows}
        every += rows
        print(d, json.dumps(runs[str(d)]["summary"], indent=None, default=lambda v: round(v, 3)))
        print(d, "plan", json.dumps(runs[str(d)]["plan"], default=lambda v: round(v, 3)))
    total = summarize(every)
    print("all runs", json.dumps(total, default=lambda v: round(v, 3)))
    if args.json:
        write_json(args.json, {"format": format_tag("ps_e_breakdown"), "warmup": args.warmup, "all": total, "runs": runs,
                               "command": "python experiments/ps_e_breakdown.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
