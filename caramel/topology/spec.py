"""`ClusterSpec`: the workers and the network a plan runs on, for the planner and the simulator.

Latency (alpha, seconds per message) and bandwidth (beta, bits per second per worker link)
are either fitted from a probe of real all-reduces (`caramel cluster probe`) or written by
hand for what-if questions.

A collective's fixed cost depends on what the link did just before. On an idle link it pays the
whole message latency (`latency_s`: waking the backend's thread and the peers', one round trip
per step). Queued behind a collective whose bytes are still draining, it spends that cost while
the link is busy anyway: it pays `latency_s` less the previous transfer's time, but at least
`queued_latency_s` (docs/results/notes.md, "Queued latency"). `queued_latency_s=None` means the
same as `latency_s`: every collective pays the whole latency.

A collective also costs CPU time on each worker: the backend's threads and the kernel's network
stack run on the cores the model computes on unless the host has cores to spare.
`collective_cpu_s` is that cost per collective beyond its bytes', as the pause it makes in a
running compute: the extra CPU time of sending the same bytes as one more collective, times the
ranks per core where ranks share cores (`caramel.topology.probe.host_core_share`: on shared
cores every rank waits for the CPU any of them spends). The simulator charges it to the
compute a collective's start interrupts (`caramel.sim.event_loop`); on a small host it is of
the order of a millisecond (docs/results/engine.md, "Each collective's CPU time"). 0 (the
default): collectives cost compute nothing.

Beyond that fixed pause, the bytes themselves cost CPU while they move: `compute_slowdown` is how
many times slower compute runs while a collective is in flight (1, the default: not at all). The
bench measures it per configuration from its concurrent baseline (`caramel.bench.contention`);
the simulator's event engine slows compute by it through every collective's interval.

Workers' `speed`s are their pace with every worker computing at once, as data parallelism runs
(and the bench measures). Where several workers share a host's cores (`ranks_per_host`), one
computing while the others wait runs faster: `alone_speedup` times (measured by profiling in
turns, `caramel.profile.turns`). Only the pipeline simulator reads these two
(`caramel.strategies.pipeline.sharing`); 1 and 1 (the defaults): no sharing. `alone_speedup`
above 1 needs `ranks_per_host` above 1 (a worker alone on its host has nobody to wait for).
`sharing_model` says how the pipeline simulator spreads that sharing over a layout's ranks
(`SHARING_MODELS`): "layout" (the default, and every spec written before the field), one factor
for every rank from the layout's mean load; "stage", each stage's ranks their own, from the load
while that stage computes.
`reduce_cpu` says whether the pipeline simulator charges the replicas' bucket all-reduces the
CPU of their messages on the action that issues them (`REDUCE_CPU_MODELS`): "none" (the default,
and every spec written before the field), or "messages" (each bucket `collective_cpu_s (r - 1) /
(n - 1)` on the stage's last backward; docs/pipeline.md).
`reduce_buckets` says which buckets the pipeline simulator reduces a replicated stage in
(`REDUCE_BUCKETS_MODELS`): "layers" (the default, and every spec written before the field), one
per profile layer that holds parameters; "planner", the buckets, chunks and order Caramel's
planner makes for that stage, as the runtime's engine plans them
(`caramel.strategies.pipeline.planner_buckets`).

Format: a spec with sharing is written `caramel.cluster/2`, so that a reader from before these
fields refuses it rather than predicting without the sharing; one with sharing and
`sharing_model="stage"` `caramel.cluster/3` (a version-2 reader would price it with one factor;
without sharing both models predict alike, so the field is left out); any other spec is
written `caramel.cluster/1`, as before, without the `sharing_model` field; one with
`reduce_cpu="messages"` `caramel.cluster/4` (an older reader would predict without the charge),
the field left out where it is "none"; one with `reduce_buckets="planner"` `caramel.cluster/5`,
the field left out where it is "layers". All read here, and unknown fields are errors either way.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from caramel.errors import FormatError
from caramel.jsonio import check_format, from_fields, read_json, require, require_mapping, write_json

KIND = "cluster"
VERSIONS = (1, 2, 3, 4, 5)  # 2: host sharing (alone_speedup, ranks_per_host); 3: sharing_model "stage"; 4: reduce_cpu;
# 5: reduce_buckets
# fields `to_dict` writes only from the version that brought them (host sharing's two are written,
# at their defaults, in every version, so they are not checked)
NEWER_FIELDS = {"sharing_model": 3, "reduce_cpu": 4, "reduce_buckets": 5}
SHARING_MODELS = ("layout", "stage")  # how the pipeline simulator spreads host sharing (see above)
REDUCE_CPU_MODELS = ("none", "messages")  # the replicas' buckets' CPU in the pipeline simulator (see above)
REDUCE_BUCKETS_MODELS = ("layers", "planner")  # the replicas' buckets in the pipeline simulator (see above)
TOPOLOGIES = ("switch", "ring", "torus", "fully_connected")
COLLECTIVES = ("ring", "tree", "halving_doubling", "ps", "gossip")


@dataclass
class WorkerSpec:
    """One worker. `speed` is relative compute speed: 0.5 takes twice as long as the profile says."""

    name: str
    speed: float = 1.0


@dataclass
class ClusterSpec:
    """Workers, link bandwidth and latency, topology and collective algorithm."""

    workers: list[WorkerSpec]
    bandwidth_bps: float
    latency_s: float = 50e-6
    topology: str = "switch"
    collective: str = "ring"
    num_servers: int = 1  # parameter servers, for collective="ps"
    meta: dict[str, Any] = field(default_factory=dict)
    queued_latency_s: float | None = None  # per message, the least a collective queued behind another pays
    collective_cpu_s: float = 0.0  # pause per collective in each worker's compute, beyond its bytes' (see above)
    compute_slowdown: float = 1.0  # compute runs this many times slower while a collective is in flight
    alone_speedup: float = 1.0  # a worker computes this many times faster alone than with its host's ranks all at once
    ranks_per_host: int = 1  # workers sharing one host's cores (1: a machine each)
    sharing_model: str = "layout"  # one sharing factor per layout, or per stage ("stage"; see above)
    reduce_cpu: str = "none"  # the replicas' buckets' message CPU on their last backward ("messages"; see above)
    reduce_buckets: str = "layers"  # the replicas' buckets in the pipeline simulator ("planner"; see above)

    @property
    def effective_queued_latency_s(self) -> float:
        """The least latency a collective queued behind another pays (see the module docstring):
        `queued_latency_s`, never more than `latency_s` (a queued collective never pays more than
        a lone one; `latency_s` when None)."""
        return self.latency_s if self.queued_latency_s is None else min(self.queued_latency_s, self.latency_s)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def world_size(self) -> int:
        return len(self.workers)

    @classmethod
    def uniform(cls, workers: int, bandwidth_bps: float, latency_s: float = 50e-6, **kw: Any) -> "ClusterSpec":
        """`workers` identical workers on links of `bandwidth_bps`."""
        if not isinstance(workers, int) or workers < 1:
            raise FormatError(f"workers must be a positive integer, got {workers!r}")
        return cls([WorkerSpec(f"w{i}") for i in range(workers)], bandwidth_bps, latency_s, **kw)

    def validate(self, source: str = "cluster spec") -> None:
        if not self.workers:
            raise FormatError(f"{source}: field 'workers' must list at least one worker")
        for i, w in enumerate(self.workers):
            if not (isinstance(w.speed, (int, float)) and math.isfinite(w.speed) and w.speed > 0):
                raise FormatError(f"{source}: workers[{i}].speed must be a positive number, got {w.speed!r}")
        if not (isinstance(self.bandwidth_bps, (int, float)) and math.isfinite(self.bandwidth_bps) and self.bandwidth_bps > 0):
            raise FormatError(f"{source}: field 'bandwidth_bps' must be a positive number of bits per second, got {self.bandwidth_bps!r}")
        if not (isinstance(self.latency_s, (int, float)) and math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise FormatError(f"{source}: field 'latency_s' must be a number >= 0, got {self.latency_s!r}")
        q = self.queued_latency_s
        if q is not None and not (isinstance(q, (int, float)) and not isinstance(q, bool) and math.isfinite(q) and q >= 0):
            raise FormatError(f"{source}: field 'queued_latency_s' must be a number >= 0 or null (the same as latency_s), got {q!r}")
        c = self.collective_cpu_s
        if isinstance(c, bool) or not (isinstance(c, (int, float)) and math.isfinite(c) and c >= 0):
            raise FormatError(f"{source}: field 'collective_cpu_s' must be a number of seconds >= 0, got {c!r}")
        f = self.compute_slowdown
        if isinstance(f, bool) or not (isinstance(f, (int, float)) and math.isfinite(f) and f >= 1):
            raise FormatError(f"{source}: field 'compute_slowdown' must be a factor >= 1 (1: collectives do not "
                              f"slow compute), got {f!r}")
        a = self.alone_speedup
        if isinstance(a, bool) or not (isinstance(a, (int, float)) and math.isfinite(a) and a >= 1):
            raise FormatError(f"{source}: field 'alone_speedup' must be a factor >= 1 (1: workers do not share "
                              f"cores), got {a!r}")
        if isinstance(self.ranks_per_host, bool) or not isinstance(self.ranks_per_host, int) or self.ranks_per_host < 1:
            raise FormatError(f"{source}: field 'ranks_per_host' must be a positive integer, got {self.ranks_per_host!r}")
        if self.alone_speedup > 1 and self.ranks_per_host == 1:
            raise FormatError(f"{source}: field 'alone_speedup' is {self.alone_speedup!r} but 'ranks_per_host' is 1: "
                              f"a worker alone on its host computes at its speed already; set 'ranks_per_host' to "
                              f"the workers sharing a host, or 'alone_speedup' to 1")
        if self.ranks_per_host > len(self.workers):
            # more ranks per host than workers would leave the others permanently idle: the
            # full alone_speedup even with every worker computing at once
            raise FormatError(f"{source}: field 'ranks_per_host' must be between 1 and the number of workers "
                              f"({len(self.workers)}), got {self.ranks_per_host}")
        if self.sharing_model not in SHARING_MODELS:
            raise FormatError(f"{source}: field 'sharing_model' must be one of {', '.join(SHARING_MODELS)}, "
                              f"got {self.sharing_model!r}")
        if self.reduce_cpu not in REDUCE_CPU_MODELS:
            raise FormatError(f"{source}: field 'reduce_cpu' must be one of {', '.join(REDUCE_CPU_MODELS)}, "
                              f"got {self.reduce_cpu!r}")
        if self.reduce_buckets not in REDUCE_BUCKETS_MODELS:
            raise FormatError(f"{source}: field 'reduce_buckets' must be one of {', '.join(REDUCE_BUCKETS_MODELS)}, "
                              f"got {self.reduce_buckets!r}")
        if self.topology not in TOPOLOGIES:
            raise FormatError(f"{source}: unknown topology {self.topology!r}; expected one of {', '.join(TOPOLOGIES)}")
        if self.collective not in COLLECTIVES:
            raise FormatError(f"{source}: unknown collective {self.collective!r}; expected one of {', '.join(COLLECTIVES)}")
        if not isinstance(self.num_servers, int) or self.num_servers < 1:
            raise FormatError(f"{source}: field 'num_servers' must be a positive integer, got {self.num_servers!r}")

    def sharing_on(self, workers: int) -> dict[str, Any]:
        """This spec's sharing fields for `workers` workers (a spec resized): at most that many
        ranks per host, and no sharing left where that is 1; the same sharing model."""
        per_host = min(self.ranks_per_host, workers)
        return {"ranks_per_host": per_host, "alone_speedup": self.alone_speedup if per_host > 1 else 1.0,
                "sharing_model": self.sharing_model}

    def shares_hosts(self) -> bool:
        """Whether the spec carries host sharing, which a version-1 reader would drop."""
        return self.alone_speedup != 1 or self.ranks_per_host != 1

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON, at the lowest version that holds it: the sharing model only where it
        can change a prediction (host sharing carried, not "layout"); without host sharing both
        models predict alike, so the field is left out (read back as "layout") and older readers
        still read the file."""
        d = asdict(self)
        per_stage = self.shares_hosts() and self.sharing_model != "layout"
        if not per_stage:  # written as before the field
            del d["sharing_model"]
        if self.reduce_cpu == "none":  # written as before the field
            del d["reduce_cpu"]
        if self.reduce_buckets == "layers":  # written as before the field
            del d["reduce_buckets"]
        version = (5 if self.reduce_buckets != "layers" else 4 if self.reduce_cpu != "none" else 3 if per_stage
                   else 2 if self.shares_hosts() else 1)
        d["format"] = f"caramel.{KIND}/{version}"
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<cluster>") -> "ClusterSpec":
        check_format(data, KIND, source, VERSIONS)
        known = {f.name for f in fields(cls)} | {"format"}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            raise FormatError(f"{source} has an unknown field {unknown[0]!r}; expected among {', '.join(sorted(known))}")
        version = int(data["format"].rsplit("/", 1)[1])
        for name, since in NEWER_FIELDS.items():  # a reader of the declared version would drop it: mislabelled
            if name in data and version < since:
                raise FormatError(f"{source}: field {name!r} is new in {KIND}/{since}, but the file says "
                                  f"{data['format']!r}; write it with format \"caramel.{KIND}/{since}\" or later")
        raw = require(data, "workers", list, source)
        workers = [from_fields(WorkerSpec, w, f"{source}: workers[{i}]") for i, w in enumerate(raw)]
        spec = cls.__new__(cls)
        spec.workers = workers
        spec.bandwidth_bps = require(data, "bandwidth_bps", (int, float), source)
        spec.latency_s = data.get("latency_s", 50e-6)
        spec.topology = data.get("topology", "switch")
        spec.collective = data.get("collective", "ring")
        spec.num_servers = data.get("num_servers", 1)
        spec.meta = require_mapping(data, "meta", source)
        spec.queued_latency_s = data.get("queued_latency_s")
        spec.collective_cpu_s = data.get("collective_cpu_s", 0.0)
        spec.compute_slowdown = data.get("compute_slowdown", 1.0)
        spec.alone_speedup = data.get("alone_speedup", 1.0)
        spec.ranks_per_host = data.get("ranks_per_host", 1)
        spec.sharing_model = data.get("sharing_model", "layout")
        spec.reduce_cpu = data.get("reduce_cpu", "none")
        spec.reduce_buckets = data.get("reduce_buckets", "layers")
        spec.validate(source)
        return spec

    def save(self, path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "ClusterSpec":
        return cls.from_dict(read_json(path, KIND, VERSIONS), str(path))

    def allreduce_time_s(self, nbytes: float) -> float:
        """Closed-form ring all-reduce time: 2(n-1)a + 2(n-1)/n * S/B (0 for one worker)."""
        n = self.world_size
        if n <= 1:
            return 0.0
        return 2 * (n - 1) * self.latency_s + 2 * (n - 1) / n * nbytes * 8 / self.bandwidth_bps
