"""Gradient codecs as data: their names, the bytes they put on the wire, their compute cost.

A plan may name one codec per bucket (`Plan.compression`); the runtime
(`caramel.runtime.compression`) runs it and the simulator (`caramel.sim.workload`) charges its
wire bytes and its compute from the functions here, so both read the same numbers.

Codecs, by name:
- `none`: the gradient as it is (the bucket's dtype);
- `fp16` / `bf16`: cast to 16 bits for the all-reduce, back after it: half the bytes;
- `topk:FRACTION`: each rank sends its FRACTION largest-magnitude entries (values and int64
  indices, an all-gather); what it did not send is kept and added to its next gradient (error
  feedback);
- `powersgd:RANK`: each matrix-shaped gradient (n x m) is sent as two rank-RANK factors, P (n x
  r) and Q (m x r), in two all-reduces (PowerSGD, with error feedback and Q warm-started);
  vectors (biases) go uncompressed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from caramel.errors import CaramelError

CODECS = ("none", "fp16", "bf16", "topk", "powersgd")
LOSSY = ("topk", "powersgd")  # with error feedback
# Codec compute, seconds per byte of fp32 gradient, encode plus decode on one CPU core, as
# `caramel.runtime.compression.time_codec(codec, 2**20)` measured it on the project's 2-core
# host (fp16 0.21e-9, bf16 0.05-0.1e-9, topk:0.01 4.1e-9, powersgd:4 3.8e-9; a GPU is far faster).
# Encode runs in backward on the compute thread, decode before the update.
DEFAULT_CODEC_S_PER_BYTE = {"none": 0.0, "fp16": 0.2e-9, "bf16": 0.1e-9, "topk": 4e-9, "powersgd": 4e-9}


@dataclass(frozen=True)
class CodecSpec:
    """A parsed codec name: `kind` and its parameter (FRACTION for topk, RANK for powersgd)."""

    kind: str
    fraction: float | None = None
    rank: int | None = None

    @property
    def name(self) -> str:
        if self.kind == "topk":
            return f"topk:{self.fraction:g}"
        if self.kind == "powersgd":
            return f"powersgd:{self.rank}"
        return self.kind

    @property
    def lossy(self) -> bool:
        return self.kind in LOSSY

    @property
    def whole_bucket(self) -> bool:
        """Runs once per bucket (at its first chunk's turn), not once per chunk."""
        return self.kind in LOSSY


def parse_codec(text: str, where: str = "compression") -> CodecSpec:
    """`fp16` -> CodecSpec("fp16"); `topk:0.01`, `powersgd:2`; anything else is one clear error."""
    if not isinstance(text, str):
        raise CaramelError(f"{where} must be text (none, fp16, bf16, topk:FRACTION or powersgd:RANK), got {text!r}")
    kind, _, arg = text.strip().partition(":")
    if kind in ("none", "fp16", "bf16") and not arg:
        return CodecSpec(kind)
    if kind == "topk":
        try:
            fraction = float(arg)
        except ValueError:
            fraction = math.nan
        if not 0.0 < fraction <= 1.0:
            raise CaramelError(f"{where}={text!r}: topk needs a fraction in (0, 1] of entries to send, e.g. topk:0.01")
        return CodecSpec("topk", fraction=fraction)
    if kind == "powersgd":
        if not arg.isdigit() or int(arg) < 1:
            raise CaramelError(f"{where}={text!r}: powersgd needs a rank >= 1, e.g. powersgd:2")
        return CodecSpec("powersgd", rank=int(arg))
    raise CaramelError(f"{where}={text!r}: expected none, fp16, bf16, topk:FRACTION or powersgd:RANK")


def topk_count(spec: CodecSpec, numel: int) -> int:
    """Entries each rank sends of a bucket of `numel` gradient entries (at least one)."""
    return max(1, min(numel, int(math.ceil(spec.fraction * numel))))


def powersgd_fits(shape: list[int] | tuple[int, ...], rank: int) -> bool:
    """A gradient of `shape` is compressed as a matrix (rows x rest) when its factors are smaller."""
    if len(shape) < 2:
        return False
    n = shape[0]
    m = math.prod(shape[1:])
    return (n + m) * rank < n * m


def wire_bytes(spec: CodecSpec, numel: int, elem_bytes: int, world_size: int,
               shapes: list[list[int]] | None = None) -> float:
    """All-reduce-equivalent bytes of a bucket of `numel` entries (the size an all-reduce of the
    same cost would carry), so the simulator's collective models price it: an all-gather of s
    bytes from each of n ranks costs what an all-reduce of n*s/2 bytes does in a ring."""
    full = numel * elem_bytes
    if spec.kind == "none":
        return float(full)
    if spec.kind in ("fp16", "bf16"):
        return numel * 2.0
    if spec.kind == "topk":
        k = topk_count(spec, numel)
        return world_size * k * (elem_bytes + 8) / 2.0
    # powersgd: the factors of each matrix that fits, the rest dense
    if shapes is None:
        return float(full)
    total = 0.0
    for shape in shapes:
        if powersgd_fits(shape, spec.rank):
            total += (shape[0] + math.prod(shape[1:])) * spec.rank * elem_bytes
        else:
            total += math.prod(shape) * elem_bytes
    return total


def codec_compute_s(spec: CodecSpec, numel: int, elem_bytes: int,
                    s_per_byte: dict[str, float] | None = None) -> float:
    """Seconds of encode plus decode for a bucket (`DEFAULT_CODEC_S_PER_BYTE` unless given)."""
    table = s_per_byte or DEFAULT_CODEC_S_PER_BYTE
    return table.get(spec.kind, 0.0) * numel * elem_bytes


def check_plan_compression(codecs: list[str], num_buckets: int, source: str = "plan") -> None:
    """A plan's per-bucket codec names parse and cover every bucket."""
    if len(codecs) != num_buckets:
        raise CaramelError(f"{source}: field 'compression' must name one codec per bucket ({num_buckets}), "
                           f"got {len(codecs)}")
    for i, c in enumerate(codecs):
        parse_codec(c, where=f"{source}: compression[{i}]")
