"""The pipeline strategy's knobs: how many stages, microbatches, which schedule, where to cut."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from caramel.errors import CaramelError

SCHEDULES = ("1f1b", "gpipe", "interleaved", "pipedream")
REPLICA_REDUCES = ("auto", "caramel", "ddp")
CARAMEL_REDUCE_SCHEDULES = ("gpipe", "1f1b")  # one stage per rank: one engine per optimizer
UNEQUAL_SCHEDULES = ("gpipe", "1f1b")  # unequal replica counts: torch's schedule per virtual pipeline
# Unequal counts run lcm(counts) virtual pipelines, each a process group and a torch schedule on
# every rank it passes through, and a step needs a multiple of lcm(counts) microbatches (x stages
# for 1f1b). Past 16 the groups and the microbatches (32+ slivers of a batch for 2 stages) cost
# more than a slightly slower layout with friendlier counts (3+4+5 would need 60 groups).
MAX_VIRTUAL_PIPELINES = 16


@dataclass(frozen=True)
class PipelineOptions:
    """`stages`: pipeline stages in all (for "interleaved", a multiple of the workers per pipeline;
    each worker then holds stages/workers of them). `microbatches`: pieces each step's batch is
    cut into, or "auto" (the default): the count whose simulated step is fastest, from per-layer
    times profiled at two microbatch sizes (a fixed cost per microbatch plus one per sample; see
    `microbatches.py`). `schedule`: "gpipe", "1f1b", "interleaved" (synchronous, torch's schedules) or
    "pipedream" (asynchronous 1F1B with weight stashing, an update per microbatch).
    `partition`: "auto" (PipeDream's dynamic program over per-layer costs) or the first layer
    index of every stage after the first, e.g. "3" or "2+5" (`+`-separated on the command line),
    or, for a model that is no `nn.Sequential`, the modules that begin them ("layers.2"), cut by
    torch.distributed.pipelining's tracer.
    `replicas`: data-parallel copies of each stage (hybrid); the world is stages x replicas
    (stages / stages-per-worker x replicas for "interleaved"). Or one count per stage,
    "2+1" (a list [2, 1] from Python): the world is their sum, microbatch m runs on replica
    m mod count of each stage (`unequal.py`; "gpipe" and "1f1b"); equal counts mean one int.
    `replica_reduce`: how a stage's replicas average their gradients once per step: "caramel"
    (Caramel's engine on the replica group, planned from a profile of the stage, updates applied
    lazily in the next step's first forward; `replica_reduce.py`; "gpipe" and "1f1b" only), "ddp"
    (torch DDP around the stage module), or "auto" (the default): "caramel" where it runs, else
    "ddp" (measured faster and tested exact: docs/pipeline.md).
    `vertical_sync`: "pipedream" only: every stage runs a microbatch with the weight version
    the first stage used for it, so a microbatch sees one consistent model.
    `replicas="auto"` ("gpipe", "1f1b"; `auto_replicas.py`): the first rank profiles the model
    and a dynamic program over the world's workers picks the cut and each stage's count,
    the replicas' all-reduce priced from the cluster spec; `stages` fixes the stage count,
    `stages="auto"` lets it choose that too; with a fixed `microbatches` only counts that
    divide it are taken. Every rank then passes the same, whole batch."""

    stages: int | str = 2
    microbatches: int | str = "auto"
    schedule: str = field(default="1f1b", metadata={"choices": SCHEDULES})
    partition: str | int = "auto"  # an int: the one cut of two stages (as the command line parses "3")
    replicas: int | str | list[int] | tuple[int, ...] = 1  # per stage: "2+1" or [2, 1]; or "auto"
    replica_reduce: str = field(default="auto", metadata={"choices": REPLICA_REDUCES})
    vertical_sync: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.partition, int) and not isinstance(self.partition, bool):
            object.__setattr__(self, "partition", str(self.partition))
        if self.replicas == "auto" or self.stages == "auto":
            self._check_auto()
            return
        if not isinstance(self.stages, int) or isinstance(self.stages, bool):
            raise CaramelError(f"stages must be a count >= 1 (or 'auto' with replicas=auto), got {self.stages!r}")
        if self.stages < 1:
            raise CaramelError(f"stages must be >= 1, got {self.stages!r}")
        if isinstance(self.microbatches, str):
            if self.microbatches != "auto":
                raise CaramelError(f"microbatches must be a count >= 1 or 'auto', got {self.microbatches!r}")
        elif self.microbatches < 1:
            raise CaramelError(f"microbatches must be >= 1, got {self.microbatches!r}")
        counts = parse_replicas(self.replicas, self.stages)
        # canonical: one int when every stage has the same count, else "2+1" (prints and parses back)
        object.__setattr__(self, "replicas", counts[0] if len(set(counts)) == 1 else "+".join(map(str, counts)))
        if self.replica_reduce not in REPLICA_REDUCES:
            raise CaramelError(f"replica_reduce must be one of {', '.join(REPLICA_REDUCES)}, "
                               f"got {self.replica_reduce!r}")
        if self.unequal_replicas:
            if self.schedule not in UNEQUAL_SCHEDULES:
                raise CaramelError(f"replicas={self.replicas} (one count per stage) runs with schedule gpipe or 1f1b, "
                                   f"not {self.schedule!r}")
            if self.replica_reduce != "auto":
                raise CaramelError(f"replicas={self.replicas}: unequal replica counts average gradients with a plain "
                                   f"all-reduce per stage; leave replica_reduce=auto, not {self.replica_reduce!r}")
            period = self.replica_period
            if period > MAX_VIRTUAL_PIPELINES:
                raise CaramelError(f"replicas={self.replicas} runs lcm = {period} virtual pipelines (a process group "
                                   f"and >= {period} microbatches each step); at most {MAX_VIRTUAL_PIPELINES} are "
                                   f"allowed: choose counts whose least common multiple is <= {MAX_VIRTUAL_PIPELINES}")
            if isinstance(self.microbatches, int) and self.microbatches % period:
                raise CaramelError(f"replicas={self.replicas} deals microbatches round-robin: microbatches must be a "
                                   f"multiple of {period} (the counts' least common multiple), got {self.microbatches}")
            if (self.schedule == "1f1b" and isinstance(self.microbatches, int)
                    and self.microbatches // period < self.stages):
                raise CaramelError(f"replicas={self.replicas}, schedule=1f1b: each of the {period} virtual pipelines "
                                   f"needs >= stages ({self.stages}) microbatches: microbatches >= "
                                   f"{period * self.stages}, got {self.microbatches}")
        if (self.replica_reduce == "caramel" and self.replica_counts()[0] > 1
                and self.schedule not in CARAMEL_REDUCE_SCHEDULES):
            raise CaramelError(f"replica_reduce=caramel runs with schedule gpipe or 1f1b, not {self.schedule!r} "
                               f"(use replica_reduce=ddp)")
        if self.vertical_sync and self.schedule != "pipedream":
            raise CaramelError(f"vertical_sync applies to schedule=pipedream only, not {self.schedule!r}")
        if self.schedule == "1f1b" and isinstance(self.microbatches, int) and self.microbatches < self.stages:
            raise CaramelError(f"schedule=1f1b needs microbatches >= stages ({self.stages}), got {self.microbatches}")
        self.boundaries()  # a malformed partition is an error now, not at the first step

    def _check_auto(self) -> None:
        """replicas="auto": what the choice needs (`auto_replicas.py`), each refused with what to use."""
        if self.replicas != "auto":
            raise CaramelError(f"stages='auto' is chosen with the replica counts: give replicas=auto too, "
                               f"not replicas={self.replicas!r}")
        if self.stages != "auto" and (not isinstance(self.stages, int) or isinstance(self.stages, bool)
                                      or self.stages < 2):
            raise CaramelError(f"replicas=auto: stages must be a count >= 2 or 'auto', got {self.stages!r}")
        if self.schedule not in UNEQUAL_SCHEDULES:
            raise CaramelError(f"replicas=auto chooses counts for schedule gpipe or 1f1b (unequal counts run only "
                               f"there), not {self.schedule!r}")
        if self.replica_reduce != "auto":
            raise CaramelError(f"replicas=auto: leave replica_reduce=auto (equal counts reduce with Caramel's engine, "
                               f"unequal ones with a plain all-reduce), not {self.replica_reduce!r}")
        if self.partition != "auto":
            raise CaramelError(f"replicas=auto chooses the cut with the counts: leave partition=auto, "
                               f"not {self.partition!r}")
        if isinstance(self.microbatches, str):
            if self.microbatches != "auto":
                raise CaramelError(f"microbatches must be a count >= 1 or 'auto', got {self.microbatches!r}")
        elif self.microbatches < 1:
            raise CaramelError(f"microbatches must be >= 1, got {self.microbatches!r}")
        if self.vertical_sync:
            raise CaramelError("vertical_sync applies to schedule=pipedream only")

    @property
    def auto_replicas(self) -> bool:
        """The counts (and maybe the stages) are chosen at the first step."""
        return self.replicas == "auto"

    def replica_counts(self) -> tuple[int, ...]:
        """The replicas of each stage (equal counts repeated; `interleaved`: one per position)."""
        if self.auto_replicas:
            raise CaramelError("replicas=auto: the counts are chosen at the pipeline's first step")
        if isinstance(self.replicas, int):
            return (self.replicas,) * self.stages
        return tuple(int(c) for c in self.replicas.split("+"))

    @property
    def unequal_replicas(self) -> bool:
        return isinstance(self.replicas, str) and not self.auto_replicas

    @property
    def replica_period(self) -> int:
        """Microbatches before the round-robin repeats: the counts' least common multiple (the
        number of virtual pipelines)."""
        return math.lcm(*self.replica_counts())

    def workers(self, positions: int | None = None) -> int:
        """Workers the job needs: stages x replicas, the counts' sum when they differ
        (`positions`: workers per pipeline, for interleaved)."""
        if self.auto_replicas:
            raise CaramelError("replicas=auto runs on every worker of the job: the counts are chosen to sum to it")
        if self.unequal_replicas:
            return sum(self.replica_counts())
        return (positions or self.stages) * self.replicas

    def replica_reducer(self) -> str:
        """"caramel" or "ddp": what averages the replicas' gradients ("auto" resolved)."""
        if self.replica_reduce != "auto":
            return self.replica_reduce
        return "caramel" if self.schedule in CARAMEL_REDUCE_SCHEDULES else "ddp"

    def boundaries(self) -> list[int] | list[str] | None:
        """The explicit partition as stage start indices or module names, or None for "auto"."""
        if self.auto_replicas:
            return None
        return parse_partition(self.partition, self.stages)


def parse_replicas(replicas: int | str | list | tuple, stages: int) -> tuple[int, ...]:
    """2 -> (2,) * stages; "2+1" / [2, 1] -> (2, 1): one count >= 1 per stage."""
    bad = CaramelError(f"replicas must be a count >= 1 or one count per stage like '2+1', got {replicas!r}")
    if isinstance(replicas, bool):
        raise bad
    if isinstance(replicas, int):
        if replicas < 1:
            raise CaramelError(f"replicas must be >= 1, got {replicas!r}")
        return (replicas,) * stages
    parts = replicas.replace(",", "+").split("+") if isinstance(replicas, str) else list(replicas)
    if not all((isinstance(p, int) and not isinstance(p, bool)) or (isinstance(p, str) and p.strip().isdigit())
               for p in parts):
        raise bad
    counts = tuple(int(p) for p in parts)
    if any(c < 1 for c in counts):
        raise CaramelError(f"replicas {replicas!r}: every stage needs >= 1 replica")
    if len(counts) != stages:
        raise CaramelError(f"replicas {replicas!r} gives {len(counts)} counts; stages={stages} needs one per stage")
    return counts


def parse_partition(partition: str | list | tuple, stages: int) -> list[int] | list[str] | None:
    """"auto" -> None; "3" / "2+5" / [2, 5] -> the first layer index of stages 1.. (increasing,
    for an `nn.Sequential`); "layers.2+layers.4" -> the modules that begin stages 1.. (for any
    model torch.distributed.pipelining can trace and split)."""
    if isinstance(partition, str):
        if partition == "auto":
            return None
        cuts: list = [p.strip() for p in partition.replace(",", "+").split("+")]
    elif isinstance(partition, (list, tuple)):
        cuts = list(partition)
    else:
        raise CaramelError(f"partition must be 'auto', layer indices like '2+5' or module names like "
                           f"'layers.2+layers.4', got {partition!r}")
    if all(isinstance(c, int) or (isinstance(c, str) and c.isdigit()) for c in cuts):
        cuts = [int(c) for c in cuts]
        if any(c < 1 for c in cuts) or any(b <= a for a, b in zip(cuts, cuts[1:])):
            raise CaramelError(f"partition {partition!r}: boundaries must be increasing layer indices >= 1")
    elif not all(isinstance(c, str) and c and not c[0].isdigit() for c in cuts):
        raise CaramelError(f"partition {partition!r}: expected all layer indices (2+5) or all module names "
                           f"(layers.2+layers.4)")
    if len(cuts) != stages - 1:
        raise CaramelError(f"partition {partition!r} gives {len(cuts) + 1} stages; stages={stages} needs "
                           f"{stages - 1} boundaries")
    return cuts
