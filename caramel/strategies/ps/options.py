"""The `ps` strategy's knobs: servers, consistency, pull order, hierarchy and placement.

    caramel.parallelize(model, opt, strategy="ps:order=tac,consistency=ssp:2")

`consistency` is text (`"bsp"`, `"ssp:S"`, `"asp"`), the same in a spec
(`ps:consistency=ssp:2`); `ssp_S` (e.g. `ssp_2`) is accepted too and means the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from caramel.errors import CaramelError
from caramel.strategies.ps.staleness import MODES as STALENESS

ORDERS = ("tac", "tic", "fifo", "random")
PLACEMENTS = ("balanced", "bytes", "roundrobin")
DEFAULT_BUCKET_CAP_MB = 1.0  # per fused push/pull; docs/ps.md (Bucket fusion) says why not DDP's 25
DEFAULT_DC_LAMBDA = 2.0  # DC-ASGD-a's lambda0 in Zheng et al. (ICML 2017)
ASP_BOUND_STEPS = 32  # asp: how far behind a worker's parameters may fall before it must wait (bounds memory)


@dataclass(frozen=True)
class PsOptions:
    """`servers`: how many ranks serve a shard (0: every rank, BytePS's colocated mode; N: ranks
    0..N-1, which also train). `dedicated`: the servers are extra processes that only serve, the
    job's last `servers` ranks (BytePS's server processes; `server.py`; CARAMEL_PS_SERVERS=N from
    the launcher means the same). `consistency`: "bsp" (every worker uses the parameters of the previous step),
    "ssp:S" (at most S updates behind), "asp" (never waits; see ASP_BOUND_STEPS). `order`: the
    order the servers send parameters back (TicTac's "tac"/"tic", "fifo" = the order gradients
    became ready, "random" = a fresh order each step). `placement`: how parameters are assigned
    to server shards (`caramel.strategies.ps.placement`). `hierarchical`: aggregate within a
    node first, one gradient per node to the servers (`hierarchy.py`; the servers are then the
    nodes' first ranks). `bucket_cap_mb`: parameters of one shard are fused into buckets of at
    most this many MB (2**20 bytes), each pushed and pulled as one collective (`buckets.py`);
    0 turns fusion off (one collective per tensor). `pull_bucket_cap_mb`: pulls are fused apart,
    the parameters of one shard in the order the next forward needs them, up to this cap (None:
    `bucket_cap_mb`; at most `bucket_cap_mb`; `buckets.make_pull_buckets`; the simulated caps are
    in docs/results/ps-history.md, "The order, a third look"). `staleness`: what ssp/asp do about stale
    gradients: "none" (a forward uses whatever has landed, within the bound), "pace" (a worker
    ahead of the slowest waits for its push before the next forward, so the lead the bound
    allows hides transfers, not a straggler), "predict" (pace, and each forward runs on the
    parameters extrapolated by their latest update to the version its gradient is applied to),
    "compensate" (pace, and each server corrects every stale gradient by DC-ASGD's delay
    compensation, `compensate.py`, with `dc_lambda` the adaptive variant's lambda0), "scale"
    (no pace; each server divides a worker's gradient by its staleness tau when tau > 1, Zhang
    et al.'s staleness-aware lr / tau; needs ssp:S with S >= 2 or asp, as ssp:1's lags are <= 1);
    `staleness.py`; bsp is unchanged."""

    servers: int = 0
    consistency: str = "bsp"
    order: str = field(default="tac", metadata={"choices": ORDERS})
    placement: str = field(default="balanced", metadata={"choices": PLACEMENTS})
    hierarchical: bool = False
    dedicated: bool = False
    seed: int = 0  # order="random": the seed of the per-step orders (the same on every rank)
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB
    pull_bucket_cap_mb: float | None = None
    staleness: str = field(default="none", metadata={"choices": STALENESS})
    clip_grad_norm: float = 0.0  # the servers clip the averaged gradient's global L2 norm to this (0: no clipping)
    dc_lambda: float | None = None  # staleness=compensate: lambda0 of DC-ASGD-a (unitless; None: DEFAULT_DC_LAMBDA)

    def __post_init__(self) -> None:
        if self.servers < 0:
            raise CaramelError(f"servers must be >= 0 (0: every rank serves a shard), got {self.servers}")
        if self.order not in ORDERS:
            raise CaramelError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        self.staleness_bound()  # checks the text
        if self.staleness not in STALENESS:
            raise CaramelError(f"staleness must be one of {', '.join(STALENESS)} (what ssp/asp do about stale "
                               f"gradients), got {self.staleness!r}")
        if not self.clip_grad_norm >= 0:
            raise CaramelError(f"clip_grad_norm must be >= 0 (the largest L2 norm of the averaged gradient; 0 = no "
                               f"clipping), got {self.clip_grad_norm}")
        for name, what in (("bucket_cap_mb", "MB per fused push and pull; 0 = no fusion, one collective per tensor"),
                           ("pull_bucket_cap_mb", "MB per fused pull, at most bucket_cap_mb; 0 = one pull per tensor")):
            value = getattr(self, name)
            if value is None and name == "pull_bucket_cap_mb":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise CaramelError(f"{name} must be a finite number >= 0 ({what}), got {value!r}")
        if self.pull_bucket_cap_mb is not None and self.pull_bucket_cap_mb > self.bucket_cap_mb:
            raise CaramelError(f"pull_bucket_cap_mb ({self.pull_bucket_cap_mb:g}) must be at most bucket_cap_mb "
                               f"({self.bucket_cap_mb:g}; 0 = unfused): a pull bucket is a part of one shard's "
                               f"push buckets' parameters; lower pull_bucket_cap_mb or raise bucket_cap_mb")
        if self.staleness != "none" and self.staleness_bound() == 0:
            raise CaramelError(f"ps: staleness={self.staleness} corrects stale gradients, which consistency="
                               f"{self.consistency} never has; use consistency=ssp:S with S > 0 or asp")
        if self.staleness == "scale" and self.staleness_bound() == 1:  # lags <= S = 1, and max(1, tau) = 1
            raise CaramelError(f"ps: staleness=scale divides gradients more than 1 update old, which consistency="
                               f"{self.consistency} never has; use consistency=ssp:S with S >= 2 or asp")
        if self.dc_lambda is not None and (isinstance(self.dc_lambda, bool) or not isinstance(self.dc_lambda, (int, float))
                                           or not math.isfinite(self.dc_lambda) or self.dc_lambda < 0):
            raise CaramelError(f"ps: dc_lambda must be a finite number >= 0 (lambda0 of staleness=compensate's delay "
                               f"compensation; default {DEFAULT_DC_LAMBDA:g}), got {self.dc_lambda!r}")
        if self.dc_lambda is not None and self.staleness != "compensate":  # given, even at the default: not ignored
            raise CaramelError(f"ps: dc_lambda={self.dc_lambda:g} applies to staleness=compensate only, got staleness="
                               f"{self.staleness}; drop dc_lambda or set staleness=compensate")
        if self.staleness in ("compensate", "scale") and self.hierarchical:
            raise CaramelError(f"ps: staleness={self.staleness} does not combine with hierarchical=true yet (a node's "
                               f"sum mixes gradients of different ages); use hierarchical=false or staleness=none or pace")
        if self.dedicated and self.staleness != "none":
            raise CaramelError(f"ps: staleness={self.staleness} does not combine with dedicated=true yet; pick one")
        if self.dedicated and self.hierarchical:
            raise CaramelError("ps: dedicated=true and hierarchical=true do not combine yet; pick one")

    def dc_lambda0(self) -> float:
        """compensate's lambda0: dc_lambda, or DEFAULT_DC_LAMBDA when that is not given."""
        return DEFAULT_DC_LAMBDA if self.dc_lambda is None else float(self.dc_lambda)

    def pull_cap_mb(self) -> float:
        """The cap of a pull bucket: pull_bucket_cap_mb, or bucket_cap_mb when that is not given."""
        return self.bucket_cap_mb if self.pull_bucket_cap_mb is None else self.pull_bucket_cap_mb

    def staleness_bound(self) -> int | None:
        """How many updates a worker's parameters may lag: 0 for bsp, S for ssp:S, None for asp."""
        text = self.consistency.strip().lower()
        if text == "bsp":
            return 0
        if text == "asp":
            return None
        for prefix in ("ssp:", "ssp_"):
            if text.startswith(prefix):
                raw = text[len(prefix):]
                try:
                    s = int(raw)
                except ValueError:
                    break
                if s < 0:
                    raise CaramelError(f"consistency {self.consistency!r}: the staleness bound S must be >= 0, got {s}")
                return s
        raise CaramelError(f"consistency must be 'bsp', 'ssp:S' (S >= 0 steps, also written ssp_S) or 'asp', "
                           f"got {self.consistency!r}")

    def check_world(self, world_size: int, local_size: int = 1, dedicated: int = 0) -> int:
        """The number of server shards for `world_size` ranks in nodes of `local_size` (an
        error when more are asked than there are ranks, or nodes when hierarchical); with
        `dedicated` server processes (resolved by `server.dedicated_servers`), that many."""
        if dedicated:
            return dedicated
        hosts = world_size // local_size if self.hierarchical else world_size
        if self.servers > hosts:
            what = "nodes" if self.hierarchical else "ranks"
            raise CaramelError(f"ps: servers={self.servers} but the job has only {hosts} {what}; "
                               f"servers must be between 0 (every {what[:-1]}) and {hosts}")
        return self.servers or hosts
