"""`Plan`: how gradients travel, as data that every rank, the simulator and the tools share.

A plan groups trainable parameters into buckets (one flat buffer each, one dtype), splits
large buckets into chunks (one collective each), and fixes one global issue order of
(bucket, chunk) items that every rank follows, so collectives always match across ranks.
Each bucket names its *wait point*: the module before whose forward its update must be applied.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from caramel.errors import CaramelError, FormatError, MismatchError
from caramel.plan.compression import check_plan_compression
from caramel.plan.compute_schedule import ComputeSchedule
from caramel.jsonio import check_format, format_tag, from_fields, read_json, require, require_mapping, write_json

KIND = "plan"
# When a bucket's averaged update is applied: just before its first use in the next forward,
# at step() after overlapping backward (DDP), or after backward with no overlap at all.
OVERLAPS = ("forward", "backward", "none")


@dataclass
class Bucket:
    """Parameters reduced together, laid out in `params` order in one flat buffer of `dtype`."""

    id: int
    params: list[int]
    dtype: str
    numel: int
    bytes: int
    num_chunks: int = 1
    need_module: str | None = None  # module whose forward first uses any of these parameters
    need_time_s: float | None = None  # when that is, from forward start (profile estimate)
    ready_time_s: float | None = None  # when the last gradient is ready, from backward start (profile estimate)

    def chunk_bounds(self, chunk: int) -> tuple[int, int]:
        """Element range [start, end) of one chunk: equal slices, the last one shorter."""
        assert 0 <= chunk < self.num_chunks
        size = -(-self.numel // self.num_chunks)
        start = min(chunk * size, self.numel)
        return start, min(start + size, self.numel)

    def chunk_bytes(self, chunk: int) -> int:
        start, end = self.chunk_bounds(chunk)
        return (end - start) * (self.bytes // max(self.numel, 1))


@dataclass
class Plan:
    """Buckets, chunks, one global issue order, and a fingerprint that every rank checks."""

    planner: str
    world_size: int
    model_fingerprint: str
    param_names: list[str]
    buckets: list[Bucket]
    order: list[tuple[int, int]]  # (bucket id, chunk index), the global issue order
    options: dict[str, Any] = field(default_factory=dict)
    predicted_step_time_s: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # Deferred weight gradients the runtime must run (`caramel.plan.compute_schedule`); None: none.
    # The buckets, order and predicted_step_time_s were made for the profile it produces.
    compute_schedule: ComputeSchedule | None = None
    # One codec name per bucket (`caramel.plan.compression`); None: every bucket uncompressed.
    compression: list[str] | None = None
    # The forward order of the profiled modules the plan was made for, when the planner runs
    # independent branches in another order (`caramel.plan.branch_order`); None: the model's own.
    module_order: list[str] | None = None

    def __post_init__(self) -> None:
        self.order = [tuple(item) for item in self.order]  # type: ignore[misc]
        if self.compute_schedule is not None and self.compute_schedule.empty:
            self.compute_schedule = None  # deferring nothing is no schedule (and keeps the fingerprint)
        if self.compression is not None and all(c == "none" for c in self.compression):
            self.compression = None  # compressing nothing is no compression (and keeps the fingerprint)

    def codec_of(self, bucket: int) -> str:
        """The codec name bucket `bucket` is sent with ("none" without compression)."""
        return "none" if self.compression is None else self.compression[bucket]

    def validate(self, source: str = "plan") -> None:
        """Structural checks: ids, chunk counts, every item issued exactly once, no parameter twice."""
        seen: set[int] = set()
        if self.world_size < 1:
            raise FormatError(f"{source}: field 'world_size' must be >= 1, got {self.world_size}")
        for i, b in enumerate(self.buckets):
            if b.numel < 0 or b.bytes < 0:
                raise FormatError(f"{source}: buckets[{i}] has a negative size")
            if b.id != i:
                raise FormatError(f"{source}: buckets[{i}].id is {b.id}, expected {i}")
            if b.num_chunks < 1 or b.num_chunks > max(b.numel, 1):
                raise FormatError(f"{source}: buckets[{i}].num_chunks must be between 1 and its numel ({b.numel}), got {b.num_chunks}")
            for p in b.params:
                if not (0 <= p < len(self.param_names)):
                    raise FormatError(f"{source}: buckets[{i}] names parameter index {p}, but the plan has {len(self.param_names)} parameters")
                if p in seen:
                    raise FormatError(f"{source}: parameter {self.param_names[p]!r} is in more than one bucket")
                seen.add(p)
        expected = {(b.id, c) for b in self.buckets for c in range(b.num_chunks)}
        if len(self.order) != len(expected) or set(self.order) != expected:
            raise FormatError(f"{source}: field 'order' must list every (bucket, chunk) exactly once ({len(expected)} items), got {len(self.order)}")
        if self.compression is not None:
            try:
                check_plan_compression(self.compression, len(self.buckets), source)
            except CaramelError as e:
                raise FormatError(str(e)) from None

    @property
    def fingerprint(self) -> str:
        """Hash of everything the ranks must agree on (not the predictions or metadata)."""
        core = {
            "world_size": self.world_size,
            "model_fingerprint": self.model_fingerprint,
            "buckets": [[b.params, b.dtype, b.numel, b.num_chunks] for b in self.buckets],
            "order": [list(o) for o in self.order],
        }
        if self.compute_schedule is not None:  # only when set, so that plans without one keep their fingerprints
            core["compute_schedule"] = list(self.compute_schedule.modules)
        if self.compression is not None:  # likewise
            core["compression"] = list(self.compression)
        if self.module_order is not None:  # likewise: plans without one keep their fingerprints
            core["module_order"] = list(self.module_order)
        return hashlib.sha256(json.dumps(core, separators=(",", ":")).encode()).hexdigest()[:16]

    def num_items(self) -> int:
        return len(self.order)

    def total_bytes(self) -> int:
        return sum(b.bytes for b in self.buckets)

    def check_model(self, fingerprint: str, param_names: list[str], source: str = "plan") -> None:
        """Raise `MismatchError` if this plan was made for a different model."""
        if fingerprint == self.model_fingerprint:
            return
        if len(param_names) != len(self.param_names):
            raise MismatchError(f"{source}: plan is for a model with {len(self.param_names)} parameters, this model has {len(param_names)}")
        for a, b in zip(self.param_names, param_names):
            if a != b:
                raise MismatchError(f"{source}: plan parameter {a!r} does not match model parameter {b!r}")
        raise MismatchError(f"{source}: plan was made for a model with other parameter shapes or dtypes (fingerprint {self.model_fingerprint} vs {fingerprint})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["order"] = [list(o) for o in self.order]
        if self.compression is None:
            del d["compression"]  # plans without compression keep their files as they were
        d["format"] = format_tag(KIND)
        d["fingerprint"] = self.fingerprint
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<plan>") -> "Plan":
        check_format(data, KIND, source)
        buckets = [from_fields(Bucket, b, f"{source}: buckets[{i}]") for i, b in enumerate(require(data, "buckets", list, source))]
        order = []
        for i, item in enumerate(require(data, "order", list, source)):
            if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
                raise FormatError(f"{source}: order[{i}] must be [bucket, chunk] (two integers), got {item!r}")
            order.append(tuple(item))
        predicted = data.get("predicted_step_time_s")
        if predicted is not None and (isinstance(predicted, bool) or not isinstance(predicted, (int, float))):
            raise FormatError(f"{source}: field 'predicted_step_time_s' must be a number or null")
        schedule = data.get("compute_schedule")
        if schedule is not None:
            schedule = from_fields(ComputeSchedule, schedule, f"{source}: compute_schedule")
            if schedule.k < 0 or schedule.extra_bytes < 0 or not all(isinstance(n, str) for n in schedule.modules):
                raise FormatError(f"{source}: compute_schedule must have k >= 0, extra_bytes >= 0 and module names")
        compression = data.get("compression")
        if compression is not None and not (isinstance(compression, list) and all(isinstance(c, str) for c in compression)):
            raise FormatError(f"{source}: field 'compression' must list one codec name per bucket, or be null")
        module_order = data.get("module_order")  # absent from older plans: the model's own order
        if module_order is not None and not (isinstance(module_order, list) and all(isinstance(n, str) for n in module_order)):
            raise FormatError(f"{source}: field 'module_order' must list module names, or be null")
        names = require(data, "param_names", list, source)
        if not all(isinstance(n, str) for n in names):
            raise FormatError(f"{source}: field 'param_names' must list strings")
        plan = cls(
            planner=require(data, "planner", str, source),
            world_size=require(data, "world_size", int, source),
            model_fingerprint=require(data, "model_fingerprint", str, source),
            param_names=list(names),
            buckets=buckets,
            order=order,  # type: ignore[arg-type]
            options=require_mapping(data, "options", source),
            predicted_step_time_s=predicted,
            meta=require_mapping(data, "meta", source),
            compute_schedule=schedule,
            compression=compression,
            module_order=module_order,
        )
        plan.validate(source)
        stored = data.get("fingerprint")
        if stored is not None and stored != plan.fingerprint:
            raise FormatError(f"{source}: stored fingerprint {stored} does not match the plan's contents ({plan.fingerprint}); the file was edited or corrupted")
        return plan

    def save(self, path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "Plan":
        return cls.from_dict(read_json(path, KIND), str(path))
