"""`ModelProfile`: what one training step of a model looks like, per parameter and per module.

Times are seconds on the profiled worker. Within a step, forward runs over [0, forward_time_s],
backward over [forward_time_s, forward_time_s + backward_time_s], then the optimizer.
Each parameter has a *transfer window*: it opens when its gradient is ready in backward
(`ready_time_s`, measured from backward start) and closes when the next forward first uses it
(`first_use_time_s`, measured from forward start, one step later).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from caramel.errors import CaramelError, FormatError
from caramel.jsonio import check_format, format_tag, from_fields, read_json, require, require_mapping, require_number, write_json

KIND = "profile"


def ready_orders(ready_time_s: dict[int, float]) -> dict[int, int]:
    """Parameter index -> ready order (0 first) from gradient-ready times; a tie goes to the
    later-registered parameter, as backward runs the model from its end."""
    return {i: r for r, i in enumerate(sorted(ready_time_s, key=lambda i: (ready_time_s[i], -i)))}


@dataclass
class ParamInfo:
    """One parameter, in `model.parameters()` order (deduplicated: a tied parameter appears once)."""

    index: int
    name: str
    shape: list[int]
    dtype: str
    numel: int
    bytes: int
    requires_grad: bool
    ready_order: int | None = None  # 0 = first gradient ready in backward; None: no gradient (frozen/unused)
    ready_time_s: float | None = None  # since backward start
    first_use_order: int | None = None  # index into ModelProfile.modules of the first module that uses it
    first_use_time_s: float | None = None  # since forward start
    use_modules: list[str] = field(default_factory=list)  # every module whose own computation used it, in forward order
    # A tied embedding's weight profiled with its rows apart (`caramel.runtime.tied`): when the
    # embedding's part of its gradient is ready (since backward start), so when the whole
    # gradient would be without the split; None for every other parameter.
    rows_ready_time_s: float | None = None


@dataclass
class ModuleInfo:
    """A module that did computation of its own in forward, in the order forward first ran it."""

    name: str
    type: str
    forward_start_s: float
    forward_time_s: float  # until the next module started (or forward ended)
    backward_time_s: float  # share of backward attributed to this module's gradients
    params: list[int] = field(default_factory=list)  # indices of parameters whose first use is here
    # Split backward (`caramel.profile.split_backward`), measured by `profile_model`; None (and
    # `splittable` False) when unknown, as in older profiles and the engine's online profile.
    splittable: bool = False  # its weight gradient can be deferred: a splittable layer whose parameters no other module uses
    input_grad_time_s: float | None = None  # backward_time_s = input_grad_time_s + weight_grad_time_s (splittable only)
    weight_grad_time_s: float | None = None  # its weight (and bias) gradient, computed apart (splittable only)
    deferred_bytes: int | None = None  # what a deferral keeps alive until the weight gradient runs: input + output gradient, one step
    input_bytes: int | None = None  # bytes of the tensors passed to its forward (the activation it saves, for the memory estimate)
    # The same module at the profile's `small_batch_size` (`ModelProfile.with_small_batch`): two sizes
    # let a model of a pipeline's microbatches fit a fixed cost per call; None when not measured.
    small_batch_forward_time_s: float | None = None
    small_batch_backward_time_s: float | None = None


@dataclass
class Window:
    """A parameter's transfer window in the step timeline (seconds from the start of step k's forward)."""

    param: int
    start_s: float  # gradient ready in step k's backward
    end_s: float  # first use in step k+1's forward

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class ModelProfile:
    """Per-parameter sizes, gradient-ready times and first-use times, per-module times, for one model and batch."""

    model: str
    batch_size: int
    forward_time_s: float
    backward_time_s: float
    optimizer_time_s: float
    params: list[ParamInfo]
    modules: list[ModuleInfo]
    steps_measured: int = 1
    meta: dict[str, Any] = field(default_factory=dict)
    small_batch_size: int | None = None  # the second batch size its modules were timed at, if any

    @property
    def step_time_s(self) -> float:
        return self.forward_time_s + self.backward_time_s + self.optimizer_time_s

    @property
    def compute_time_s(self) -> float:
        return self.forward_time_s + self.backward_time_s

    def trainable(self) -> list[ParamInfo]:
        """Parameters that get a gradient, in index order."""
        return [p for p in self.params if p.requires_grad]

    def total_grad_bytes(self) -> int:
        return sum(p.bytes for p in self.trainable())

    def windows(self, overlap: str = "forward") -> list[Window]:
        """Each trainable parameter's transfer window.

        With `overlap="forward"` the window closes at the parameter's first use in the next
        forward; with `"backward"` or `"none"` it closes when backward ends (the DDP barrier).
        Parameters that never became ready are given a window that opens at backward end.
        """
        out = []
        bwd_end = self.forward_time_s + self.backward_time_s
        for p in self.trainable():
            start = self.forward_time_s + (p.ready_time_s if p.ready_time_s is not None else self.backward_time_s)
            if overlap == "forward":
                use = p.first_use_time_s if p.first_use_time_s is not None else self.forward_time_s
                end = self.step_time_s + use
            else:
                end = bwd_end
            out.append(Window(p.index, start, max(end, start)))
        return out

    def unsplit(self) -> "ModelProfile":
        """This profile as a run without the tied-embedding split sees it (torch DDP, or
        `split_tied=False`): each split weight's gradient ready when its rows are, the ready
        order renumbered. The profile itself when nothing was split."""
        import copy

        if all(p.rows_ready_time_s is None for p in self.params):
            return self
        out = copy.deepcopy(self)
        for p in out.params:
            if p.rows_ready_time_s is not None:
                p.ready_time_s, p.rows_ready_time_s = p.rows_ready_time_s, None
        orders = ready_orders({p.index: p.ready_time_s for p in out.params if p.ready_time_s is not None})
        for p in out.params:
            p.ready_order = orders.get(p.index)
        return out

    def with_small_batch(self, small: "ModelProfile") -> "ModelProfile":
        """This profile with each module's times at `small`'s (smaller) batch size beside its
        own, matched by module name: what fits a fixed cost per call (a layer reads its whole
        weight again for every microbatch, whatever its size). A module `small` lacks keeps None."""
        import copy

        if small.fingerprint() != self.fingerprint():
            raise CaramelError(f"profile of {small.model!r} at batch {small.batch_size} is of another model than "
                               f"{self.model!r}: parameters differ")
        if not 0 < small.batch_size < self.batch_size:
            raise CaramelError(f"a small-batch profile needs a batch size in [1, {self.batch_size}), got {small.batch_size}")
        by_name = {m.name: m for m in small.modules}
        out = copy.deepcopy(self)
        out.small_batch_size = small.batch_size
        for m in out.modules:
            other = by_name.get(m.name)
            m.small_batch_forward_time_s = other.forward_time_s if other else None
            m.small_batch_backward_time_s = other.backward_time_s if other else None
        return out

    def fingerprint(self) -> str:
        """Hash of what a plan depends on structurally: parameter names, shapes, dtypes, trainability."""
        return model_fingerprint([(p.name, p.shape, p.dtype, p.requires_grad) for p in self.params])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = format_tag(KIND)
        d["fingerprint"] = self.fingerprint()
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<profile>") -> "ModelProfile":
        check_format(data, KIND, source)
        params = [from_fields(ParamInfo, p, f"{source}: params[{i}]") for i, p in enumerate(require(data, "params", list, source))]
        modules = [from_fields(ModuleInfo, m, f"{source}: modules[{i}]") for i, m in enumerate(require(data, "modules", list, source))]
        for i, p in enumerate(params):
            if p.index != i:
                raise FormatError(f"{source}: params[{i}].index is {p.index}, expected {i}")
            if p.bytes < 0 or p.numel < 0:
                raise FormatError(f"{source}: params[{i}] ({p.name}) has negative size")
        prof = cls(
            model=require(data, "model", str, source),
            batch_size=require(data, "batch_size", int, source),
            forward_time_s=float(require_number(data, "forward_time_s", source)),
            backward_time_s=float(require_number(data, "backward_time_s", source)),
            optimizer_time_s=float(require_number(data, "optimizer_time_s", source)),
            params=params,
            modules=modules,
            steps_measured=int(require_number(data, "steps_measured", source, default=1, minimum=0)),
            meta=require_mapping(data, "meta", source),
            small_batch_size=data.get("small_batch_size"),
        )
        small = prof.small_batch_size
        if small is not None and (not isinstance(small, int) or isinstance(small, bool)
                                  or not 0 < small < prof.batch_size):
            raise FormatError(f"{source}: field 'small_batch_size' must be an integer in [1, batch_size), got {small!r}")
        for name in ("forward_time_s", "backward_time_s", "optimizer_time_s"):
            if getattr(prof, name) < 0:
                raise FormatError(f"{source}: field {name!r} must be >= 0, got {getattr(prof, name)}")
        return prof

    def save(self, path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path) -> "ModelProfile":
        return cls.from_dict(read_json(path, KIND), str(path))


def model_fingerprint(entries: list[tuple[str, list[int], str, bool]]) -> str:
    """Stable hash of (name, shape, dtype, requires_grad) per parameter."""
    canon = json.dumps([[n, list(s), d, bool(r)] for n, s, d, r in entries], separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]
