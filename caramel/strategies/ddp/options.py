"""DDP's own knobs, as `DistributedDataParallel` names them, plus the priority of its threads."""
from __future__ import annotations

from dataclasses import dataclass, field

from caramel.errors import CaramelError
from caramel.runtime.comm_priority import COMM_PRIORITIES


@dataclass(frozen=True)
class DdpOptions:
    """`comm_priority`: "normal" runs DDP on the job's own group, as users run it; "auto" or
    "realtime" give DDP a gloo group of its own whose threads get the priority Caramel gives its
    own (CPU tensors only), so the two can be compared like for like."""

    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_priority: str = field(default="normal", metadata={"choices": COMM_PRIORITIES})

    def __post_init__(self) -> None:
        if self.bucket_cap_mb <= 0:
            raise CaramelError(f"bucket_cap_mb must be positive, got {self.bucket_cap_mb!r}")
