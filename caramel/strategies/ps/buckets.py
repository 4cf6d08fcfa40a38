"""Bucket fusion for the `ps` strategy: small tensors travel together.

Every push (a reduce to the server) and every pull (a broadcast from it) is one collective with
a fixed cost, whatever its size; a model of many small tensors pays that cost per tensor twice
a step. As DDP does for its all-reduce, parameters are grouped into buckets and each bucket is
pushed, and pulled, as one flattened tensor:

- a bucket holds parameters of one server shard only (a collective goes to one server) and of
  one dtype and device (they are concatenated);
- parameters join their shard's open bucket in the order gradients become ready (the plan's
  push order), and a bucket closes when the next parameter would take it past `cap_bytes`
  (a tensor larger than the cap is a bucket of its own); `cap_bytes=0` is one tensor per
  bucket, the unfused behaviour;
- buckets are listed in the order they become complete in backward (the position of their
  last parameter in the push order), the order they are pushed.

Pulls have buckets of their own (`make_pull_buckets`): the parameters of one shard in the
order the next forward first uses them, up to a smaller cap, so the first module's pull is not
one bucket with half the model in it. Pulls are ordered per pull bucket (TicTac over the bucket
graph, `bucket_graph`); every order moves the same pull buckets, so orders differ in order only.
"""
from __future__ import annotations

import torch

from caramel.errors import CaramelError
from caramel.strategies.ps.tictac import PullGraph

def cap_bytes(bucket_cap_mb: float) -> int:
    """The option in bytes (MB = 2**20 bytes, as DDP's bucket_cap_mb)."""
    return int(bucket_cap_mb * (1 << 20))


def make_buckets(push_order: list[int], owner: dict[int, int], sizes: dict[int, int], kinds: dict[int, str],
                 cap: int) -> list[list[int]]:
    """Buckets of parameter ids (each in push order), listed in the order they complete.

    `owner[i]` is i's shard, `sizes[i]` its bytes, `kinds[i]` its dtype and device (a bucket
    never mixes shards or kinds)."""
    if cap < 0:
        raise CaramelError(f"bucket cap must be >= 0 bytes, got {cap}")
    pos = {i: k for k, i in enumerate(push_order)}
    if len(pos) != len(push_order):
        raise CaramelError("make_buckets: the push order lists a parameter twice")
    done: list[list[int]] = []
    open_: dict[tuple[int, str], tuple[list[int], int]] = {}
    for i in push_order:
        key = (owner[i], kinds[i])
        members, nbytes = open_.get(key, ([], 0))
        if members and nbytes + sizes[i] > cap:
            done.append(members)
            members, nbytes = [], 0
        open_[key] = (members + [i], nbytes + sizes[i])
    done += [m for m, _ in open_.values() if m]
    return sorted(done, key=lambda b: pos[b[-1]])


def make_pull_buckets(need_order: list[int], owner: dict[int, int], sizes: dict[int, int], kinds: dict[int, str],
                      cap: int) -> list[list[int]]:
    """Pull buckets: per shard and kind, consecutive parameters of `need_order` (the order the
    next forward first uses them) up to `cap` bytes each (`make_buckets`' rule), listed by their
    first-needed parameter. Push buckets follow the order gradients are ready, which is the
    reverse: a pull bucket made of them lands whole, so the first module would wait for every
    parameter that shares its push bucket."""
    pos = {i: k for k, i in enumerate(need_order)}
    buckets = make_buckets(need_order, owner, sizes, kinds, cap)
    return sorted(buckets, key=lambda b: pos[b[0]])


def check_buckets(buckets: list[list[int]], params: list[int], owner: dict[int, int]) -> None:
    """Every parameter in exactly one bucket, every bucket on one shard (a plan that breaks
    this would send one collective to two servers)."""
    flat = [i for b in buckets for i in b]
    if sorted(flat) != sorted(params) or any(not b for b in buckets):
        raise CaramelError("ps plan: the buckets must hold every trainable parameter exactly once")
    for b in buckets:
        if len({owner[i] for i in b}) != 1:
            raise CaramelError(f"ps plan: bucket {b} mixes server shards {sorted({owner[i] for i in b})}")


def bucket_graph(graph: PullGraph, buckets: list[list[int]], latency_s: float, bandwidth_Bps: float,
                 sizes: list[int]) -> PullGraph:
    """The pull graph with one recv per bucket (`buckets` hold recv positions of `graph`): a
    bucket costs one latency plus its bytes over the bandwidth, and a compute op reads the
    buckets of the recvs it read."""
    of = {r: b for b, members in enumerate(buckets) for r in members}
    uses = tuple(tuple(sorted({of[r] for r in us})) for us in graph.uses)
    names = tuple("+".join(graph.names[r] for r in b) if graph.names else str(b) for b in buckets)
    return PullGraph(recv_s=tuple(latency_s + sum(sizes[r] for r in b) / bandwidth_Bps for b in buckets),
                     compute_s=graph.compute_s, uses=uses, preds=graph.preds, names=names)


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One new contiguous tensor holding `tensors` one after another (a lone tensor keeps its
    shape, so an unfused transfer is the tensor as it was)."""
    if len(tensors) == 1:
        return tensors[0].detach().clone(memory_format=torch.contiguous_format)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of `flat`, shaped as `like` (what `flatten(like)` laid out)."""
    out, at = [], 0
    flat = flat.view(-1)
    for t in like:
        n = t.numel()
        out.append(flat[at:at + n].view(t.shape))
        at += n
    return out


def send_buf(params: list[torch.Tensor]) -> torch.Tensor:
    """A server's copy of a bucket's parameters (they may change before it is sent)."""
    return flatten(params)


def recv_buf(params: list[torch.Tensor]) -> torch.Tensor:
    """Where a bucket of `params` lands: shaped as `flatten(params)` is."""
    if len(params) == 1:
        return torch.empty_like(params[0], memory_format=torch.contiguous_format)
    return torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
