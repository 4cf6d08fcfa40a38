"""Online profiling inside the user's first steps, and the cluster the job measures.

While no profile is given, the engine runs a provisional DDP-like plan (reverse registration
order, updates at `step()`) and `OnlineProfiler` watches the user's own steps: step 1 records
which module uses which parameter and the forward's module order (step 0); step 1 runs with
the weight gradients of every layer a plan may defer computed apart, each timed and its kept
bytes counted (`caramel.profile.split_backward`, through the engine so the gradients still
reach the buckets); steps 2 .. 1 + profile_steps time forward, backward, each gradient's ready
time and the optimizer. The provisional plan's
collectives are timed too (`Engine.start_measuring`), so that without a cluster spec from the
user the plan is made for the link they show (`measured_cluster`): the latency of tiny
all-reduces on an idle link, of back-to-back pieces on a busy one, the CPU time each costs,
and the bandwidth the profiling steps achieved, agreed on every rank.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import collective_device
from caramel.profile.model_profile import ModelProfile, ParamInfo
from caramel.profile.profiler import (InputSizes, StepSample, StepTimer, UseTracker, add_split_backward,
                                      build_profile, deferrable_modules, dtype_name)
from caramel.runtime.engine import Engine
from caramel.strategies.rank_failure import RankFailedError, gather_failures, run_local
from caramel.topology.spec import ClusterSpec

LATENCY_PROBES = 8  # tiny all-reduces timed after the profiling steps (see measure_latency_s)


class OnlineProfiler:
    """The profiling steps' hooks and timers; `step_end()` returns the profile once complete."""

    def __init__(self, engine: Engine, model: nn.Module, params: list[nn.Parameter], rank: int, profile_steps: int,
                 measure_split: bool = True):
        self.engine, self.model, self.params, self.rank = engine, model, params, rank
        self.profile_steps = profile_steps
        self.measure_split = measure_split
        self._split_on = False
        self._weight_s: dict[nn.Module, float] = {}
        self._kept: dict[nn.Module, int] = {}
        self._input_bytes: dict[str, int] = {}
        self._input_sizes: InputSizes | None = None
        self._sizes_taken = False
        self.phase_step = 0
        self.tracker: UseTracker | None = None
        self.timer: StepTimer | None = None
        self._t_bwd_end: float | None = None
        self._wait_at_bwd_end_s = 0.0
        engine.start_measuring()
        engine.add_listeners(grad_ready=self._grad_ready, backward_end=self._bwd_end, rows_ready=self._rows_ready)

    def forward_pre(self) -> None:
        """Root forward starts (training forwards only)."""
        if self.phase_step == 0 and self.tracker is None:
            self.tracker = UseTracker(self.model, self.params)
            self.tracker.__enter__()
        elif self._split_on and self._input_sizes is None and not self._sizes_taken:
            self._input_sizes = InputSizes(self.model, self._input_bytes)
        elif self.phase_step >= 2 and self.timer is not None and self.timer.cur is None:
            self.timer.forward_start()

    def forward_post(self) -> None:
        if self.tracker is not None and self.tracker._mode is not None and self.phase_step == 0:
            self.tracker.__exit__(None, None, None)
            self.tracker._mode = None
        elif self._input_sizes is not None:
            # one forward's sizes; left installed, this branch would shadow the timer's below
            # at every later step (its forward never ended, its backward never started)
            self._input_sizes.remove()
            self._input_sizes = None
            self._sizes_taken = True
        elif self.timer is not None and self.timer.cur is not None:
            self.timer.backward_start()

    def _grad_ready(self, idx: int) -> None:
        if self.timer is not None:
            self.timer.grad_ready(idx)

    def _rows_ready(self, idx: int) -> None:
        if self.timer is not None:
            self.timer.rows_ready(idx)

    def _bwd_end(self) -> None:
        if self.timer is not None and self.timer.cur is not None:
            self.timer.backward_end()
        self._t_bwd_end = time.perf_counter()
        self._wait_at_bwd_end_s = self.engine.wait_this_step_s

    def ends_this_step(self) -> bool:
        """Whether the next `step_end()` builds the profile (the same step on every rank)."""
        return self.phase_step + 1 >= 2 + self.profile_steps

    def step_end(self) -> ModelProfile | None:
        """After each profiling step; the profile after the last one (the listeners are gone then)."""
        if self.timer is not None and self.timer.cur is not None:
            # the optimizer's own time: step() first waits for this step's collectives (the
            # provisional plan applies at step()), and that wait is communication, which the
            # simulator models itself; counted as compute it made every plan's apply cost
            # the whole exposed communication
            now = time.perf_counter()
            elapsed_s = now - (self._t_bwd_end if self._t_bwd_end is not None else now)
            waited_s = self.engine.stats.last_wait_s - self._wait_at_bwd_end_s
            self.timer.step_end(max(0.0, elapsed_s - waited_s))
        self.phase_step += 1
        if self.phase_step == 1:
            self._start_split()
        if self.phase_step == 2 and self._split_on:
            self._weight_s, self._kept = self.engine.deferred_timings()
            self.engine.set_compute_schedule([])
            self._split_on = False
        if self.phase_step == 2:
            assert self.tracker is not None
            self.timer = StepTimer(self.model, self.tracker.module_order)
        if self.phase_step < 2 + self.profile_steps:
            return None
        self.detach()
        self.timer.remove()
        profile = build_profile(type(self.model).__name__, 0, self.model, self.tracker, self.timer.samples,
                                meta={"online": True, "rank": self.rank})
        add_split_backward(profile, self.model, self._weight_s, self._kept, self._input_bytes)
        return profile

    def _start_split(self) -> None:
        # the next step computes the deferrable weight gradients apart, each timed
        if self.measure_split:
            names = deferrable_modules(self.model, self.params, self.tracker)
            if names:
                self.engine.set_compute_schedule(names, timed=True)
                self._split_on = True

    def carried(self) -> dict[str, Any]:
        """What this rank has measured so far, as plain values, between two steps (a checkpoint's
        `profiling_state`): the phase, the module uses, the split timings, the timed steps and
        the collectives timed."""
        t = self.tracker
        name_of = {m: n for n, m in self.model.named_modules()}
        return {"phase_step": self.phase_step,
                "first_use": [[i, m, s] for i, (m, s) in t.first_use.items()] if t is not None else None,
                "use_modules": [[i, list(ms)] for i, ms in t.use_modules.items()] if t is not None else None,
                "module_order": list(t.module_order) if t is not None else None,
                "weight_s": {name_of[m]: s for m, s in self._weight_s.items() if m in name_of},
                "kept": {name_of[m]: b for m, b in self._kept.items() if m in name_of},
                "input_bytes": dict(self._input_bytes), "sizes_taken": self._sizes_taken,
                "samples": [dataclasses.asdict(x) for x in self.timer.samples] if self.timer is not None else [],
                "log": [list(e) for e in self.engine.measured_log()]}

    def resume_from(self, state: dict[str, Any]) -> None:
        """Go on from `carried()` of another process (this profiler fresh, no step run yet): the
        next step is the one the saving run would have run next."""
        self.phase_step = int(state["phase_step"])
        if state["module_order"] is not None:
            t = UseTracker(self.model, self.params)
            t.first_use = {int(i): (str(m), float(s)) for i, m, s in state["first_use"]}
            t.use_modules = {int(i): [str(m) for m in ms] for i, ms in state["use_modules"]}
            t.module_order = [str(m) for m in state["module_order"]]
            self.tracker = t
        named = dict(self.model.named_modules())
        self._weight_s = {named[n]: float(v) for n, v in state["weight_s"].items()}
        self._kept = {named[n]: int(v) for n, v in state["kept"].items()}
        self._input_bytes.clear()  # the object InputSizes fills
        self._input_bytes.update({str(k): int(v) for k, v in state["input_bytes"].items()})
        self._sizes_taken = bool(state["sizes_taken"])
        if self.phase_step == 1:
            self._start_split()
        if self.phase_step >= 2:
            self.timer = StepTimer(self.model, self.tracker.module_order)
            self.timer.samples = [StepSample(float(x["forward_s"]), float(x["backward_s"]), float(x["optimizer_s"]),
                                             {str(k): float(v) for k, v in x["module_start_s"].items()},
                                             {int(k): float(v) for k, v in x["ready_s"].items()},
                                             {int(k): float(v) for k, v in x["rows_ready_s"].items()})
                                  for x in state["samples"]]
        self.engine.carry_measured_log([(float(i), float(d), int(n)) for i, d, n in state["log"]])

    def detach(self) -> None:
        """The engine's callbacks removed (collectives are still timed until `stop`)."""
        self.engine.remove_listeners(grad_ready=self._grad_ready, backward_end=self._bwd_end, rows_ready=True)

    def stop(self) -> None:
        """Stop timing the collectives (after `measured_cluster` has read them)."""
        self.engine.stop_measuring()


def profiling_step_end(profiler: OnlineProfiler, group, world: int, rank: int) -> ModelProfile | None:
    """`profiler.step_end()` on every rank, where a profile one rank could not build raises on
    every rank: at the build step (`ends_this_step`, alike everywhere) the ranks gather the
    failures before the cluster's measurements, whose collectives would otherwise leave the
    others waiting until the group's timeout (`rank_failure`)."""
    if world > 1 and profiler.ends_this_step():
        profile = run_local(profiler.step_end, "could not build its profile")
        try:
            gather_failures("profiling", profile, group, world, rank)
        except RankFailedError:
            profiler.stop()
            raise
        return profile
    profile = profiler.step_end()
    if world > 1 and profile is not None:  # built without the gather: a failure here would hang
        raise AssertionError("profile built at a step where ends_this_step() was False")
    return profile


def module_uses(profile: ModelProfile) -> dict[str, list[int]]:
    """Module name -> indices of the parameters it uses, from a profile."""
    uses: dict[str, list[int]] = {}
    for p in profile.params:
        for m in p.use_modules:
            uses.setdefault(m, []).append(p.index)
    return uses


def registration_profile(names: list[str], params: list[nn.Parameter]) -> ModelProfile:
    """A timing-free profile: planners fall back to reverse registration order (DDP's first guess)."""
    infos = [ParamInfo(i, n, list(p.shape), dtype_name(p.dtype), p.numel(), p.numel() * p.element_size(), p.requires_grad)
             for i, (n, p) in enumerate(zip(names, params))]
    return ModelProfile("provisional", 0, 0.0, 0.0, 0.0, infos, [])


def default_cluster(world: int) -> ClusterSpec:
    try:
        from caramel.strategies.caramel.planner import default_cluster as planner_default
        return planner_default(world)
    except ImportError:
        return ClusterSpec.uniform(world, 1e9)


def measured_cluster(engine: Engine, group, world: int) -> ClusterSpec:
    """The default cluster with the per-collective latencies and the bandwidth this job shows:
    tiny all-reduces on the engine's own group for the latency on an idle link, the profiling
    steps' collectives for the bandwidth, then back-to-back pieces for the latency of a queued
    collective (`measure_queued_latency_s`). The slowest rank's latencies, the best rank's
    bandwidth: one all-reduce each, on every rank at the same step."""
    from caramel.topology.probe import host_core_share

    base = default_cluster(world)
    latency_s, lone_cpu_s = measure_latency_s(engine, group, world)
    # every collective at the lone latency, only to size the queued probe (the same on every rank)
    rough_bps = agreed_bps(engine.measured_bandwidth_bps(latency_s, clear=False), group, world)
    queued_s, cpu_s = measure_queued_latency_s(engine, group, world, latency_s, rough_bps or base.bandwidth_bps)
    if cpu_s is None:  # no queued probe: each tiny probe's CPU time
        cpu_s = lone_cpu_s
    measured_bps = agreed_bps(engine.measured_bandwidth_bps(latency_s, queued_s), group, world)
    engine.stats.note(measured_latency_s=latency_s, measured_queued_latency_s=queued_s)
    # a collective's CPU time slows the model's compute only when both run on the CPU, and
    # where ranks share cores, every one of them by that CPU time times the share (asked
    # on every rank alike: it is a collective, and devices may differ between ranks)
    on_cpu = all(p.device.type == "cpu" for p in engine.params)
    share = host_core_share(group)
    engine.stats.note(measured_collective_cpu_s=cpu_s, measured_core_share=share)
    meta = dict(base.meta, measured="profiling steps", latency_probes=LATENCY_PROBES, core_share=share)
    base = dataclasses.replace(base, latency_s=latency_s, queued_latency_s=queued_s, meta=meta,
                               collective_cpu_s=cpu_s * share if on_cpu else 0.0)
    if measured_bps <= 0:
        return base
    engine.stats.note(measured_bandwidth_bps=measured_bps)
    return dataclasses.replace(base, bandwidth_bps=measured_bps)


def agreed_bps(bandwidth_bps: float | None, group, world: int) -> float:
    """The best rank's bandwidth (0 when no rank could tell), the same on every rank."""
    t = torch.tensor([int(bandwidth_bps // 1000) if bandwidth_bps else 0], dtype=torch.int64)
    if world > 1:
        t = t.to(collective_device(group))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t[0]) * 1000


def _engine_device(engine: Engine) -> torch.device:
    return engine.params[0].device if engine.params else torch.device("cpu")


def measure_latency_s(engine: Engine, group, world: int) -> tuple[float, float]:
    """Per-step latency alpha of the ring model on an idle link: the mean time of
    `LATENCY_PROBES` tiny all-reduces on the engine's group, over the 2(n-1) steps of a
    ring; and the process CPU time each took (the slowest rank's of both). The mean, not the
    fastest: a plan pays each collective's typical cost, and on a virtual machine whose idle
    CPUs halt that includes waking the backend's thread (0.4 ms at best, 2-4 ms in half of
    the tries on the 2-core test host, where the default assumes 50 us)."""
    assert world > 1, "one process plans without profiling: no collectives to time"
    device = _engine_device(engine)
    buf = torch.zeros(256, device=device)

    def one() -> None:
        engine.comm.allreduce([buf]).wait()
        if device.type == "cuda":  # an NCCL wait only orders streams: time the GPU's completion
            torch.cuda.synchronize(device)

    one()  # the first may still be connecting
    times = []
    c0 = time.process_time()
    for _ in range(LATENCY_PROBES):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    cpu_s = (time.process_time() - c0) / LATENCY_PROBES
    mean = torch.tensor([sum(times) / len(times), cpu_s], dtype=torch.float64).to(collective_device(group))
    dist.all_reduce(mean, op=dist.ReduceOp.MAX, group=group)
    return float(mean[0]) / (2 * (world - 1)), max(float(mean[1]), 0.0)


def measure_queued_latency_s(engine: Engine, group, world: int, latency_s: float,
                             bandwidth_bps: float) -> tuple[float | None, float | None]:
    """Per-step latency of a collective issued while the link is still busy with the one
    before it, at most `latency_s`, and the CPU time each collective costs a worker
    (`caramel.topology.probe.measure_queued_extra` on the engine's group, pieces sized for
    `bandwidth_bps`, the same on every rank; the slowest rank's of each); (None, None) when no
    piece of a sensible size takes long enough to tell (a link so fast that every collective
    pays its whole latency), or on CUDA tensors (the probe times the host's view of a gloo
    group). A plan's back-to-back buckets cost far less time each than a lone collective, but
    not less CPU; the probe takes about 320 lone collectives' time."""
    from caramel.topology.probe import measure_queued_extra, queued_latency_from_extra_s, queued_piece_bytes

    if _engine_device(engine).type != "cpu":
        return None, None
    piece = queued_piece_bytes(latency_s, bandwidth_bps, world)
    if piece is None:
        return None, None
    m = measure_queued_extra(engine.comm, piece)
    t = torch.tensor([m.extra_s, m.cpu_s], dtype=torch.float64).to(collective_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    engine.stats.note(measured_queued_extra_s=float(t[0]))
    return queued_latency_from_extra_s(float(t[0]), latency_s, world), max(float(t[1]), 0.0)
