"""What a bench runs: strategies, configurations, and the default and `--quick` matrices.

A *strategy* is how gradients are synchronized: `ddp` (PyTorch DDP, default settings),
`caramel` (default planner and overlap), or a variant such as
`caramel:planner=fifo,overlap=backward`. A *configuration* is one launched job: a model at a
batch size on N workers behind links of one bandwidth. Within a configuration every strategy,
and the compute-only and communication-only baselines, run interleaved in rounds.

The matrices were chosen by measuring on a 2-core host with one thread per worker (see
docs/benchmarks.md): the same ResNet-18 is made compute-bound, balanced or
communication-bound by the link rate alone, so the comparison isolates the network. The
regime a report shows is the *measured* one (comm-only / compute-only of the same job): on a
host busy with other work compute slows down and every configuration drifts toward
compute-bound.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from caramel.errors import CaramelError
from caramel.runtime.comm_priority import COMM_PRIORITIES
from caramel.units import format_rate, parse_rate_bps

# Strategy kinds the harness knows, with the options each accepts (option -> type).
STRATEGY_OPTIONS: dict[str, dict[str, type]] = {
    "ddp": {"bucket_cap_mb": float, "gradient_as_bucket_view": bool, "find_unused_parameters": bool,
            "static_graph": bool,
            # not torch's: DDP on a gloo group of its own whose threads get the priority the engine
            # gives its own (caramel.runtime.comm_priority); "normal", DDP as users run it, by default
            "comm_priority": str},
    # caramel passes any further option through to the planner (planner_options).
    "caramel": {"planner": str, "overlap": str, "split_tied": bool, "comm_priority": str},
}
# Baselines are measured in every configuration; they are not strategies a user selects.
BASELINES = ("compute", "comm", "concurrent")
OVERLAPS = ("auto", "forward", "backward", "none")
DEFAULT_STRATEGIES = ("ddp", "caramel")


@dataclass(frozen=True)
class Strategy:
    """One way to synchronize gradients, parsed from `kind[:key=value,...]`."""

    kind: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        """The canonical spelling, used as the strategy's name in every report."""
        if not self.options:
            return self.kind
        return self.kind + ":" + ",".join(f"{k}={_format_value(v)}" for k, v in self.options)

    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "options": self.option_dict(), "name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Strategy":
        return cls(data["kind"], tuple(sorted(data.get("options", {}).items())))


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_strategy(text: str) -> Strategy:
    """`caramel:planner=fifo,overlap=backward` -> Strategy; clear errors for anything else."""
    text = text.strip()
    kind, _, rest = text.partition(":")
    if kind not in STRATEGY_OPTIONS:
        raise CaramelError(f"strategy {text!r}: unknown kind {kind!r}; expected one of {', '.join(STRATEGY_OPTIONS)} "
                           f"optionally followed by :key=value,... (e.g. caramel:planner=fifo,overlap=backward)")
    options: dict[str, Any] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise CaramelError(f"strategy {text!r}: option {item!r} is not key=value (e.g. planner=fifo)")
            if key in options:
                raise CaramelError(f"strategy {text!r}: option {key!r} given twice")
            options[key] = _parse_value(value)
    known = STRATEGY_OPTIONS[kind]
    for key, value in options.items():
        if key in known:
            want = known[key]
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = options[key] = float(value)
            if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
                raise CaramelError(f"strategy {text!r}: option {key}={_format_value(value)} must be a {want.__name__}")
        elif kind == "ddp":
            raise CaramelError(f"strategy {text!r}: ddp has no option {key!r}; expected one of {', '.join(known)}")
    if kind == "caramel" and "planner" in options:
        from caramel.strategies.planners import planner_names

        if options["planner"] not in planner_names():
            raise CaramelError(f"strategy {text!r}: unknown planner {options['planner']!r}; expected one of "
                               f"{', '.join(planner_names())} (options are separated by commas: "
                               f"caramel:planner=fifo,overlap=backward)")
    if kind == "caramel" and "overlap" in options and options["overlap"] not in OVERLAPS:
        raise CaramelError(f"strategy {text!r}: overlap must be one of {', '.join(OVERLAPS)}, got {options['overlap']!r}")
    if options.get("comm_priority", "auto") not in COMM_PRIORITIES:
        raise CaramelError(f"strategy {text!r}: comm_priority must be one of {', '.join(COMM_PRIORITIES)}, "
                           f"got {options['comm_priority']!r}")
    if kind == "ddp" and options.get("bucket_cap_mb", 1.0) <= 0:
        raise CaramelError(f"strategy {text!r}: bucket_cap_mb must be positive")
    return Strategy(kind, tuple(sorted(options.items())))


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
    """One configuration: one launched job of `workers` processes on links of `bandwidth`."""

    model: str
    """zoo name or path/to/file.py:factory"""
    workers: int
    bandwidth: str | None
    """tc rate (e.g. 300mbit); None runs on unshaped loopback"""
    batch_size: int | None = None
    """per-worker batch; None uses the model factory's default"""
    model_options: dict[str, Any] = field(default_factory=dict)
    """extra keyword arguments for the zoo factory (e.g. width=16)"""
    regime: str = "custom"
    """what the configuration was chosen to exercise: compute-bound, balanced, comm-bound, custom"""

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise CaramelError(f"workers must be a positive integer, got {self.workers!r}")
        if self.bandwidth is not None:
            self.bandwidth = format_rate(parse_rate_bps(self.bandwidth))
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise CaramelError(f"batch size must be a positive integer, got {self.batch_size!r}")

    @property
    def bandwidth_bps(self) -> float | None:
        return None if self.bandwidth is None else parse_rate_bps(self.bandwidth)

    @property
    def label(self) -> str:
        opts = "".join(f",{k}={v}" for k, v in sorted(self.model_options.items()))
        batch = f",b={self.batch_size}" if self.batch_size else ""
        return f"{self.model}({batch.lstrip(',')}{opts}) x{self.workers} @ {self.bandwidth or 'loopback'}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BenchConfig":
        return cls(**data)


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

    def __post_init__(self) -> None:
        for name in ("rounds", "steps_per_round"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise CaramelError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise CaramelError(f"warmup-steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not self.timeout_s > 0:
            raise CaramelError(f"timeout must be positive, got {self.timeout_s!r}")


_RESNET = dict(model="resnet18", batch_size=8, model_options={"width": 16})

# 2 workers across the three regimes by link rate alone, a GPT-2-style transformer with a large
# tied embedding, and 4 workers sharing the 2 cores, spanning comm/compute from about 0.5 to 2.
# The rates are set from the comm-only baseline, which follows the link: ResNet-18/16's 2.8 MB of
# gradients take 15.0, 37.5 and 61.0 ms at 1500, 600 and 375 mbit with two workers; GPT-2
# (batch 2, 16.9 MB) takes 108.5 ms at 1250 mbit; four workers' ring takes ~70 ms at 500 mbit.
# Compute is what moves: this host has run two workers' ResNet-18/16 step in 30-31 ms (every
# published run since 2026-12-04 20:31) and in 40-43 ms (most runs before), GPT-2's in 52-54 and
# 65-73 ms; four workers time-share the cores at 65-70 ms. So the ResNet rows measure
# comm/compute ~0.49, ~1.2 and ~2.0 on the faster host and ~0.36, ~0.9 and ~1.5 on the slower,
# GPT-2 ~2.0 and ~1.5, four workers ~1.0: on the slower host the comm-bound rows would measure
# as balanced, at the 1.5 line, and still count in the geomean (docs/benchmarks.md: the
# measured regime is the one reported and counted).
DEFAULT_MATRIX: list[BenchConfig] = [
    BenchConfig(**_RESNET, workers=2, bandwidth="1500mbit", regime="compute-bound"),
    BenchConfig(**_RESNET, workers=2, bandwidth="600mbit", regime="balanced"),
    BenchConfig(**_RESNET, workers=2, bandwidth="375mbit", regime="comm-bound"),
    BenchConfig(model="gpt2", batch_size=2, workers=2, bandwidth="1250mbit", regime="comm-bound"),
    BenchConfig(**_RESNET, workers=4, bandwidth="500mbit", regime="balanced"),
]
# 10 rounds: step times vary 10-20% from step to step here, and a speedup's 95% interval from 4
# rounds was about +-5%, too wide to tell a 3% difference; 10 rounds take the matrix to ~7 minutes.
DEFAULT_SETTINGS = BenchSettings(rounds=10, steps_per_round=8, warmup_steps=3)

QUICK_MATRIX: list[BenchConfig] = [
    BenchConfig(**_RESNET, workers=2, bandwidth="1500mbit", regime="compute-bound"),
    BenchConfig(**_RESNET, workers=2, bandwidth="375mbit", regime="comm-bound"),
]
QUICK_SETTINGS = BenchSettings(rounds=3, steps_per_round=4, warmup_steps=1)
