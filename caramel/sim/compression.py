"""What a plan's codecs change in the workload the simulator replays.

A compressed bucket puts fewer bytes on the wire (`caramel.plan.compression.wire_bytes`: the
all-reduce-equivalent size, so the collective models price all-gathers too) and costs compute:
encoding runs in backward on the compute thread, so it delays this bucket's readiness, every
later bucket's and the end of backward; decoding runs before the update, so it is charged to
the bucket's apply time. Chunks keep their share of the bucket's bytes; a whole-bucket codec
(topk, powersgd) sends everything as its first chunk's collective.
"""
from __future__ import annotations

import dataclasses

from caramel.plan.compression import CodecSpec, codec_compute_s, parse_codec, wire_bytes
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile
from caramel.sim.workload import Item, Workload


def compress_workload(work: Workload, profile: ModelProfile, plan: Plan,
                      s_per_byte: dict[str, float] | None = None) -> Workload:
    """`work` (built from `plan` without its codecs) as the plan's codecs change it."""
    if plan.compression is None:
        return work
    specs = [parse_codec(c) for c in plan.compression]
    shapes = {p.index: list(p.shape) for p in profile.params}
    ratio, encode, decode = {}, {}, {}
    for b, spec in zip(plan.buckets, specs):
        elem = b.bytes // max(b.numel, 1)
        sent = wire_bytes(spec, b.numel, elem, plan.world_size, [shapes[i] for i in b.params])
        ratio[b.id] = sent / b.bytes if b.bytes else 1.0
        cost = codec_compute_s(spec, b.numel, elem, s_per_byte)
        encode[b.id], decode[b.id] = cost / 2, cost / 2
    # encode delays each bucket by its own and every earlier-ready bucket's encode time
    shift, extra = {}, 0.0
    for bl in sorted(work.buckets, key=lambda x: (x.ready_s, x.id)):
        extra += encode[bl.id]
        shift[bl.id] = extra
    buckets = tuple(dataclasses.replace(bl, bytes=int(round(bl.bytes * ratio[bl.id])), ready_s=bl.ready_s + shift[bl.id],
                                        apply_s=bl.apply_s + decode[bl.id]) for bl in work.buckets)
    items = tuple(_item(it, specs[it.bucket], ratio[it.bucket], plan) for it in work.items)
    return dataclasses.replace(work, backward_s=work.backward_s + extra,
                               optimizer_s=work.optimizer_s + sum(decode.values()), buckets=buckets, items=items)


def _item(it: Item, spec: CodecSpec, ratio: float, plan: Plan) -> Item:
    if spec.whole_bucket:
        whole = plan.buckets[it.bucket].bytes
        return dataclasses.replace(it, bytes=int(round(whole * ratio)) if it.chunk == 0 else 0)
    return dataclasses.replace(it, bytes=int(round(it.bytes * ratio)))
