"""DDP's own knobs, as `DistributedDataParallel` names them, plus the priority of its threads."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from caramel.errors import CaramelError
from caramel.runtime.comm_priority import COMM_PRIORITIES


TORCH_BUCKET_CAP_MB = 25.0  # DistributedDataParallel's default cap
TORCH_FIRST_BUCKET_MB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, used only with the default cap


@dataclass(frozen=True)
class DdpOptions:
    """`bucket_cap_mb`: None (default) leaves torch's own choice, 25 MB buckets after a first one
    of 1 MB that starts reducing early in backward; a value is passed to DDP, which then uses it
    for the first bucket too (torch drops its small first bucket once the cap is given).
    `comm_priority`: "normal" runs DDP on the job's own group, as users run it; "auto" or
    "realtime" give DDP a gloo group of its own whose threads get the priority Caramel gives its
    own (CPU tensors only), so the two can be compared like for like."""

    bucket_cap_mb: float | None = None
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_priority: str = field(default="normal", metadata={"choices": COMM_PRIORITIES})

    def bucket_caps_mb(self) -> tuple[float, float]:
        """(first bucket, later buckets) as torch's DDP sizes them for these options."""
        if self.bucket_cap_mb is None:
            return TORCH_FIRST_BUCKET_MB, TORCH_BUCKET_CAP_MB
        return self.bucket_cap_mb, self.bucket_cap_mb

    def __post_init__(self) -> None:
        c = self.bucket_cap_mb
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0):
            raise CaramelError(f"bucket_cap_mb must be a positive, finite number of megabytes (or None: torch's "
                               f"default), got {c!r}")
