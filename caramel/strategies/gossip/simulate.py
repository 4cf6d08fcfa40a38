"""The `gossip` strategy in the simulator, and Wang et al.'s question: does gossip beat all-reduce
on this model, cluster, link costs and compute jitter?

Per worker and step, what `caramel.strategies.gossip.parallelize` does:

- after its update (step k-1) worker j sends its gossiped bytes to each out-neighbour of step
  k-1's matrix, in forward order. A gloo send waits for its receiver's recv (rendezvous: the
  receiver posts it at its own update and its notice takes a latency), so a message starts at
  max(end_j, end_i + latency): a worker never streams ahead into a neighbour that is behind.
  The messages share j's sending rate and the receiver's receiving rate
  (`worker_bandwidth_bps`), and d concurrent peer flows achieve `links.flow_share` of the
  rate together (the traffic probe's `push_efficiency` at n - 1 flows), so the first c bytes
  land at start + latency + c x d / (min(rate_j, rate_i) x share(d)), d = max(out-degree_j,
  in-degree_i);
- the bytes travel as the runtime's messages (`bucket_cap_mb`, cut as `engine.make_buckets`
  cuts them: `message_needs`), and the next forward runs the profile's modules in order, each
  once every message holding one of its parameters has landed from every in-neighbour, all of
  it: a model smaller than the cap is one message, which the first module waits for
  (algorithm=adam: no wait in the forward; all of it must have landed before the update);
- compute is the profile's, divided by the worker's speed and multiplied by its step's jitter
  (or, the bench's emulation, followed by a pause after the forward: `links`);
- with `head_steps` (DePRL's tau) only every (tau + 1)-th step sends, the body's bytes;
- compute runs the cluster's `compute_slowdown` times slower while the worker's exchange of
  that step is on the wire (CPU contention, `caramel.bench.contention`; 1 by default), and
  so does the rest of backward once its first overlapped tracker message has left;
- what travels is priced by `volume.peer_bytes`, the runtime's own definition: each
  parameter, its moment buffers (momentum, tracking_momentum: the optimizer the profile names
  in `meta["optimizer"]`, SGD's one buffer when it names none; Adam/AdamW two), the floating
  buffers (`meta["float_buffers"]`, each in its module's message) and the trackers (at least
  float32);
- algorithm=tracking: each worker sends its trackers to step k's out-neighbours and its update
  waits until every in-neighbour's trackers have landed. With `overlap_trackers` (the
  runtime's default) they leave as the runtime cuts them (`tracker_messages`: reverse forward
  order, `tracker_bucket_cap_mb`), each once the last of its parameters' gradients is ready in
  the sender's backward (the profile's `ready_time_s`, scaled to that backward's duration), one
  after another on the link, after the sender's parameter messages of the step (one link),
  and each once the receiver has made the same message ready (rendezvous); without, all of
  them once both have finished backward.

Cluster spec `meta` (all optional; `caramel.strategies.gossip.links`): `worker_bandwidth_bps`, a
list of each worker's link rate (default the cluster's); `compute_jitter`, `{"rank": r,
"fraction": f, "seed": s}`: worker r's compute time at each step is scaled by a uniform draw
from [1 - f, 1 + f] (seeded); `push_efficiency`: the flows' share of the rate at n - 1 peers.

The all-reduce it is compared with (`meta["allreduce"]`), under the same links and jitter:
every step waits for the slowest worker's forward and backward, then the part of a ring
all-reduce (2(n-1) latencies + 2(n-1)/n x bytes at the slowest link's rate) that backward did
not hide, then the update. The step time is the mean period over the second half of the
unrolled steps (all workers' mean; a gossip worker may run ahead of a far one);
`meta["job_step_median_s"]` is the bench's statistic over the same steps: the median of how
far the slowest worker's clock advanced per step (under jitter below the mean).
"""
from __future__ import annotations

import statistics

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.sim.event_loop import Busy
from caramel.sim.simulate import SimResult
from caramel.strategies.gossip.links import flow_share, jitter_factors, link_rates
from caramel.strategies.gossip.options import GossipOptions
from caramel.strategies.gossip.topology import describe, mixing_matrix, neighbours, period
from caramel.strategies.gossip.volume import moment_keys, peer_bytes, tracker_dtype
from caramel.topology.spec import ClusterSpec
from caramel.trace.events import Trace, TraceEvent

MIN_ITERATIONS = 40


def message_needs(shared: list, modules: int, per_tensor: int, cap_bytes: float,
                  buffers: list[tuple[int | None, int]] = ()) -> tuple[list[int], int]:
    """Per module, the bytes of the exchange that must have landed before its forward runs, and
    the exchange's total, cut into messages as `engine.make_buckets` cuts them.

    The tensors go in the order their module first ran (never used: last), a module's
    parameters, then its floating `buffers` ((module index or None, bytes)), then its moment
    buffers (`per_tensor` - 1 of each parameter, key by key, as `GossipRun._tensors` lists
    them); a message closes before a tensor that would take it past `cap_bytes`. Messages
    travel one after another, and a module's pre-hook mixes every message holding one of its
    tensors, each only once all of it has landed: so a module waits for the bytes up to the
    end of the last such message."""
    order = sorted(shared, key=lambda p: modules if p.first_use_order is None else p.first_use_order)
    tensors: list[tuple[int | None, int]] = []
    for m in dict.fromkeys([p.first_use_order for p in order] + [m for m, _ in buffers]):
        mine = [(m, p.bytes) for p in order if p.first_use_order == m]
        tensors += mine + [(m, nbytes) for owner, nbytes in buffers if owner == m] + mine * (per_tensor - 1)
    need, sent, size = [0] * modules, 0, 0
    open_: list[int | None] = []
    for m, nbytes in tensors:
        if open_ and size + nbytes > cap_bytes:
            for owner in open_:
                if owner is not None:
                    need[owner] = sent
            open_, size = [], 0
        open_.append(m)
        size += nbytes
        sent += nbytes
    for owner in open_:
        if owner is not None:
            need[owner] = sent
    return need, sent


def tracker_messages(shared: list, modules: int, cap_bytes: float, backward_time_s: float) -> list[tuple[float, int]]:
    """The overlapped trackers' messages in the order the runtime cuts them
    (`GossipRun._tracker_layout`: reverse forward order, a parameter no module used with the
    first module, so last; cut at `cap_bytes` and where the tracker dtype changes), each as (when
    its last gradient is ready, since backward start; its bytes). A tracker is at least float32:
    a bf16 parameter's is twice its bytes."""
    order = sorted(shared, key=lambda p: -(p.first_use_order or 0))  # stable: parameter order within a module
    out: list[tuple[float, int]] = []
    size, dtype = 0, None
    for p in order:
        tdtype = tracker_dtype(_dtype(p.dtype))
        nbytes = p.numel * tdtype.itemsize
        ready = backward_time_s if p.ready_time_s is None else p.ready_time_s
        if not out or size + nbytes > cap_bytes or tdtype != dtype:
            out.append((ready, 0))
            size, dtype = 0, tdtype
        out[-1] = (max(out[-1][0], ready), out[-1][1] + nbytes)
        size += nbytes
    return out


def _dtype(name: str):
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CaramelError(f"profile parameter dtype {name!r} is not a torch dtype")
    return dtype


def simulate_gossip(profile: ModelProfile, cluster: ClusterSpec, options: GossipOptions, iterations: int = 4) -> SimResult:
    n = cluster.world_size
    if not profile.trainable():
        raise CaramelError(f"model {profile.model!r} has no trainable parameters; there is nothing to gossip")
    mats = [mixing_matrix(options.topology, n, t) for t in range(period(options.topology, n))]
    rates, alpha = link_rates(cluster), cluster.latency_s
    steps = max(iterations, MIN_ITERATIONS, 8 * (options.head_steps + 1))
    jit, nominal = jitter_factors(cluster, steps)
    if nominal is not None:  # the bench's emulation: compute as profiled, a pause after the forward
        pauses = [[(nominal * d - 1.0) * (profile.forward_time_s + profile.backward_time_s) / w.speed for d in draws]
                  for draws, w in zip(jit, cluster.workers)]
        jit = [[1.0] * steps for _ in range(n)]
    else:
        pauses = [[0.0] * steps for _ in range(n)]
    speed = [w.speed for w in cluster.workers]
    optimizer = str(profile.meta.get("optimizer", "SGD"))  # a profile that names none: SGD's one buffer
    per_tensor = 1 + len(moment_keys(optimizer, options.algorithm))
    shared = [p for p in profile.trainable() if not options.is_local(p.name)]
    module_of = {m.name: k for k, m in enumerate(profile.modules)}
    buffers = [(module_of.get(name.rpartition(".")[0]), int(nbytes))
               for name, nbytes in profile.meta.get("float_buffers", {}).items() if not options.is_local(name)]
    need, total = message_needs(shared, len(profile.modules), per_tensor, options.bucket_cap_mb * 2 ** 20, buffers)
    priced = peer_bytes(options.algorithm, optimizer, [(p.numel, _dtype(p.dtype)) for p in shared],
                        sum(b for _, b in buffers))
    assert total == priced.parameters, (total, priced)  # the messages hold what the runtime sends
    in_forward = options.algorithm != "adam"
    tracking = options.tracks
    tracker_bytes = priced.trackers
    overlapped = tracking and options.overlaps_trackers
    tmsgs = (tracker_messages(shared, len(profile.modules), options.tracker_cap_mb * 2 ** 20,
                              profile.backward_time_s) if overlapped else [])

    def compute(w: int, k: int, seconds: float) -> float:
        return seconds / speed[w] * jit[w][k]

    def per_byte(Wk, j: int, w: int) -> float:
        """Seconds per byte from j to w: the flows through either link share its rate, and
        together achieve `flow_share` of it."""
        flows = max(len(neighbours(Wk, j).send), len(neighbours(Wk, w).recv))
        return flows / (min(rates[j], rates[w]) * flow_share(cluster, flows))

    end = [[0.0] * steps for _ in range(n)]
    waits = [0.0] * n
    events = []
    cycle = options.head_steps + 1  # DePRL: only the last step of each cycle sends (the body)
    ready, starts, busies = [0.0] * n, [0.0] * n, [Busy(cluster.compute_slowdown) for _ in range(n)]
    backward = [(0.0, 0.0)] * n  # per worker, this step's backward (start, end)
    sends_end = [0.0] * n  # per worker, when this step's parameter messages have left its link

    def trackers_landed(j: int, w: int, Wk) -> float:
        """When the last of j's trackers of this step lands at w. A gloo send waits for its
        receiver's recv (rendezvous), posted when w reaches the same point; j's link sends its
        parameter messages first. Without overlap both post at step(); with, message by
        message as each backward makes it ready, one after another on j's link."""
        pb = per_byte(Wk, j, w)
        if not overlapped:
            return max(ready[j], ready[w] + alpha, sends_end[j]) + alpha + tracker_bytes * pb
        (b0, b1), (c0, c1), link = backward[j], backward[w], sends_end[j]
        back_s = profile.backward_time_s
        scale_j = (b1 - b0) / back_s if back_s > 0 else 0.0
        scale_w = (c1 - c0) / back_s if back_s > 0 else 0.0
        for ready_s, nbytes in tmsgs:
            link = max(link, b0 + ready_s * scale_j, c0 + ready_s * scale_w + alpha) + nbytes * pb
        return link + alpha

    for k in range(steps):
        sent = k > 0 and (k - 1) % cycle == cycle - 1
        W = mats[((k - 1) // cycle) % len(mats)] if sent else None
        nbs = [neighbours(W, i) for i in range(n)] if W is not None else None

        def leaves(j: int, w: int) -> float:
            """When j's messages to w start: gloo sends once w's recv is posted (w's update
            of the step before, its ready-notice a latency away) and j's send is."""
            return max(end[j][k - 1], end[w][k - 1] + alpha)

        if nbs is not None:
            sends_end = [max((leaves(w, i) + alpha + total * per_byte(W, w, i) for i in nbs[w].send),
                             default=end[w][k - 1]) for w in range(n)]
        else:
            sends_end = [0.0] * n
        for w in range(n):
            t = end[w][k - 1] if k else 0.0

            def landed(c: float) -> float:
                if nbs is None or c == 0:
                    return 0.0
                return max((leaves(j, w) + alpha + c * per_byte(W, j, w) for j, _ in nbs[w].recv), default=0.0)

            # contention: compute runs the cluster's compute_slowdown times slower while this
            # step's exchange is on the wire (from the first send to the last landing)
            busy = Busy(cluster.compute_slowdown)
            if nbs is not None and n > 1:
                first = min([leaves(j, w) for j, _ in nbs[w].recv] + [leaves(w, i) for i in nbs[w].send] + [t])
                busy.add(first, max(landed(total), sends_end[w]))
            start = t
            for m, mod in enumerate(profile.modules):
                if in_forward:
                    due = landed(need[m])
                    if due > t:
                        waits[w] += due - t
                        t = due
                t = busy.advance(t, compute(w, k, mod.forward_time_s))
            t += pauses[w][k]  # a sleep: not slowed by the transfers
            bwd0 = t
            if overlapped and n > 1 and tmsgs:
                # from the first tracker message's leaving, the trackers' exchange is on the
                # wire for the rest of backward: that part runs at the contention's slowdown
                first_s = min(tmsgs[0][0], profile.backward_time_s)
                t = busy.advance(t, compute(w, k, first_s))
                t += compute(w, k, profile.backward_time_s - first_s) * cluster.compute_slowdown
            else:
                t = busy.advance(t, compute(w, k, profile.backward_time_s))
            backward[w] = (bwd0, t)
            due = landed(total)
            if due > t:
                waits[w] += due - t
                t = due
            ready[w], starts[w], busies[w] = t, start, busy
        for w in range(n):
            t = ready[w]
            if tracking and n > 1:  # the update waits for the in-neighbours' trackers of this step
                Wk = mats[k % len(mats)]
                due = max(trackers_landed(j, w, Wk) for j, _ in neighbours(Wk, w).recv)
                if due > t:
                    waits[w] += due - t
                    t = due
            t = busies[w].advance(t, compute(w, k, profile.optimizer_time_s))
            end[w][k] = t
            events.append(TraceEvent(w, "compute", "step", "step", starts[w], t - starts[w], k))
    warm = steps // 2
    periods = [(e[-1] - e[warm]) / (steps - 1 - warm) for e in end]
    step_s = statistics.mean(periods)
    # the bench's statistic: per step, how far the slowest worker's clock advanced; its median
    job = [max(e[k] for e in end) for k in range(warm, steps)]
    job_median_s = statistics.median(b - a for a, b in zip(job, job[1:]))
    compute_s = max(statistics.mean(jit[w]) * profile.step_time_s / speed[w] + statistics.mean(pauses[w])
                    for w in range(n))
    send_s = max(alpha + total * len(neighbours(W, w).send) / rates[w] for W in mats for w in range(n)) if n > 1 else 0.0
    ar = allreduce_step_s(profile, cluster, rates, jit, sum(p.bytes for p in shared), pauses)
    info = describe(options.topology, n)
    name = info["topology"]
    return SimResult(
        step_time_s=step_s, compute_time_s=compute_s, comm_time_s=send_s, exposed_comm_s=max(step_s - compute_s, 0.0),
        wait_time_s=statistics.mean(waits) / steps,
        link_utilization=min(send_s / step_s, 1.0) if step_s > 0 else 0.0,
        comm_busy_fraction=min(send_s / step_s, 1.0) if step_s > 0 else 0.0,
        iteration_times_s=[b - a for a, b in zip([0.0] + end[0][:-1], end[0])],
        critical_path={"bound": "communication" if step_s > compute_s * 1.05 else "compute",
                       "slowest_worker": periods.index(max(periods))},
        planner=f"gossip:{name}", overlap="forward" if in_forward else "backward",
        world_size=n, num_items=len(shared),
        trace=Trace("predicted", n, events, meta={"strategy": "gossip"}),
        meta={"strategy": "gossip", "topology": name, "algorithm": options.algorithm,
              "mixing": info, "bytes_per_peer_per_step": priced.total,
              "tracker_bytes_per_peer_per_step": priced.trackers, "periods_s": periods,
              "job_step_median_s": job_median_s,
              "allreduce": {"step_time_s": ar, "gossip_speedup": ar / step_s if step_s > 0 else None}})


def allreduce_step_s(profile: ModelProfile, cluster: ClusterSpec, rates: list[float], jit: list[list[float]],
                     nbytes: int, pauses: list[list[float]] | None = None) -> float:
    """Mean synchronous step time of ring all-reduce data parallelism under the same links and
    jitter (module docstring): every step waits for the slowest worker (`pauses`: each worker's
    sleep after its forward per step, the bench's jitter emulation)."""
    n = cluster.world_size
    speed = [w.speed for w in cluster.workers]
    comm = 2 * (n - 1) * cluster.latency_s + 2 * (n - 1) / n * nbytes / min(rates) if n > 1 else 0.0
    steps = len(jit[0])
    times = []
    for k in range(steps):
        fb = max((profile.forward_time_s + profile.backward_time_s) / speed[w] * jit[w][k]
                 + (pauses[w][k] if pauses else 0.0) for w in range(n))
        bwd = min(profile.backward_time_s / speed[w] * jit[w][k] for w in range(n))
        opt = max(profile.optimizer_time_s / speed[w] * jit[w][k] for w in range(n))
        times.append(fb + max(comm - bwd, 0.0) + opt)
    return statistics.mean(times[steps // 2:])
