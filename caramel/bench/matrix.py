"""What a bench runs: strategies, configurations, and the default and `--quick` matrices.

A *strategy* is how gradients are synchronized: `ddp` (PyTorch DDP, default settings),
`caramel` (default planner and overlap), or a variant such as
`caramel:planner=fifo,overlap=backward`. A *configuration* is one launched job: a model at a
batch size on N workers behind links of one rate. Within a configuration every strategy, and
the compute-only and communication-only baselines, run interleaved in rounds.

The matrices are defined by what each point means: a model and a target comm/compute ratio.
The link rate that gives that ratio is derived at run start from the compute time measured on
this host (`caramel.bench.rates`), so a faster or slower host keeps every point in its regime.
A rate can still be pinned (`bandwidth`) for what-ifs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from caramel.bench.hetero import check_jitter, check_slow_link
from caramel.errors import CaramelError
from caramel.strategies.options import parse_spec
from caramel.units import format_rate, parse_rate_bps

# Baselines are measured in every configuration; they are not strategies a user selects.
BASELINES = ("compute", "comm", "concurrent")
# Both DDP variants run by default: the reference of every row is the stronger of them.
# The tuned one screens DDP's bucket caps in the job (`caramel.bench.screening`): the strongest DDP.
DEFAULT_STRATEGIES = ("ddp", "ddp:comm_priority=realtime", "ddp:bucket_cap_mb=tuned,comm_priority=realtime", "caramel")
# --quick leaves the tuned one out: its 7 extra DDP builds and screening would about double a quick job
QUICK_STRATEGIES = tuple(s for s in DEFAULT_STRATEGIES if "=tuned" not in s)
# comm/compute below BALANCED_MIN_RATIO is compute-bound, above COMM_BOUND_MIN_RATIO comm-bound.
BALANCED_MIN_RATIO = 0.75
COMM_BOUND_MIN_RATIO = 1.5
REGIMES = ("compute-bound", "balanced", "comm-bound")


def regime_of_ratio(ratio: float) -> str:
    """The regime a comm/compute ratio falls in."""
    if ratio < BALANCED_MIN_RATIO:
        return "compute-bound"
    return "balanced" if ratio <= COMM_BOUND_MIN_RATIO else "comm-bound"


# `KEY=tuned` in a bench strategy: the bench screens these values of that option in the job and
# runs the fastest (`caramel.bench.screening`, where the grid is justified). None: the option
# left unset (torch's default buckets: a 1 MB first bucket, then 25 MB).
TUNED = "tuned"
BUCKET_CAP_GRID_MB: tuple[float | None, ...] = (None, 0.25, 0.5, 1.0, 2.0, 4.0, 25.0)
TUNABLE: dict[tuple[str, str], tuple[Any, ...]] = {("ddp", "bucket_cap_mb"): BUCKET_CAP_GRID_MB}


def value_label(value: Any) -> str:
    """A grid value as the reports write it: `default` for the option left unset."""
    return "default" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Strategy:
    """One registered strategy with the options a bench entry set (`caramel.strategies`)."""

    kind: str
    options: tuple[tuple[str, Any], ...] = ()
    tuned: tuple[str, ...] = ()
    """options given as `tuned`: the bench screens their grid (TUNABLE) in the job and runs the fastest"""

    @property
    def name(self) -> str:
        """The canonical spelling, used as the strategy's name in every report (`KEY=tuned` kept)."""
        name = self.spec().name
        if not self.tuned:
            return name
        kind, _, rest = name.partition(":")
        items = (rest.split(",") if rest else []) + [f"{k}={TUNED}" for k in self.tuned]
        return kind + ":" + ",".join(sorted(items, key=lambda item: item.partition("=")[0]))

    def spec(self):
        """The typed `StrategySpec` (validated against the strategy's options dataclass); a tuned
        option is left at its default here (`candidates()` sets it)."""
        from caramel.strategies import STRATEGIES
        return STRATEGIES.spec(self.kind, dict(self.options))

    def candidates(self) -> list[tuple[Any, "Strategy"]]:
        """(value, concrete strategy) per value of the tuned option's grid, in grid order; [] when
        nothing is tuned. A None value leaves the option unset (its default)."""
        if not self.tuned:
            return []
        (key,) = self.tuned  # split_tuned allows one: TUNABLE has one option per kind
        out = []
        for value in TUNABLE[(self.kind, key)]:
            options = dict(self.options) if value is None else {**dict(self.options), key: value}
            out.append((value, Strategy(self.kind, tuple(sorted(options.items())))))
        return out

    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "options": self.option_dict(), "name": self.name}
        return dict(out, tuned=list(self.tuned)) if self.tuned else out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Strategy":
        return cls(data["kind"], tuple(sorted(data.get("options", {}).items())), tuple(data.get("tuned", ())))


def split_tuned(text: str, kind: str, options: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The options of `text` without those given as `tuned`, and those names; a clear error for
    `tuned` on an option the bench does not screen, and for a word other than `tuned` where a
    tunable option expects a number."""
    tunable = ", ".join(f"{k}:{o}={TUNED}" for k, o in TUNABLE)
    fixed: dict[str, Any] = {}
    tuned: list[str] = []
    for key, value in options.items():
        screened = (kind, key) in TUNABLE
        if value == TUNED and screened:
            tuned.append(key)
        elif value == TUNED:
            raise CaramelError(f"strategy {text!r}: {key}={TUNED}: the bench screens only {tunable}; give {key} a value")
        elif screened and isinstance(value, str):
            grid = ", ".join(value_label(v) for v in TUNABLE[(kind, key)])
            raise CaramelError(f"strategy {text!r}: {key}={value!r}: expected a number or {TUNED!r} (the bench "
                               f"screens {grid} in the job and runs the fastest)")
        else:
            fixed[key] = value
    return fixed, tuple(tuned)


def parse_strategy(text: str) -> Strategy:
    """`caramel:planner=fifo,overlap=backward` -> Strategy, checked by the strategy registry:
    the same names, types and errors as `caramel.parallelize` and `caramel train --strategy`;
    `ddp:bucket_cap_mb=tuned` leaves the cap to the bench's screening (`caramel.bench.screening`)."""
    from caramel.strategies import STRATEGIES

    name, options = parse_spec(text)
    kind = STRATEGIES.get(name).name
    fixed, tuned = split_tuned(text, kind, options)
    spec = STRATEGIES.spec(kind, fixed)
    if getattr(spec.options, "dedicated", False):
        raise CaramelError(f"strategy {text!r}: caramel bench does not run dedicated ps servers yet (every bench rank "
                           f"trains); time them with examples/ps_servers.py under caramel cluster run --ps-servers N")
    return Strategy(spec.info.name, tuple(sorted(fixed.items())), tuned)


def parse_strategies(text: str) -> list[Strategy]:
    """A comma-separated list where commas inside `kind:...` options are kept: `ddp,caramel:planner=fifo,overlap=none`."""
    parts: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            raise CaramelError(f"--strategies {text!r}: empty entry; expected e.g. ddp,caramel")
        # `key=value` without a kind continues the options of the previous strategy.
        if "=" in piece and ":" not in piece and parts:
            parts[-1] += "," + piece
        else:
            parts.append(piece)
    strategies = [parse_strategy(p) for p in parts]
    names = [s.name for s in strategies]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CaramelError(f"--strategies {text!r}: {', '.join(dup)} listed twice")
    return strategies


@dataclass
class BenchConfig:
    """One configuration: one launched job of `workers` processes.

    A point of a matrix gives `comm_ratio` (the target comm/compute) and no `bandwidth`; the
    rate is derived at run start and filled in (`with_rate`). A pinned `bandwidth` is used as
    given; neither runs on unshaped loopback.
    """

    model: str
    """zoo name or path/to/file.py:factory"""
    workers: int
    bandwidth: str | None = None
    """tc rate (e.g. 300mbit); None: derived from comm_ratio, or unshaped loopback without one"""
    batch_size: int | None = None
    """per-worker batch; None uses the model factory's default"""
    model_options: dict[str, Any] = field(default_factory=dict)
    """extra keyword arguments for the zoo factory (e.g. width=16)"""
    regime: str = "custom"
    """the regime the point stands for: from comm_ratio, else custom (the measured one is reported)"""
    comm_ratio: float | None = None
    """target comm/compute: the ring all-reduce of the gradients takes this many compute steps"""
    calibrated_compute_s: float | None = None
    """the compute step measured at run start that the rate was derived from (None: pinned rate)"""
    slow_worker: list | None = None
    """[rank, factor]: that worker's compute made factor times slower (`caramel.bench.straggler`)"""
    slow_link: list | None = None
    """[rank, factor]: that worker's link at the others' rate / factor (`caramel.bench.hetero`)"""
    jitter: list | None = None
    """[rank, fraction, seed]: that worker's step time varies by up to +/-fraction (`caramel.bench.hetero`)"""
    nproc_per_node: int = 1
    """ranks per emulated host: `workers` ranks on `hosts` hosts, consecutive ranks sharing one
    host's link (torchrun's LOCAL_WORLD_SIZE; ps hierarchical=true aggregates within a host)"""

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise CaramelError(f"workers must be a positive integer, got {self.workers!r}")
        k = self.nproc_per_node
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or self.workers % k:
            raise CaramelError(f"nproc_per_node must be a positive integer dividing the {self.workers} workers "
                               f"(ranks per host), got {k!r}")
        if k > 1 and self.workers // k < 2:  # one host: no link between hosts, the shaped rate unused
            raise CaramelError(f"nproc_per_node {k}: several ranks per host need 2+ hosts (--workers), got "
                               f"{self.workers // k} host of {k} ranks")
        if k > 1:
            given = [n for n, v in (("slow_worker", self.slow_worker), ("slow_link", self.slow_link),
                                    ("jitter", self.jitter), ("comm_ratio", self.comm_ratio)) if v is not None]
            if given:
                raise CaramelError(f"nproc_per_node {k} (several ranks per host) takes a pinned bandwidth and no "
                                   f"uneven workers; got {', '.join(given)}")
        if self.bandwidth is not None:
            self.bandwidth = format_rate(parse_rate_bps(self.bandwidth))
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise CaramelError(f"batch size must be a positive integer, got {self.batch_size!r}")
        if self.slow_worker is not None:
            self.slow_worker = check_slow_worker(self.slow_worker, self.workers)
        if self.slow_link is not None:
            self.slow_link = check_slow_link(self.slow_link, self.workers)
        if self.jitter is not None:
            self.jitter = check_jitter(self.jitter, self.workers)
        if self.comm_ratio is not None:
            r = self.comm_ratio
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r <= 0:
                raise CaramelError(f"comm/compute ratio must be a positive number, got {r!r}")
            if self.workers < 2:
                raise CaramelError(f"a comm/compute ratio needs 2 or more workers (one worker sends nothing), got {self.workers}")
            self.comm_ratio = float(r)
            if self.regime == "custom":
                self.regime = regime_of_ratio(self.comm_ratio)

    @property
    def bandwidth_bps(self) -> float | None:
        return None if self.bandwidth is None else parse_rate_bps(self.bandwidth)

    @property
    def hosts(self) -> int:
        """The emulated hosts (each with one shaped link) the `workers` ranks run on."""
        return self.workers // self.nproc_per_node

    @property
    def needs_rate(self) -> bool:
        """A ratio-defined point whose rate is not derived yet."""
        return self.comm_ratio is not None and self.bandwidth is None

    @property
    def rate_source(self) -> str | None:
        """derived (from comm_ratio at run start), pinned (given), or None (unshaped loopback)."""
        if self.bandwidth is None:
            return None
        return "derived" if self.comm_ratio is not None and self.calibrated_compute_s is not None else "pinned"

    def with_rate(self, bandwidth: str, compute_s: float) -> "BenchConfig":
        """This point with the rate derived from `compute_s`."""
        return replace(self, bandwidth=bandwidth, calibrated_compute_s=compute_s)

    @property
    def workload_key(self) -> tuple:
        """What a compute measurement depends on: model, batch, options, workers."""
        return (self.model, self.batch_size, tuple(sorted(self.model_options.items())), self.workers)

    @property
    def label(self) -> str:
        opts = "".join(f",{k}={v}" for k, v in sorted(self.model_options.items()))
        batch = f",b={self.batch_size}" if self.batch_size else ""
        from caramel.bench.labels import heterogeneity_suffix, layout_suffix

        slow = heterogeneity_suffix(self.slow_worker, self.slow_link, self.jitter) + layout_suffix(self.workers,
                                                                                                   self.nproc_per_node)
        return f"{self.model}({batch.lstrip(',')}{opts}) x{self.workers} @ {self.link_label}{slow}"

    @property
    def link_label(self) -> str:
        if self.bandwidth is None:
            return f"comm/compute {self.comm_ratio:g}" if self.comm_ratio is not None else "loopback"
        return self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BenchConfig":
        return cls(**data)


def check_slow_worker(value: Any, workers: int) -> list:
    """`[rank, factor]` from a list or `RANK:FACTOR` text (`RANK=FACTOR` too); a clear error otherwise."""
    if isinstance(value, str):
        rank, sep, factor = value.replace("=", ":").partition(":")
        try:
            value = [int(rank), float(factor)] if sep else None
        except ValueError:
            value = None
        if value is None:
            raise CaramelError("--slow-worker expects RANK:FACTOR, e.g. 1:2 (rank 1 computes 2x slower)")
    rank, factor = value
    if not (isinstance(rank, int) and 0 <= rank < workers):
        raise CaramelError(f"slow worker rank must be between 0 and {workers - 1}, got {rank!r}")
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1):
        raise CaramelError(f"slow worker factor must be a number >= 1 (1: not slowed), got {factor!r}")
    return [rank, float(factor)]


@dataclass
class BenchSettings:
    """How long and how each configuration is measured."""

    rounds: int = 5
    """rounds of interleaving; each round runs every strategy and baseline once"""
    steps_per_round: int = 8
    """measured steps per strategy per round"""
    warmup_steps: int = 3
    """unmeasured steps per strategy before the first round (planning, allocator, caches)"""
    lr: float = 0.01
    seed: int = 0
    timeout_s: float = 300.0
    """process-group timeout and, times the number of strategies, the job's wall-clock limit"""
    screen_rounds: int = 4
    """rounds of one block per grid value when a strategy has a tuned option (`caramel.bench.screening`)"""

    def __post_init__(self) -> None:
        for name in ("rounds", "steps_per_round", "screen_rounds"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise CaramelError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise CaramelError(f"warmup-steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not self.timeout_s > 0:
            raise CaramelError(f"timeout must be positive, got {self.timeout_s!r}")


_RESNET = dict(model="resnet18", batch_size=8, model_options={"width": 16})

# ResNet-18 on 2 workers compute-bound, balanced and communication-bound; GPT-2 (a large tied
# embedding) communication-bound; 4 workers sharing the cores, balanced. Ratios, not rates: the
# rates follow this host's compute speed (caramel.bench.rates).
DEFAULT_MATRIX: list[BenchConfig] = [
    BenchConfig(**_RESNET, workers=2, comm_ratio=0.5),
    BenchConfig(**_RESNET, workers=2, comm_ratio=1.0),
    BenchConfig(**_RESNET, workers=2, comm_ratio=2.0),
    BenchConfig(model="gpt2", batch_size=2, workers=2, comm_ratio=2.0),
    BenchConfig(**_RESNET, workers=4, comm_ratio=1.0),
]
# 10 rounds: step times are noisy on a small host, and fewer paired rounds leave the speedup
# interval too wide to tell a few-percent difference (docs/results/notes.md, "Bench rounds").
DEFAULT_SETTINGS = BenchSettings(rounds=10, steps_per_round=8, warmup_steps=3)

QUICK_MATRIX: list[BenchConfig] = [
    BenchConfig(**_RESNET, workers=2, comm_ratio=0.5),
    BenchConfig(**_RESNET, workers=2, comm_ratio=2.0),
]
QUICK_SETTINGS = BenchSettings(rounds=3, steps_per_round=4, warmup_steps=1, screen_rounds=3)
