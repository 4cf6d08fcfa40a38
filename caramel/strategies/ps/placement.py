"""Which server shard owns each parameter, and how loaded each shard is.

A shard's server receives every worker's gradient of its parameters and sends them all back,
so its link carries (workers x its bytes) each way: shards of unequal bytes make a hotspot.
So does a shard holding the parameters the next forward needs first: every worker waits on
that one server at the start of the step while the others idle. Three placements:

- `roundrobin`: parameter k (registration order) to shard k mod n, blind to both;
- `bytes`: largest first, each to the shard with the fewest bytes (balances bytes only);
- `balanced`: largest first, each to the shard whose heavier relative load, of all bytes or of
  first-needed bytes (each over its even share), stays the least, so both even out and no shard
  holds most of what the next forward needs first.
"""
from __future__ import annotations

from dataclasses import dataclass

from caramel.errors import CaramelError

EARLY_SHARE = 0.25  # "first-needed": the parameters in the first quarter of the need order


@dataclass(frozen=True)
class ShardLoad:
    shard: int
    params: int
    bytes: int
    early_bytes: int  # bytes among the first-needed parameters (EARLY_SHARE of the need order)

    def to_dict(self) -> dict:
        return {"shard": self.shard, "params": self.params, "bytes": self.bytes, "early_bytes": self.early_bytes}


def place(sizes_bytes: list[int], need_order: list[int], shards: int, mode: str) -> list[int]:
    """Shard of each parameter (by position in `sizes_bytes`); `need_order` lists positions,
    first needed first."""
    n = len(sizes_bytes)
    if shards < 1:
        raise CaramelError(f"placement needs at least one shard, got {shards}")
    if sorted(need_order) != list(range(n)):
        raise CaramelError(f"placement: need order is not a permutation of the {n} parameters")
    if mode == "roundrobin":
        return [k % shards for k in range(n)]
    if mode not in ("bytes", "balanced"):
        raise CaramelError(f"placement must be balanced, bytes or roundrobin, got {mode!r}")
    early = _early(need_order) if mode == "balanced" else set()
    total_share = max(sum(sizes_bytes), 1) / shards
    early_share = max(sum(sizes_bytes[k] for k in early), 1) / shards
    load, early_load = [0] * shards, [0] * shards
    owner = [0] * n
    for k in sorted(range(n), key=lambda k: (-sizes_bytes[k], k)):  # largest first (LPT)
        extra = sizes_bytes[k] if k in early else 0

        def cost(j: int) -> tuple[float, int, int]:
            return (max((load[j] + sizes_bytes[k]) / total_share, (early_load[j] + extra) / early_share), load[j], j)
        s = min(range(shards), key=cost)
        owner[k] = s
        load[s] += sizes_bytes[k]
        early_load[s] += extra
    return owner


def _early(need_order: list[int]) -> set[int]:
    """The first-needed parameters: the first EARLY_SHARE of the need order."""
    return set(need_order[:max(1, round(len(need_order) * EARLY_SHARE))]) if need_order else set()


def shard_loads(sizes_bytes: list[int], need_order: list[int], owner: list[int], shards: int) -> list[ShardLoad]:
    """Bytes, parameter count and first-needed bytes per shard."""
    early = _early(need_order)
    out = []
    for s in range(shards):
        mine = [k for k, o in enumerate(owner) if o == s]
        out.append(ShardLoad(s, len(mine), sum(sizes_bytes[k] for k in mine),
                             sum(sizes_bytes[k] for k in mine if k in early)))
    return out


def imbalance(loads: list[ShardLoad]) -> dict[str, float]:
    """max / mean of the shards' bytes and first-needed bytes (1.0 = perfectly even)."""
    def ratio(values: list[int]) -> float:
        mean = sum(values) / len(values) if values else 0.0
        return max(values) / mean if mean > 0 else 1.0
    return {"bytes_max_over_mean": ratio([x.bytes for x in loads]),
            "early_bytes_max_over_mean": ratio([x.early_bytes for x in loads])}
