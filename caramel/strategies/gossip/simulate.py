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
  (algorithm=overlap, adam and overlap_momentum: no wait in the forward; all of it must have landed before the update);
- compute is the profile's, divided by the worker's speed and multiplied by its step's jitter
  (or, the bench's emulation, followed by a pause after the forward: `links`);
- with `head_steps` (DePRL's tau) only every (tau + 1)-th step sends, the body's bytes;
- compute runs the cluster's `compute_slowdown` times slower while the worker's exchange of
  that step is on the wire (CPU contention, `caramel.bench.contention`; 1 by default), and
  while its overlapped trackers are: from the first tracker message's leaving (behind the
  parameter messages) for the trackers' transfer time on its link (`tracker_wire_s`), so on
  a fast link backward barely slows;
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
from [1 - f, 1 + f] (seeded), or with `"pause_after_forward": true` (and `"pause_unit_s"`, the
pause's unit in seconds) the bench's pause after the forward instead; `push_efficiency`: the flows' share of the rate at n - 1 peers.

The all-reduce it is compared with (`meta["allreduce"]`), under the same links and jitter:
every step waits for the slowest worker's forward and backward, then the part of a ring
all-reduce (2(n-1) latencies + 2(n-1)/n x bytes at the slowest link's rate) that backward did
not hide, then the update. The step time is the mean period over the second half of the
unrolled steps (all workers' mean; a gossip worker may run ahead of a far one);
`meta["job_step_median_s"]` is the job-step median in steady state: over the same steps of one
continuous run, the median of how far the slowest worker's clock advanced per step (under
jitter below the mean). The bench's statistic (`caramel.bench.report.job_step_times`) restarts
the job clock at every round, so under jitter, where the coupling builds up across steps, the
two need not agree.
"""
from __future__ import annotations

import statistics

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile
from caramel.sim.event_loop import Busy
from caramel.sim.jitter import jitter_spec
from caramel.sim.simulate import SimResult
from caramel.strategies.gossip.links import flow_share, link_rate_Bps
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


def tracker_messages(shared: list, modules: int, cap_bytes: float,
                     backward_time_s: float) -> list[tuple[float, int]]:
    """The overlapped trackers' messages in the order the runtime cuts them
    (`GossipRun._tracker_layout`: reverse forward order, a parameter no module used with the
    first module, so last; cut at `cap_bytes` and where the tracker dtype changes), each as (when
    its last gradient is ready, since backward start; its bytes). A tracker is at least float32:
    a bf16 parameter's is twice its bytes."""
    # sorted() is stable: parameter order within a module
    order = sorted(shared, key=lambda p: -(p.first_use_order or 0))
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


def s_per_byte(cluster: ClusterSpec, rate_Bps: list[float], W, j: int, w: int) -> float:
    """Seconds per byte from j to w under mixing matrix `W`: the flows through either link share
    its rate, and together achieve `flow_share` of it."""
    flows = max(len(neighbours(W, j).send), len(neighbours(W, w).recv))
    return flows / (min(rate_Bps[j], rate_Bps[w]) * flow_share(cluster, flows))


class StepLinks:
    """One step's parameter exchange: sent under matrix `W` (None: the step sends nothing) after
    each worker's update of the step before (`prev_end_s`)."""

    def __init__(self, cluster: ClusterSpec, rate_Bps: list[float], prev_end_s: list[float], W, total_bytes: int):
        n = cluster.world_size
        self.cluster, self.rate_Bps, self.alpha_s, self.W = cluster, rate_Bps, cluster.latency_s, W
        self.prev_end_s = prev_end_s
        self.nbs = [neighbours(W, i) for i in range(n)] if W is not None else None
        self.total_bytes = total_bytes
        # per worker, when its parameter messages of this step have left its link
        self.sends_end_s = ([max((self.leaves_s(w, i) + self.alpha_s + total_bytes * self.s_per_byte(w, i)
                                  for i in self.nbs[w].send), default=prev_end_s[w]) for w in range(n)]
                            if self.nbs is not None else [0.0] * n)

    def s_per_byte(self, j: int, w: int) -> float:
        return s_per_byte(self.cluster, self.rate_Bps, self.W, j, w)

    def leaves_s(self, j: int, w: int) -> float:
        """When j's messages to w start: gloo sends once w's recv is posted (w's update of the
        step before, its ready-notice a latency away) and j's send is."""
        return max(self.prev_end_s[j], self.prev_end_s[w] + self.alpha_s)

    def landed_s(self, w: int, nbytes: float) -> float:
        """When the first `nbytes` of the exchange have landed at w from every in-neighbour."""
        if self.nbs is None or nbytes == 0:
            return 0.0
        return max((self.leaves_s(j, w) + self.alpha_s + nbytes * self.s_per_byte(j, w) for j, _ in self.nbs[w].recv),
                   default=0.0)

    def busy(self, w: int, slowdown: float) -> Busy:
        """Worker w's contention: compute runs `slowdown` times slower while this step's
        exchange is on the wire, from its first send to its last landing."""
        busy = Busy(slowdown)
        if self.nbs is not None and len(self.prev_end_s) > 1:
            first_s = min([self.leaves_s(j, w) for j, _ in self.nbs[w].recv]
                          + [self.leaves_s(w, i) for i in self.nbs[w].send] + [self.prev_end_s[w]])
            busy.add(first_s, max(self.landed_s(w, self.total_bytes), self.sends_end_s[w]))
        return busy


class TrackerLink:
    """The trackers' exchange of a step (algorithm=tracking): `messages` are the overlapped ones
    (`tracker_messages`; empty: all of them at the update, `overlap_trackers=false`)."""

    def __init__(self, alpha_s: float, tracker_bytes: int, messages: list[tuple[float, int]], backward_time_s: float):
        self.alpha_s, self.tracker_bytes, self.messages = alpha_s, tracker_bytes, messages
        self.backward_time_s = backward_time_s

    def landed_s(self, j: int, w: int, s_per_byte: float, ready_s: list[float], sends_end_s: list[float],
                 backward_s: list[tuple[float, float]]) -> float:
        """When the last of j's trackers of this step lands at w. A gloo send waits for its
        receiver's recv (rendezvous), posted when w reaches the same point; j's link sends its
        parameter messages first (`sends_end_s`). Without overlap both post at their update
        (`ready_s`); with, message by message as each backward (`backward_s`: start, end) makes
        it ready, one after another on j's link."""
        alpha_s = self.alpha_s
        if not self.messages:
            return max(ready_s[j], ready_s[w] + alpha_s, sends_end_s[j]) + alpha_s + self.tracker_bytes * s_per_byte
        (b0, b1), (c0, c1), link_s = backward_s[j], backward_s[w], sends_end_s[j]
        back_s = self.backward_time_s
        scale_j = (b1 - b0) / back_s if back_s > 0 else 0.0
        scale_w = (c1 - c0) / back_s if back_s > 0 else 0.0
        for ready, nbytes in self.messages:
            link_s = max(link_s, b0 + ready * scale_j, c0 + ready * scale_w + alpha_s) + nbytes * s_per_byte
        return link_s + alpha_s

    def wire_s(self, w: int, s_per_byte_to: list[float]) -> float:
        """How long worker w's trackers occupy its link: their bytes at the pace of its flows to
        its out-neighbours (`s_per_byte_to`, one per out-neighbour)."""
        return max((self.tracker_bytes * pb for pb in s_per_byte_to), default=0.0)


def run_compute(busy: Busy, t: float, forward_s: list[float], due_s: list[float], pause_s: float,
                backward_s: float, trackers: tuple[float, float, float] | None = None) -> tuple[float, float, float]:
    """One worker's forward and backward from `t`, through its contention `busy`: module m's
    forward (`forward_s[m]`) once its bytes have landed (`due_s[m]`), then the bench's `pause_s`
    (a sleep: not slowed by transfers), then backward. `trackers` = (compute before the first
    overlapped tracker message is ready, the trackers' wire time, when the link is free of the
    parameter messages): the trackers are on the wire from the later of the last two for their
    wire time, and compute in that span runs slowed too. Returns (backward start, backward end,
    time spent waiting for bytes)."""
    wait_s = 0.0
    for f_s, due in zip(forward_s, due_s):
        if due > t:
            wait_s += due - t
            t = due
        t = busy.advance(t, f_s)
    t += pause_s
    bwd0 = t
    if trackers is None:
        return bwd0, busy.advance(t, backward_s), wait_s
    first_s, wire_s, link_free_s = trackers
    first_s = min(first_s, backward_s)
    t = busy.advance(t, first_s)
    on_wire_s = max(t, link_free_s)
    # the parameter exchange's span is already slowed: the trackers' adds only what lies beyond it
    start_s = max([on_wire_s] + busy.ends[-1:])
    if on_wire_s + wire_s > start_s:
        busy.add(start_s, on_wire_s + wire_s)
    return bwd0, busy.advance(t, backward_s - first_s), wait_s


def job_step_median_s(end_s: list[list[float]], warm: int) -> float:
    """The job-step median in steady state: per step from `warm` on, how far the slowest
    worker's clock (`end_s[w][k]`) advanced; their median."""
    job = [max(e[k] for e in end_s) for k in range(warm, len(end_s[0]))]
    return statistics.median(b - a for a, b in zip(job, job[1:]))


def _jitter_and_pauses_s(profile: ModelProfile, cluster: ClusterSpec, steps: int):
    """Per worker and step, the compute's scale and the pause after the forward (`links`)."""
    n = cluster.world_size
    jit, nominal, unit_s = jitter_spec(cluster, steps)
    if nominal is None:
        return jit, [[0.0] * steps for _ in range(n)]
    # the bench's emulation: compute as profiled, a pause after the forward (in seconds as the
    # bench sleeps it when the cluster says, else scaled from the profiled compute)
    fb_s = profile.forward_time_s + profile.backward_time_s
    units = [unit_s if unit_s is not None else fb_s / w.speed for w in cluster.workers]
    pauses_s = [[max(nominal * d - 1.0, 0.0) * u for d in draws] for draws, u in zip(jit, units)]
    return [[1.0] * steps for _ in range(n)], pauses_s


def simulate_gossip(profile: ModelProfile, cluster: ClusterSpec, options: GossipOptions,
                    iterations: int = 4) -> SimResult:
    n = cluster.world_size
    if not profile.trainable():
        raise CaramelError(f"model {profile.model!r} has no trainable parameters; there is nothing to gossip")
    mats = [mixing_matrix(options.topology, n, t) for t in range(period(options.topology, n))]
    rate_Bps = link_rate_Bps(cluster)
    flow_share(cluster, 1)  # checks meta.push_efficiency whatever the topology and world size
    steps = max(iterations, MIN_ITERATIONS, 8 * (options.head_steps + 1))
    jit, pauses_s = _jitter_and_pauses_s(profile, cluster, steps)
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
    in_forward = not options.mixes_at_update
    tracking = options.tracks and n > 1
    overlapped = tracking and options.overlaps_trackers
    trackers = TrackerLink(cluster.latency_s, priced.trackers,
                           tracker_messages(shared, len(profile.modules), options.tracker_cap_mb * 2 ** 20,
                                            profile.backward_time_s) if overlapped else [],
                           profile.backward_time_s)

    end_s = [[0.0] * steps for _ in range(n)]
    waits_s = [0.0] * n
    events = []
    cycle = options.head_steps + 1  # DePRL: only the last step of each cycle sends (the body)
    ready_s, starts_s, busies = [0.0] * n, [0.0] * n, [Busy(cluster.compute_slowdown) for _ in range(n)]
    backward_s = [(0.0, 0.0)] * n  # per worker, this step's backward (start, end)
    for k in range(steps):
        sent = k > 0 and (k - 1) % cycle == cycle - 1
        links = StepLinks(cluster, rate_Bps, [e[k - 1] for e in end_s] if k else [0.0] * n,
                          mats[((k - 1) // cycle) % len(mats)] if sent else None, total)
        Wk = mats[k % len(mats)]
        for w in range(n):
            t = links.prev_end_s[w]
            scale = jit[w][k] / speed[w]
            busy = links.busy(w, cluster.compute_slowdown)
            due = [links.landed_s(w, need[m]) if in_forward else 0.0 for m in range(len(profile.modules))]
            tracker_span = None
            if overlapped and trackers.messages:
                wire_s = trackers.wire_s(w, [s_per_byte(cluster, rate_Bps, Wk, w, i) for i in neighbours(Wk, w).send])
                tracker_span = (trackers.messages[0][0] * scale, wire_s, links.sends_end_s[w])
            bwd0, t, wait_s = run_compute(busy, t, [mod.forward_time_s * scale for mod in profile.modules], due,
                                          pauses_s[w][k], profile.backward_time_s * scale, tracker_span)
            backward_s[w] = (bwd0, t)
            landed = links.landed_s(w, total)
            if landed > t:
                wait_s += landed - t
                t = landed
            waits_s[w] += wait_s
            ready_s[w], starts_s[w], busies[w] = t, links.prev_end_s[w], busy
        for w in range(n):
            t = ready_s[w]
            if tracking:  # the update waits for the in-neighbours' trackers of this step
                due = max(trackers.landed_s(j, w, s_per_byte(cluster, rate_Bps, Wk, j, w), ready_s, links.sends_end_s,
                                            backward_s) for j, _ in neighbours(Wk, w).recv)
                if due > t:
                    waits_s[w] += due - t
                    t = due
            t = busies[w].advance(t, profile.optimizer_time_s * jit[w][k] / speed[w])
            end_s[w][k] = t
            events.append(TraceEvent(w, "compute", "step", "step", starts_s[w], t - starts_s[w], k))
    warm = steps // 2
    periods = [(e[-1] - e[warm]) / (steps - 1 - warm) for e in end_s]
    step_s = statistics.mean(periods)
    compute_s = max(statistics.mean(jit[w]) * profile.step_time_s / speed[w] + statistics.mean(pauses_s[w])
                    for w in range(n))
    send_s = (max(cluster.latency_s + total * len(neighbours(W, w).send) / rate_Bps[w] for W in mats for w in range(n))
              if n > 1 else 0.0)
    ar = allreduce_step_s(profile, cluster, rate_Bps, jit, sum(p.bytes for p in shared), pauses_s)
    info = describe(options.topology, n)
    name = info["topology"]
    return SimResult(
        step_time_s=step_s, compute_time_s=compute_s, comm_time_s=send_s, exposed_comm_s=max(step_s - compute_s, 0.0),
        wait_time_s=statistics.mean(waits_s) / steps,
        link_utilization=min(send_s / step_s, 1.0) if step_s > 0 else 0.0,
        comm_busy_fraction=min(send_s / step_s, 1.0) if step_s > 0 else 0.0,
        iteration_times_s=[b - a for a, b in zip([0.0] + end_s[0][:-1], end_s[0])],
        critical_path={"bound": "communication" if step_s > compute_s * 1.05 else "compute",
                       "slowest_worker": periods.index(max(periods))},
        planner=f"gossip:{name}", overlap="forward" if in_forward else "backward",
        world_size=n, num_items=len(shared),
        trace=Trace("predicted", n, events, meta={"strategy": "gossip"}),
        meta={"strategy": "gossip", "topology": name, "algorithm": options.algorithm,
              "mixing": info, "bytes_per_peer_per_step": priced.total,
              "tracker_bytes_per_peer_per_step": priced.trackers, "periods_s": periods,
              "job_step_median_s": job_step_median_s(end_s, warm),
              "allreduce": {"step_time_s": ar, "gossip_speedup": ar / step_s if step_s > 0 else None}})


def allreduce_step_s(profile: ModelProfile, cluster: ClusterSpec, rate_Bps: list[float], jit: list[list[float]],
                     nbytes: int, pauses_s: list[list[float]] | None = None) -> float:
    """Mean synchronous step time of ring all-reduce data parallelism under the same links and
    jitter (module docstring): every step waits for the slowest worker (`pauses_s`: each worker's
    sleep after its forward per step, the bench's jitter emulation)."""
    n = cluster.world_size
    speed = [w.speed for w in cluster.workers]
    comm_s = 2 * (n - 1) * cluster.latency_s + 2 * (n - 1) / n * nbytes / min(rate_Bps) if n > 1 else 0.0
    steps = len(jit[0])
    times = []
    for k in range(steps):
        fb = max((profile.forward_time_s + profile.backward_time_s) / speed[w] * jit[w][k]
                 + (pauses_s[w][k] if pauses_s else 0.0) for w in range(n))
        bwd = min(profile.backward_time_s / speed[w] * jit[w][k] for w in range(n))
        opt = max(profile.optimizer_time_s / speed[w] * jit[w][k] for w in range(n))
        times.append(fb + max(comm_s - bwd, 0.0) + opt)
    return statistics.mean(times[steps // 2:])
