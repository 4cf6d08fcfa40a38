"""The `ps` strategy in the simulator: colocated servers, ordered pushes and pulls, bsp/ssp/asp.

A model of what `caramel.strategies.ps.engine` does, step by step, per worker (its speed from
the cluster spec), with the backend's behaviour made explicit:

- the unit of transfer is the plan's bucket (`buckets.py`: parameters of one shard fused up
  to `bucket_cap_mb` in ready order for a push, in need order up to the pull cap for a pull),
  so a bucket pays one latency for all its bytes;
- each server's pushes are one sequence of transfers (the plan's bucket push order: every other
  worker sends the bucket to the server, `engine._send_push`) on its own group, its pulls one
  sequence of broadcasts (each update's bucket pull order) on another; each starts once every
  rank has handed it over and the previous one of its group is done, and lasts latency +
  (n-1) x bytes / bandwidth (the server's NIC receives, or sends, one copy per other worker).
  Different servers' sequences run side by side, and a worker's sends to different servers
  too (with balanced shards they need no more than one server's receives). A serving rank's
  pushes and pulls leave by one NIC (colocated, flat: on one gloo connection too, its pushes
  on its own shard's pull group, `PsEngine.link_group`): they leave one after another, in the
  order it handed them over (`Links`, `sim_links.py`);
  under bsp a rank's pulls follow all pushes anyway, under ssp/asp a step's pushes wait for the
  pulls their senders handed over before them, and the next pulls for those pushes;
- a worker hands over a bucket's push when all its gradients, and every earlier bucket, are
  ready (the counter rule); at step() it pushes the rest and the used-count all-reduce (a
  ring's 2(r-1) latencies once the last push is in), then applies the updates that are due
  (older than the bound: it waits for their reductions) or have arrived, running its shard's
  share of the optimizer, and hands over their pulls;
- the next forward runs the profile's modules in order, each once the pulls of the parameters
  it uses first, of the update it must see (S behind), have landed;
- compute runs the cluster's `compute_slowdown` times slower while any push or pull is in
  flight (CPU contention, `caramel.bench.contention`; 1 by default): the forward beside the
  pulls, the backward beside the pushes it hands over (placed once, then again with the
  backward they slowed);
- the links (colocated, flat; the cluster spec's meta, measured by the bench's
  `caramel.bench.traffic_probe`, each left out when not given): a small message waits behind
  the bulk data queued on its way, at most `link_queue_s` behind each transfer (`queues.py`):
  gloo's note that a receiver is ready, which each push and pull waits for, and, under bsp,
  rank 0's buffers (the profile's `buffer_bytes` in `buffer_broadcasts` rounds, before which
  the forward does not start), sent at step() just before the pulls (`buffer_sync.py`; the
  first forward's at its start); the pushes run at `push_efficiency` of the rate (every worker
  sending to every other at once), the pulls at `pull_efficiency`; where the meta gives
  `push_efficiency_by_count` (`pull_efficiency_by_count`: the probe's rate for 1..n servers
  receiving, or broadcasting, at once), the pushes (pulls) are fluid flows whose rate follows
  how many are on the wire (`sim_flows.py`, `sim_pulls.py`); the long-run bound keeps the
  all-at-once rates (a comm-bound steady state has every server busy all the time).

With `hierarchical=True` (`meta["workers_per_node"]` consecutive workers share a node,
`meta["node_bandwidth_bps"]` the rate within it, default the link's) the servers are the leaders:
a push is a reduce within the node (the node's reduces running ahead of the sends), then on gloo
each leader's node sum sent to the server leader as it lands (`sim_hier.py`), off gloo
(`meta["backend"]`, else the probe's) a reduce among the leaders; a pull a broadcast among the
leaders, then within the node; a serving leader's sends and pulls share its NIC in hand-over order.

With `dedicated=true` the `servers` servers are extra hosts on links like the workers' (the cluster
spec lists the workers only): each push is a reduce over the workers and the shard's server, handed
over once every worker has reached step() (the runtime's step message: pushes queued during backward
do not overlap it on the wire); each server applies its shard as soon as its reductions have
landed, then broadcasts it back; the workers run no optimizer (docs/ps.md, "Simulator").

The step time is the slowest worker's mean period over the second half of the unrolled steps;
TicTac's predicted E and S of the order are in `meta`, next to the shard loads.
"""
from __future__ import annotations

import statistics

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.sim.simulate import SimResult
from caramel.strategies.ps.options import ASP_BOUND_STEPS, PsOptions
from caramel.strategies.ps.planner import make_ps_plan
from caramel.strategies.ps.queues import Backlog, Queues, broadcast_rounds
from caramel.strategies.ps.sim_flows import Push, flag_unsettled, settle_pushes
from caramel.strategies.ps.sim_hier import LeaderSends
from caramel.strategies.ps.sim_links import Links, Wire
from caramel.strategies.ps.sim_meta import (backend, efficiency, link_queue_s, pull_curve_of, push_curve_of,
                                            receives_early_of, workers_per_node)
from caramel.strategies.ps.sim_pulls import fluid_pulls
from caramel.topology.spec import ClusterSpec
from caramel.trace.events import Trace, TraceEvent

MIN_ITERATIONS = 8
STEADY_STEPS_PER_BOUND = 20


def simulate_ps(profile: ModelProfile, cluster: ClusterSpec, options: PsOptions, iterations: int = 4) -> SimResult:
    n = cluster.world_size
    if options.dedicated and options.servers < 1:
        raise CaramelError("ps: dedicated=true needs servers=N >= 1 (the server hosts beside the cluster spec's workers)")
    dedicated = options.servers if options.dedicated else 0
    local = workers_per_node(cluster) if options.hierarchical else 1
    shards = options.check_world(n, local, dedicated)
    if not profile.trainable():
        raise CaramelError(f"model {profile.model!r} has no trainable parameters; there is nothing to serve")
    bound = options.staleness_bound()
    S = ASP_BOUND_STEPS if bound is None else bound
    Bps = cluster.bandwidth_bps / 8
    alpha = cluster.latency_s
    plan = make_ps_plan(profile, options, shards, alpha, Bps)
    size = {p.index: p.bytes for p in profile.params}
    ready = {p.index: (p.ready_time_s if p.ready_time_s is not None else profile.backward_time_s) for p in profile.params}
    uses: list[list[int]] = [[] for _ in profile.modules]
    for p in profile.trainable():
        if p.first_use_order is not None:
            uses[p.first_use_order].append(p.index)
    total = sum(size[i] for i in plan.params) or 1
    # the worker serving shard s: s, or with hierarchy the first worker of node s
    serves = {} if dedicated else {s * local: s for s in range(shards)}
    server_bytes = [sum(size[i] for i in plan.params if plan.owner[i] == s) for s in range(shards)]
    shard_bytes = [server_bytes[serves[w]] if w in serves else 0 for w in range(n)]  # what each worker serves
    node_Bps = float(cluster.meta.get("node_bandwidth_bps", cluster.bandwidth_bps)) / 8
    speed = [w.speed for w in cluster.workers]
    # staleness lets a backlog of transfers build up slowly: unroll well past the bound
    iters = max(iterations, MIN_ITERATIONS) + STEADY_STEPS_PER_BOUND * S

    def stage_s(members: int, nbytes: float, rate_Bps: float) -> float:
        return 0.0 if members == 1 else alpha + (members - 1) * nbytes / rate_Bps

    buckets = plan.buckets
    bucket_bytes = [sum(size[i] for i in b) for b in buckets]
    bucket_owner = [plan.bucket_owner(b) for b in range(len(buckets))]
    bucket_ready = [max((ready[i] for i in b), default=0.0) for b in buckets]
    pull_bytes = [sum(size[i] for i in b) for b in plan.pull_buckets]
    pull_owner = [plan.pull_owner(b) for b in range(len(plan.pull_buckets))]

    flat_Bps = {kind: Bps * efficiency(cluster, f"{kind}_efficiency") for kind in ("push", "pull")}
    # the probe's rates for 1..n pushes (pulls) at once, checked wherever given: fluid flows, flat colocated only
    flat = not dedicated and local == 1 and n > 1
    push_curve, pull_curve = (c if flat else None for c in (push_curve_of(cluster), pull_curve_of(cluster)))

    def coll_s(b: int, kind: str = "push") -> float:
        """One push bucket's push (or pull bucket's pull): flat, among all workers (every
        server's at once: the rate the links achieve for that pattern); hierarchical, within the
        node, then among the nodes' leaders (the two stages in sequence; on gloo the same
        sum: the node's reduce, then the server's NIC taking every other leader's copy)."""
        nbytes = bucket_bytes[b] if kind == "push" else pull_bytes[b]
        if dedicated:  # the workers and the shard's server
            return stage_s(n + 1, nbytes, Bps)
        if local == 1:
            return stage_s(n, nbytes, flat_Bps[kind])
        return stage_s(local, nbytes, node_Bps) + stage_s(n // local, nbytes, Bps)

    clock = [0.0] * n  # each worker's time: when its next forward may start
    arrive: dict[int, dict[int, float]] = {}  # update -> parameter -> when its pull landed everywhere
    reduced: dict[int, float] = {}  # update -> when its last reduction (and the used count) was done
    applied_at: dict[int, list[float]] = {}  # update -> when each rank handed over its pulls
    pending = [[] for _ in range(n)]  # per worker: updates not yet applied there
    push_end, pull_end = [0.0] * shards, [0.0] * shards
    step_ends: list[list[float]] = [[] for _ in range(n)]
    waits = [0.0] * n
    # per worker and step: (forward, its waits, backward, step())
    pieces: list[list[tuple[float, float, float, float]]] = [[] for _ in range(n)]
    last_pulls: list[tuple[int, float, float]] = []  # the latest update's pulls: (bucket, start, end)
    timeline: dict = {}
    pulled_upto = -1
    unsettled: dict[int, tuple[int, float]] = {}  # step -> its fluid pushes' rounds and last change (s), unsettled
    pull_unsettled: dict[int, tuple[int, float]] = {}  # update -> the same for its fluid pulls
    wire = Wire(cluster.compute_slowdown)
    # flat colocated servers: small messages wait behind the bulk transfers (`queues.py`)
    queue_s = link_queue_s(cluster)
    queues = Queues(n, queue_s) if queue_s > 0 and not dedicated and local == 1 and n > 1 else None
    rounds = int(profile.meta.get("buffer_broadcasts", 0)) if bound == 0 and queues is not None else 0
    buffer_s = alpha + float(profile.meta.get("buffer_bytes", 0)) / max(rounds, 1) / Bps
    early = None  # bsp: when rank 0's buffers sent at step() reach each rank
    # a serving rank's (a leader's: indexed by node) pushes and pulls leave by one NIC
    links = None if dedicated else Links(n, shards) if local == 1 else Links(shards, shards)
    # hierarchical on gloo: node reduces, then each leader's node sum sent to its server as it
    # lands; off gloo the runtime reduces among the leaders: the two-stage collective (`coll_s`)
    sends = backend(cluster) == "gloo" and local > 1 and not dedicated
    # flat colocated on gloo: a server posts its push receives at the step's first hand-over
    # (`PsEngine.posts_receives_early`), where the cluster spec says the run's runtime does
    receives_early = receives_early_of(cluster) and backend(cluster) == "gloo" and local == 1 and not dedicated
    leader_sends = LeaderSends(n // local, local, shards, alpha, Bps, node_Bps) if sends else None
    for k in range(iters):
        need = k - 1 - S  # the update this forward must see
        wire.forget_before(min(clock))
        if queues is not None:
            queues.forget_before(min(clock))
        # bsp: rank 0's buffers, sent at the last step() ahead of the pulls (the first forward: at its start)
        begin = early if early is not None else broadcast_rounds(queues, 0, clock, rounds, buffer_s)[1] if rounds else clock
        fwd_ends = [0.0] * n
        for w in range(n):
            t = clock[w]
            busy = wire.busy(t)
            fwd_wait = max(begin[w] - t, 0.0)
            t += fwd_wait
            for m, mod in enumerate(profile.modules):
                land = max((arrive[need][i] for i in uses[m]), default=0.0) if need >= 0 else 0.0
                if land > t:
                    fwd_wait += land - t
                    t = land
                t = busy.advance(t, mod.forward_time_s / speed[w])
            waits[w] += fwd_wait
            fwd_ends[w] = t
            pieces[w].append((t - clock[w], fwd_wait, 0.0, 0.0))

        def backward(with_pushes: list[tuple[float, float]]) -> tuple[list[float], list[dict[int, float]]]:
            """Each worker's backward end and its buckets' hand-over times, slowed by the
            transfers on the wire (this step's pushes: `with_pushes`)."""
            ends, issue = [], []
            for w in range(n):
                busy = wire.busy(fwd_ends[w], with_pushes)
                end = busy.advance(fwd_ends[w], profile.backward_time_s / speed[w])
                handed, latest = {}, fwd_ends[w]
                for b in range(len(buckets)):  # a bucket is handed over once its last gradient is ready
                    latest = max(latest, busy.advance(fwd_ends[w], bucket_ready[b] / speed[w]))
                    handed[b] = min(latest, end)
                ends.append(end)
                issue.append(handed)
            return ends, issue

        def sent_s(issue: list[dict[int, float]], b: int) -> float:
            """When bucket b's push may leave every sender: each has handed it over, and the
            server too unless it posted its receives early (the server's own gradient is summed
            at its end, not sent)."""
            o = bucket_owner[b]
            return max((issue[w][b] for w in range(n) if not receives_early or w != o), default=0.0)

        def posted_s(issue: list[dict[int, float]], b: int) -> float:
            """When the server of bucket b posts its receive (gloo's "ready" note): at the step's
            first hand-over where it posts early, else at its own hand-over of b."""
            o = bucket_owner[b]
            return min(issue[o].values()) if receives_early else issue[o][b]

        def fluid_push(issue: list[dict[int, float]]) -> tuple[list[float], list[tuple[float, float]], None]:
            """Flat colocated pushes as fluid flows (`sim_flows.py`): each push's earliest start
            as `push` sets it, its span from the probe's rates for the pushes then in flight. The
            queues' wait behind this step's pushes reads their spans: taken from the previous
            round, until two rounds agree (`settle_pushes`); a step where they never do is noted."""
            def pushes(spans: list[tuple[float, float]] | None) -> list[Push]:
                now = [Backlog(queues.ingress[0].cap_s) for _ in range(n)] if queues is not None else []
                todo = []
                for b in range(len(buckets)):
                    o = bucket_owner[b]
                    start = links.push_start(sent_s(issue, b), o, pull_end)
                    if queues is not None:
                        h = posted_s(issue, b)
                        start = max([start] + [h + queues.egress[o].wait(h) + max(queues.ingress[w].wait(h), now[w].wait(h))
                                               for w in range(n) if w != o])
                        if spans is not None:
                            now[o].add(*spans[b])
                    todo.append(Push(o, start, alpha if n > 1 else 0.0, (n - 1) * bucket_bytes[b]))
                return todo

            flows = settle_pushes(pushes, Bps, push_curve, dict(enumerate(push_end)), queues is not None)
            if flows.settled:  # the last call of step k counts (the backward may be placed twice)
                unsettled.pop(k, None)
            else:
                unsettled[k] = (flows.rounds, flows.change_s)
            ends = list(push_end)
            for b, (_, z) in enumerate(flows.spans):
                ends[bucket_owner[b]] = max(ends[bucket_owner[b]], z)
            return ends, flows.spans, None

        def push(issue: list[dict[int, float]], bwd_end: list[float]) -> tuple[list[float], list[tuple[float, float]], LeaderSends | None]:
            if push_curve is not None:
                return fluid_push(issue)
            ends, spans = list(push_end), []
            hs = leader_sends.copy() if leader_sends is not None else None
            # dedicated: a server joins the step's pushes once every worker's step message is in
            joined = max(bwd_end) + alpha if dedicated else 0.0
            now = [Backlog(queues.ingress[0].cap_s) for _ in range(n)] if queues is not None else []  # this step's
            for b in range(len(buckets)):
                o = bucket_owner[b]
                if hs is not None:
                    # the server leader posts the step's receives at its first hand-over (`NodeSums.expect`)
                    start, ends[o] = hs.push(bucket_bytes[b], o, [issue[w][b] for w in range(n)], pull_end,
                                             min(issue[o * local].values()))
                    spans.append((start, ends[o]))
                    continue
                start = max(ends[o], joined, sent_s(issue, b))
                if links is not None:  # behind the pulls its senders handed over before it
                    start = links.push_start(start, o, pull_end)
                if queues is not None:  # the server's "ready" note reaches every sender through the queues
                    h = posted_s(issue, b)
                    start = max([start] + [h + queues.egress[o].wait(h) + max(queues.ingress[w].wait(h), now[w].wait(h))
                                           for w in range(n) if w != o])
                ends[o] = start + coll_s(b)
                spans.append((start, ends[o]))
                if queues is not None:
                    now[o].add(start, ends[o])
            return ends, spans, hs

        bwd_end, issue = backward([])
        ends, spans, hs = push(issue, bwd_end)
        if wire.slowdown > 1.0:  # once more, the backward slowed by the pushes it overlaps
            bwd_end, issue = backward(spans)
            ends, spans, hs = push(issue, bwd_end)
        push_end, leader_sends = ends, hs
        wire.add(spans)
        if links is not None:
            for b, (_, z) in enumerate(spans):
                links.pushed(bucket_owner[b], z)
        if queues is not None:
            for b, (a, z) in enumerate(spans):
                queues.ingress[bucket_owner[b]].add(a, z)
        if k == iters - 2:  # one steady step, as the runtime's timing script records it
            t0 = min(clock)
            rel = lambda x: x - t0  # noqa: E731
            timeline = {"forward_start": [rel(c) for c in clock], "forward_end": [rel(x) for x in fwd_ends],
                        "backward_end": [rel(x) for x in bwd_end],
                        "handed": [[rel(issue[w][b]) for b in range(len(buckets))] for w in range(n)],
                        "pushes": [(b, bucket_owner[b], rel(a), rel(z)) for b, (a, z) in enumerate(spans)],
                        "pulls_before": [(b, pull_owner[b], rel(a), rel(z)) for b, a, z in last_pulls],
                        "pulls_after": []}
        # then the used-count all-reduce (every rank, the servers too), a small ring: 2(r-1) messages
        reduced[k] = max(push_end) + 2 * (n + dedicated - 1) * alpha
        if dedicated:  # each server applies its shard when its own reductions are in
            applied_at[k] = [push_end[o] + profile.optimizer_time_s * server_bytes[o] / total for o in range(shards)]
        for w in range(n):
            pending[w].append(k)
            t = bwd_end[w]
            while pending[w]:
                u = pending[w][0]
                if u <= k - S:
                    if reduced[u] > t:
                        waits[w] += reduced[u] - t
                        t = reduced[u]
                elif reduced[u] > t:
                    break
                pending[w].pop(0)
                t += profile.optimizer_time_s * shard_bytes[w] / total / speed[w]
                if not dedicated:
                    applied_at.setdefault(u, [0.0] * n)[w] = t
            clock[w] = t
            step_ends[w].append(t)
            f, fw, _, _ = pieces[w][-1]
            pieces[w][-1] = (f, fw, bwd_end[w] - fwd_ends[w], t - bwd_end[w])
        early = broadcast_rounds(queues, 0, clock, rounds, buffer_s)[1] if rounds else None  # before the pulls
        while pulled_upto + 1 <= k and all(pulled_upto + 1 not in pending[w] for w in range(n)):
            u = pulled_upto + 1
            arrive[u] = {}
            last_pulls = []
            order = plan.bucket_pull_at(u)
            if pull_curve is not None:  # fluid flows (`sim_pulls.py`): by the apply and the links, then shared
                flows = fluid_pulls(order, pull_owner, [(n - 1) * x for x in pull_bytes],
                                    [links.pull_start(max(applied_at[u]), pull_owner[b]) for b in order], applied_at[u],
                                    queues, alpha, Bps, pull_curve, dict(enumerate(pull_end)))
                pull_unsettled.update({} if flows.settled else {u: (flows.rounds, flows.change_s)})
            for j, b in enumerate(order):
                o = pull_owner[b]
                if pull_curve is not None:
                    start, pull_end[o] = flows.spans[j]
                else:
                    start = max(pull_end[o], applied_at[u][o] if dedicated else max(applied_at[u]))
                    if links is not None:  # behind its server's pushes handed over before it
                        start = links.pull_start(start, o)
                    if queues is not None:  # every receiver's "ready" note reaches the server through the queues
                        start = max([start] + [a + queues.wait(w, o, a) for w, a in enumerate(applied_at[u]) if w != o])
                    pull_end[o] = start + coll_s(b, "pull")
                if queues is not None:
                    queues.egress[o].add(start, pull_end[o])
                last_pulls.append((b, start, pull_end[o]))
                wire.add([(start, pull_end[o])])
                for i in plan.pull_buckets[b]:
                    arrive[u][i] = pull_end[o]
            pulled_upto = u
            if k == iters - 2:  # the pulls this step's step() handed over, after its pushes
                timeline["pulls_after"] += [(b, pull_owner[b], rel(a), rel(z)) for b, a, z in last_pulls]
    warm = iters // 2
    fluid_meta = flag_unsettled(iters, unsettled if push_curve is not None else None,
                                pull_unsettled if pull_curve is not None else None)
    periods = [(ends[-1] - ends[warm]) / (len(ends) - 1 - warm) for ends in step_ends]
    # in the long run no step is shorter than one server's pushes, or pulls, back to back (each
    # group runs its collectives one at a time), whatever backlog staleness has let build up;
    # where a rank's pushes and pulls share its links (`Links`), than its pulls and then its
    # pushes to any one server
    pulls_of = [sum(coll_s(b, "pull") for b in range(len(pull_bytes)) if pull_owner[b] == o) for o in range(shards)]
    if leader_sends is None:
        pushes_to = [sum(coll_s(b) for b in range(len(buckets)) if bucket_owner[b] == o) for o in range(shards)]
        group_s = max(max(pushes_to[o], pulls_of[o]) for o in range(shards))
    else:  # the node reduces and each server's NIC, pipelined (`LeaderSends`)
        pushes_to = [sum(stage_s(n // local, bucket_bytes[b], Bps) for b in range(len(buckets)) if bucket_owner[b] == o)
                     for o in range(shards)]
        group_s = max([leader_sends.bound_s(bucket_bytes, bucket_owner)] + pulls_of)
    if links is not None and shards > 1:
        group_s = max(group_s, max(pulls_of[x] + max(pushes_to[o] for o in range(shards) if o != x) for x in range(shards)))
    step_s = max(max(periods), group_s)
    compute_s = max((profile.forward_time_s + profile.backward_time_s
                     + profile.optimizer_time_s * shard_bytes[w] / total) / speed[w] for w in range(n))
    comm_s = sum(coll_s(b) for b in range(len(buckets))) + sum(coll_s(b, "pull") for b in range(len(pull_bytes)))
    bw_s = 2 * sum((n if dedicated else n // local - 1) * size[i] / Bps for i in plan.params)
    events = [TraceEvent(w, "compute", "step", "step", a, b - a, k)
              for w in range(n) for k, (a, b) in enumerate(zip([0.0] + step_ends[w][:-1], step_ends[w]))]
    return SimResult(
        step_time_s=step_s, compute_time_s=compute_s, comm_time_s=comm_s, exposed_comm_s=max(step_s - compute_s, 0.0),
        wait_time_s=statistics.mean(waits) / iters, link_utilization=min(bw_s / step_s, 1.0) if step_s > 0 else 0.0,
        comm_busy_fraction=min(comm_s / step_s, 1.0) if step_s > 0 else 0.0,
        iteration_times_s=[b - a for a, b in zip([0.0] + step_ends[0][:-1], step_ends[0])],
        critical_path={"bound": "communication" if group_s >= max(periods) else "compute",
                       "slowest_worker": periods.index(max(periods))},
        planner=f"ps:{options.order}", overlap="forward", world_size=n, num_items=len(buckets),
        trace=Trace("predicted", n, events, meta={"strategy": "ps"}),
        meta={"strategy": "ps", "consistency": options.consistency, "order": options.order,
              "buckets": len(buckets), "bucket_cap_mb": options.bucket_cap_mb,
              "pull_buckets": len(pull_bytes), "pull_bucket_cap_mb": options.pull_cap_mb(),
              "tictac": {k: v for k, v in plan.predicted.items()}, "shard_loads": plan.loads,
              "workers_per_node": local, "dedicated_servers": dedicated,
              "periods_s": periods, "timeline_s": timeline,
              **fluid_meta,
              # the slowest worker's mean steady step, piece by piece (as experiments/ps_breakdown.py times them)
              "pieces_s": dict(zip(("forward", "forward_wait", "backward", "optimizer_step"),
                                   (statistics.mean(x) for x in zip(*pieces[periods.index(max(periods))][warm:]))))})
