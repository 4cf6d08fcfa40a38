"""The sharded sample format: a versioned JSON index and shard files of concatenated samples.

    DIR/index.json        {"format": "caramel.dataset/1", "num_samples": N, "shards": [...]}
    DIR/shard-00000.bin   sample 0's bytes, sample 1's bytes, ... (offsets in the index)

Each shard entry names its file, byte size, sha256 and the byte offset of every sample, so a
reader fetches a whole shard (one request) or one sample (a range read) and checks what it got.
A sample is a tuple of tensors: a small JSON header (dtypes, shapes) and their raw bytes.

Writes are atomic: each shard goes to a temporary file, is synced and renamed, and the index is
written last, so a directory with an index is complete and a crash mid-write leaves no index
(and no temporary files: they are removed on the way out).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from caramel.errors import CaramelError, FormatError
from caramel.jsonio import atomic_write_bytes, check_format, format_tag, write_json

KIND = "dataset"
INDEX_NAME = "index.json"


class DataError(CaramelError):
    """A sample or shard that cannot be read back as written (corrupt, truncated, missing)."""


@dataclass(frozen=True)
class ShardInfo:
    """One shard: its file name, size, checksum and the [start, end) byte range of each sample."""

    name: str
    nbytes: int
    sha256: str
    offsets: tuple[int, ...]  # num_samples + 1 boundaries, offsets[0] == 0, offsets[-1] == nbytes

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nbytes": self.nbytes, "sha256": self.sha256, "offsets": list(self.offsets)}


@dataclass(frozen=True)
class DatasetIndex:
    """What index.json says: the shards, in order; sample i is found by `locate(i)`."""

    shards: tuple[ShardInfo, ...]

    def __post_init__(self) -> None:
        starts, total = [], 0
        for s in self.shards:
            starts.append(total)
            total += s.num_samples
        object.__setattr__(self, "_starts", tuple(starts))
        object.__setattr__(self, "num_samples", total)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def shard_of(self, sample: int) -> int:
        """Index of the shard holding global sample `sample`."""
        if not 0 <= sample < self.num_samples:
            raise IndexError(f"sample {sample} is not in a dataset of {self.num_samples} samples")
        import bisect
        return bisect.bisect_right(self._starts, sample) - 1

    def locate(self, sample: int) -> tuple[int, int]:
        """(shard index, position within the shard) of global sample `sample`."""
        k = self.shard_of(sample)
        return k, sample - self._starts[k]

    def sample_range(self, shard: int) -> range:
        """The global sample indices of shard `shard`."""
        return range(self._starts[shard], self._starts[shard] + self.shards[shard].num_samples)

    def to_dict(self) -> dict[str, Any]:
        return {"format": format_tag(KIND), "num_samples": self.num_samples, "nbytes": self.nbytes,
                "shards": [s.to_dict() for s in self.shards]}

    @classmethod
    def from_dict(cls, data: Any, source: str) -> "DatasetIndex":
        data = check_format(data, KIND, source)
        try:
            shards = tuple(ShardInfo(str(s["name"]), int(s["nbytes"]), str(s["sha256"]), tuple(int(o) for o in s["offsets"]))
                           for s in data["shards"])
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{source}: a shard entry is malformed ({e!r}); expected name, nbytes, sha256, offsets") from None
        for s in shards:
            if len(s.offsets) < 2 or s.offsets[0] != 0 or s.offsets[-1] != s.nbytes or list(s.offsets) != sorted(s.offsets):
                raise FormatError(f"{source}: shard {s.name!r} has offsets that do not cover its {s.nbytes} bytes in order")
        index = cls(shards)
        if index.num_samples != data.get("num_samples"):
            raise FormatError(f"{source}: says {data.get('num_samples')} samples but its shards hold {index.num_samples}")
        return index

    @classmethod
    def parse(cls, text: bytes | str, source: str) -> "DatasetIndex":
        try:
            return cls.from_dict(json.loads(text), source)
        except json.JSONDecodeError as e:
            raise FormatError(f"{source}: not JSON ({e.msg} at line {e.lineno}); is this a Caramel dataset index?") from None


def encode_sample(tensors: Sequence[torch.Tensor]) -> bytes:
    """A tuple of tensors as bytes: a 4-byte header length, a JSON header (dtype and shape of
    each) and the raw buffers. Raw, not `torch.save`, so decoding is a copy (microseconds)."""
    parts = [t.detach().contiguous().cpu() for t in tensors]
    header = json.dumps([[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in parts]).encode()
    raw = [t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"" for t in parts]
    return len(header).to_bytes(4, "little") + header + b"".join(raw)


def decode_sample(data: bytes, where: str) -> tuple[torch.Tensor, ...]:
    """A sample's tensors from its bytes; a corrupt sample is a DataError naming `where`."""
    try:
        n = int.from_bytes(data[:4], "little")
        spec = json.loads(data[4:4 + n])
        out, pos = [], 4 + n
        for dtype_name, shape in spec:
            dtype = getattr(torch, dtype_name)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{dtype_name} is not a dtype")
            count = math.prod(shape)
            nbytes = count * dtype.itemsize
            if pos + nbytes > len(data):
                raise ValueError("shorter than its header says")
            buf = bytearray(data[pos:pos + nbytes])
            t = torch.frombuffer(buf, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
            out.append(t.reshape(shape))
            pos += nbytes
        if pos != len(data):
            raise ValueError("longer than its header says")
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError, RuntimeError) as e:
        raise DataError(f"{where}: corrupt sample ({type(e).__name__}: {str(e)[:80]})") from None
    return tuple(out)


def check_shard(info: ShardInfo, data: bytes, where: str) -> bytes:
    """`data` if it is the shard the index describes, else a DataError naming `where`."""
    if len(data) != info.nbytes:
        raise DataError(f"{where}: shard {info.name!r} has {len(data)} bytes, the index says {info.nbytes} (truncated?)")
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise DataError(f"{where}: shard {info.name!r} does not match its sha256 in the index (corrupt)")
    return data


def write_dataset(directory: str | os.PathLike, samples: Iterable[Sequence[torch.Tensor]],
                  samples_per_shard: int) -> DatasetIndex:
    """Write `samples` (tuples of tensors) as shards of `samples_per_shard` and the index, atomically."""
    if samples_per_shard < 1:
        raise CaramelError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if (out / INDEX_NAME).exists():
        (out / INDEX_NAME).unlink()  # the old dataset stops being readable before its shards change
    shards: list[ShardInfo] = []
    chunk: list[bytes] = []

    def flush() -> None:
        data = b"".join(chunk)
        offsets = [0]
        for c in chunk:
            offsets.append(offsets[-1] + len(c))
        name = f"shard-{len(shards):05d}.bin"
        atomic_write_bytes(out / name, data)
        shards.append(ShardInfo(name, len(data), hashlib.sha256(data).hexdigest(), tuple(offsets)))
        chunk.clear()

    for sample in samples:
        chunk.append(encode_sample(sample))
        if len(chunk) == samples_per_shard:
            flush()
    if chunk:
        flush()
    if not shards:
        raise CaramelError(f"no samples to write to {out}")
    index = DatasetIndex(tuple(shards))
    write_json(out / INDEX_NAME, index.to_dict())
    return index


def write_random_dataset(directory: str | os.PathLike, samples: int, sample_bytes: int, samples_per_shard: int,
                         seed: int = 0) -> DatasetIndex:
    """A benchmark data set: `samples` of (`sample_bytes` random bytes as uint8, the sample's index)."""
    if samples < 1 or sample_bytes < 1:
        raise CaramelError(f"a random data set needs samples >= 1 and sample_bytes >= 1, got {samples}, {sample_bytes}")
    g = torch.Generator().manual_seed(seed)
    return write_dataset(directory, ((torch.randint(0, 256, (sample_bytes,), dtype=torch.uint8, generator=g),
                                      torch.tensor(i)) for i in range(samples)), samples_per_shard)
