"""Which buckets to compress: a fixed codec everywhere, or `compression="auto"` per bucket.

`auto` asks the simulator, for the link the job measured (or was given): compressing the
largest buckets first, j = 0, 1, ... of them with `AUTO_CODEC`, which j gives the shortest
predicted step? Compression costs compute (encode in backward, decode before the update) and
saves wire time; on a fast link whose transfers already hide behind compute it only costs, so
auto keeps every bucket uncompressed unless the best j beats none by more than `AUTO_MARGIN`.
The controller decides again whenever it re-plans for a measured bandwidth more than 2x off the
plan's (`checks.bandwidth_replan_cluster`), so compression goes on when the link slows and off
when it recovers, at the same step on every rank (rank 0 decides; the plan carries the choice).
A checkpoint keeps the choice: the settled plan, its profile and link travel in the optimizer's
state dict (`plan_state`, as for every other compression mode), and a resumed engine adopts
them instead of profiling.
fp16 keeps no error feedback, so there is no residual to carry.
"""
from __future__ import annotations

import dataclasses

from caramel.errors import CaramelError
from caramel.plan.compression import parse_codec
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.sim.simulate import simulate
from caramel.topology.spec import ClusterSpec

AUTO_CODEC = "fp16"  # lossless enough to keep accuracy (NetSenseML's point: only compress when it pays)
AUTO_MARGIN = 0.02  # the compressed plan must be predicted > 2% faster than the uncompressed one
COMPRESSIONS = "none (or off), fp16, bf16, topk:FRACTION, powersgd:RANK or auto"


def check_compression(value: str) -> None:
    """The `compression` option names a codec or `auto` (one clear error otherwise)."""
    if value == "auto":
        return
    try:
        parse_codec(value)
    except CaramelError as e:
        raise CaramelError(f"{e} (compression takes {COMPRESSIONS})") from None


def with_codecs(plan: Plan, codecs: list[str] | None) -> Plan:
    """A copy of `plan` sending bucket i with codecs[i] (None or all "none": uncompressed)."""
    return dataclasses.replace(plan, compression=list(codecs) if codecs is not None else None)


def predicted_s(profile: ModelProfile, cluster: ClusterSpec, plan: Plan, overlap: str) -> float:
    return simulate(profile, cluster, plan, overlap, trace=False).step_time_s


def choose_codecs(profile: ModelProfile, cluster: ClusterSpec, plan: Plan, overlap: str,
                  codec: str = AUTO_CODEC, margin: float = AUTO_MARGIN) -> tuple[list[str], dict]:
    """The per-bucket codecs auto picks for `plan` on `cluster`, and what it predicted for each j."""
    bare = with_codecs(plan, None)
    by_size = sorted(range(len(plan.buckets)), key=lambda b: (-plan.buckets[b].bytes, b))
    tried = []
    for j in range(len(by_size) + 1):
        codecs = ["none"] * len(plan.buckets)
        for b in by_size[:j]:
            codecs[b] = codec
        tried.append((predicted_s(profile, cluster, with_codecs(bare, codecs), overlap), j, codecs))
    base = tried[0][0]
    best_s, best_j, best = min(tried, key=lambda t: (t[0], t[1]))
    if best_s >= base * (1.0 - margin):
        best_s, best_j, best = tried[0]
    info = {"codec": codec, "buckets_compressed": best_j, "predicted_s": best_s, "uncompressed_s": base,
            "bandwidth_bps": cluster.bandwidth_bps}
    return best, info


def compress_plan(plan: Plan, compression: str, profile: ModelProfile, cluster: ClusterSpec,
                  overlap: str) -> Plan:
    """`plan` with the codecs `compression` asks for, its prediction simulated with them."""
    if compression == "none":
        return plan
    if compression == "auto":
        codecs, info = choose_codecs(profile, cluster, plan, overlap)
        if all(c == "none" for c in codecs):
            out = dataclasses.replace(plan, meta=dict(plan.meta, compression_auto=info))
            return out  # the planner's own prediction stands
        out = with_codecs(plan, codecs)
        out.meta = dict(plan.meta, compression_auto=info)
    else:
        out = with_codecs(plan, [compression] * len(plan.buckets))
    out.predicted_step_time_s = predicted_s(profile, cluster, out, overlap)
    return out
