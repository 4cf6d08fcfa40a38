"""Coflow workloads: training jobs whose communication is a DAG of coflows, built from plans.

One job runs `steps` training steps on `W` workers, each worker on its own switch port. Every
bucket of the job's Caramel plan is one coflow per step: a ring all-reduce, W flows of
2(W-1)/W times the bucket's bytes, worker i to worker i+1. A coflow of step s depends on every
coflow of step s-1 (the next forward needs the averaged update) and is released `delay_s`
after its dependencies finish: the forward plus the backward up to the bucket's ready time.
`synthetic_trace` draws a seeded mix of such jobs (models, worker counts, arrivals, weights).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from caramel.errors import CaramelError
from caramel.plan.plan import Plan
from caramel.plan.planners import plan_fifo
from caramel.profile.model_profile import ModelProfile
from caramel.sim.synthetic import synthetic_profile

GBPS = 1e9 / 8  # bytes per second in one Gb/s


@dataclass(frozen=True)
class Flow:
    src: int  # sending port
    dst: int  # receiving port
    bytes: float


@dataclass(frozen=True)
class Coflow:
    """One bucket's all-reduce in one step of one job."""

    id: int
    job: int
    step: int
    bucket: int
    flows: tuple[Flow, ...]
    deps: tuple[int, ...]  # coflow ids that must finish first
    delay_s: float  # from the last dependency's finish (or the job's arrival) to the release

    @property
    def bytes(self) -> float:
        return sum(f.bytes for f in self.flows)


@dataclass(frozen=True)
class Job:
    id: int
    weight: float
    arrival_s: float
    ports: tuple[int, ...]
    coflows: tuple[int, ...]  # ids, in step then bucket order
    model: str = ""


@dataclass(frozen=True)
class Workload:
    """Jobs and their coflows on one non-blocking switch of `num_ports` ports, each port able to
    send and receive `port_bandwidth_Bps` bytes per second at once."""

    num_ports: int
    port_bandwidth_Bps: float
    jobs: tuple[Job, ...]
    coflows: tuple[Coflow, ...]

    def __post_init__(self) -> None:
        if self.num_ports < 2 or self.port_bandwidth_Bps <= 0:
            raise CaramelError(f"a workload needs >= 2 ports and a positive bandwidth, got {self.num_ports} "
                               f"ports at {self.port_bandwidth_Bps} B/s")
        for i, c in enumerate(self.coflows):
            if c.id != i:
                raise CaramelError(f"coflow {i} has id {c.id}; ids must be 0..n-1 in order")
            if any(d >= c.id or d < 0 for d in c.deps):
                raise CaramelError(f"coflow {c.id} depends on {c.deps}; a dependency must come earlier")
            if not c.flows or any(not (0 <= f.src < self.num_ports and 0 <= f.dst < self.num_ports)
                                  or f.src == f.dst or f.bytes <= 0 for f in c.flows):
                raise CaramelError(f"coflow {c.id} needs flows between distinct ports 0..{self.num_ports - 1} "
                                   f"with positive bytes")
            if c.delay_s < 0:
                raise CaramelError(f"coflow {c.id} has a negative delay_s {c.delay_s}")


def job_from_plan(plan: Plan, profile: ModelProfile, ports: list[int], *, steps: int, job_id: int,
                  first_coflow_id: int, arrival_s: float = 0.0, weight: float = 1.0) -> tuple[Job, list[Coflow]]:
    """The coflow DAG of `steps` steps of `plan` run on workers at `ports` (one ring all-reduce
    per bucket per step; see the module docstring)."""
    w = len(ports)
    if w < 2 or len(set(ports)) != w:
        raise CaramelError(f"a job needs >= 2 workers on distinct ports, got ports {ports}")
    if steps < 1:
        raise CaramelError(f"steps must be >= 1, got {steps}")
    coflows: list[Coflow] = []
    prev: tuple[int, ...] = ()
    for s in range(steps):
        ids = []
        for b in plan.buckets:
            ready = b.ready_time_s if b.ready_time_s is not None else profile.backward_time_s
            per_flow = 2 * (w - 1) / w * b.bytes
            flows = tuple(Flow(ports[i], ports[(i + 1) % w], per_flow) for i in range(w))
            cid = first_coflow_id + len(coflows)
            coflows.append(Coflow(cid, job_id, s, b.id, flows, prev, profile.forward_time_s + ready))
            ids.append(cid)
        prev = tuple(ids)
    job = Job(job_id, float(weight), float(arrival_s), tuple(ports), tuple(c.id for c in coflows), profile.model)
    return job, coflows


@dataclass(frozen=True)
class TraceOptions:
    """The synthetic trace generator's knobs (`num_jobs=12,num_ports=8` on the command line)."""

    num_jobs: int = 10
    num_ports: int = 8
    port_bandwidth_gbps: float = 10.0
    max_workers: int = 4  # each job draws 2..max_workers workers
    max_steps: int = 3  # each job draws 1..max_steps steps
    mean_interarrival_s: float = 0.02  # Poisson arrivals
    max_layers: int = 12  # each model draws 3..max_layers layers
    compute_to_comm: float = 0.5  # a job's mean compute time over its all-reduce time alone

    def __post_init__(self) -> None:
        if self.num_jobs < 1:
            raise ValueError(f"num_jobs must be >= 1, got {self.num_jobs}")
        if not 2 <= self.max_workers <= self.num_ports:
            raise ValueError(f"max_workers must be between 2 and num_ports ({self.num_ports}), got {self.max_workers}")
        if self.max_steps < 1 or self.max_layers < 3:
            raise ValueError(f"max_steps must be >= 1 and max_layers >= 3, got {self.max_steps}, {self.max_layers}")
        if self.port_bandwidth_gbps <= 0 or self.mean_interarrival_s < 0 or self.compute_to_comm < 0:
            raise ValueError("port_bandwidth_gbps must be > 0, mean_interarrival_s and compute_to_comm >= 0")


WEIGHTS = (1.0, 2.0, 4.0)
BUCKET_CAPS_MB = (1.0, 4.0, 25.0)


def synthetic_trace(options: TraceOptions, seed: int) -> Workload:
    """A seeded mix of jobs: chain models of 3..max_layers layers of 32 KiB..8 MiB (log-uniform),
    each planned by DDP's `fifo` planner with a drawn bucket cap, placed on distinct random
    ports, arriving as a Poisson process with a weight of 1, 2 or 4."""
    rng = np.random.default_rng(seed)
    bandwidth = options.port_bandwidth_gbps * GBPS
    jobs: list[Job] = []
    coflows: list[Coflow] = []
    arrival = 0.0
    for j in range(options.num_jobs):
        n_layers = int(rng.integers(3, options.max_layers + 1))
        sizes = [int(4 * round(np.exp(rng.uniform(np.log(8192), np.log(2 * 1024 * 1024))))) for _ in range(n_layers)]
        w = int(rng.integers(2, options.max_workers + 1))
        comm_s = 2 * (w - 1) / w * sum(sizes) / bandwidth
        compute_s = comm_s * options.compute_to_comm * float(rng.uniform(0.5, 1.5))
        profile = synthetic_profile(sizes_bytes=sizes, forward_time_s=compute_s / 3, backward_time_s=2 * compute_s / 3,
                                    optimizer_time_s=0.0, name=f"job{j}")
        plan = plan_fifo(profile, world_size=w, bucket_cap_mb=float(rng.choice(BUCKET_CAPS_MB)), first_bucket_mb=1.0)
        ports = [int(p) for p in rng.choice(options.num_ports, size=w, replace=False)]
        job, cs = job_from_plan(plan, profile, ports, steps=int(rng.integers(1, options.max_steps + 1)), job_id=j,
                                first_coflow_id=len(coflows), arrival_s=arrival, weight=float(rng.choice(WEIGHTS)))
        jobs.append(job)
        coflows.extend(cs)
        arrival += float(rng.exponential(options.mean_interarrival_s)) if options.mean_interarrival_s > 0 else 0.0
    return Workload(options.num_ports, bandwidth, tuple(jobs), tuple(coflows))
