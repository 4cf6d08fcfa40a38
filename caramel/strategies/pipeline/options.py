"""The pipeline strategy's knobs: how many stages, microbatches, which schedule, where to cut."""
from __future__ import annotations

from dataclasses import dataclass, field

from caramel.errors import CaramelError

SCHEDULES = ("1f1b", "gpipe", "interleaved", "pipedream")


@dataclass(frozen=True)
class PipelineOptions:
    """`stages`: pipeline stages in all (for "interleaved", a multiple of the workers per pipeline;
    each worker then holds stages/workers of them). `microbatches`: pieces each step's batch is
    cut into. `schedule`: "gpipe", "1f1b", "interleaved" (synchronous, torch's schedules) or
    "pipedream" (asynchronous 1F1B with weight stashing, an update per microbatch).
    `partition`: "auto" (PipeDream's dynamic program over per-layer costs) or the first layer
    index of every stage after the first, e.g. "3" or "2+5" (`+`-separated on the command line).
    `replicas`: data-parallel copies of each stage (hybrid); the world is stages x replicas
    (stages / stages-per-worker x replicas for "interleaved").
    `vertical_sync`: "pipedream" only: every stage runs a microbatch with the weight version
    the first stage used for it, so a microbatch sees one consistent model."""

    stages: int = 2
    microbatches: int = 4
    schedule: str = field(default="1f1b", metadata={"choices": SCHEDULES})
    partition: str | int = "auto"  # an int: the one cut of two stages (as the command line parses "3")
    replicas: int = 1
    vertical_sync: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.partition, int) and not isinstance(self.partition, bool):
            object.__setattr__(self, "partition", str(self.partition))
        if self.stages < 1:
            raise CaramelError(f"stages must be >= 1, got {self.stages!r}")
        if self.microbatches < 1:
            raise CaramelError(f"microbatches must be >= 1, got {self.microbatches!r}")
        if self.replicas < 1:
            raise CaramelError(f"replicas must be >= 1, got {self.replicas!r}")
        if self.vertical_sync and self.schedule != "pipedream":
            raise CaramelError(f"vertical_sync applies to schedule=pipedream only, not {self.schedule!r}")
        if self.schedule == "1f1b" and self.microbatches < self.stages:
            raise CaramelError(f"schedule=1f1b needs microbatches >= stages ({self.stages}), got {self.microbatches}")
        self.boundaries()  # a malformed partition is an error now, not at the first step

    def boundaries(self) -> list[int] | None:
        """The explicit partition as a list of stage start indices, or None for "auto"."""
        return parse_partition(self.partition, self.stages)


def parse_partition(partition: str | list[int] | tuple[int, ...], stages: int) -> list[int] | None:
    """"auto" -> None; "3" / "2+5" / [2, 5] -> the first layer index of stages 1.. (increasing)."""
    if isinstance(partition, str):
        if partition == "auto":
            return None
        try:
            cuts = [int(p) for p in partition.replace(",", "+").split("+")]
        except ValueError:
            raise CaramelError(f"partition must be 'auto' or increasing layer indices like '2+5', "
                               f"got {partition!r}") from None
    elif isinstance(partition, (list, tuple)) and all(isinstance(p, int) and not isinstance(p, bool) for p in partition):
        cuts = list(partition)
    else:
        raise CaramelError(f"partition must be 'auto' or a list of layer indices, got {partition!r}")
    if len(cuts) != stages - 1:
        raise CaramelError(f"partition {partition!r} gives {len(cuts) + 1} stages; stages={stages} needs "
                           f"{stages - 1} boundaries")
    if any(c < 1 for c in cuts) or any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise CaramelError(f"partition {partition!r}: boundaries must be increasing layer indices >= 1")
    return cuts
