"""The training configuration: typed dataclasses, loadable from TOML, overridable from flags.

Precedence is defaults < config file (TOML, or the JSON that `caramel train` writes for its
workers) < command-line flags. Every field carries its help text with its unit and its flag
name, so `--help` and the TOML sections are generated from one place and cannot drift apart.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caramel.errors import CaramelError
from caramel.jsonio import check_format, format_tag

CONFIG_KIND = "train-config"


def opt(default: Any, help: str, *, flag: str | None = None, choices: tuple[str, ...] | None = None, minimum: float | None = None):
    """A config field: default, help text (with unit), optional flag name, choices and lower bound."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices, "minimum": minimum})


@dataclass
class RunConfig:
    workload: str = opt("char_gpt", "what to train: char_gpt (byte-level GPT on the Python standard library's source), digits (a small CNN on scikit-learn's 8x8 digits) or ddrl (DDRL features fitted across the workers, then an MLP head, on the same digits)", choices=("char_gpt", "digits", "ddrl"))
    steps: int = opt(240, "optimizer steps to train in total (steps); the LR schedule spans them", minimum=1)
    stop_after_steps: int = opt(0, "stop (with a checkpoint) after this step, as a time-boxed or preempted job would; resume later with --resume auto (steps; 0 = run to --steps)", minimum=0)
    seed: int = opt(0, "random seed for model init, data order and dropout (integer)", minimum=0)
    out_dir: str = opt("runs/train", "directory for metrics, trace, summary and checkpoints (path)")
    log_every_steps: int = opt(10, "refresh the progress bar's loss and speed every N steps (metrics.jsonl gets every step) (steps)", minimum=1)
    val_every_steps: int = opt(0, "run validation every N steps, and always at the end (steps; 0 = only at the end)", minimum=0)
    script: str = opt("", "run this user training script (path.py) on the workers instead of a built-in workload; it calls caramel.parallelize itself (path; empty = built-in workload)")


@dataclass
class DataConfig:
    batch_size: int = opt(16, "samples per worker per step (samples); the global batch is workers x batch_size", minimum=1)
    seq_len: int = opt(64, "char_gpt context length (tokens = bytes)", minimum=2)
    text_bytes: int = opt(2_000_000, "char_gpt: bytes of standard-library source to read (bytes)", minimum=1000)
    val_fraction: float = opt(0.1, "fraction of the data held out for validation (fraction in (0, 1))", minimum=0.0)
    remainder: str = opt("drop", "what to do with the samples that do not fill a whole global batch at the end of an epoch: drop them, or pad by repeating samples from the start of the epoch", choices=("drop", "pad"))
    shuffle: bool = opt(True, "reshuffle the training set every epoch (seeded by --seed and the epoch)")
    url: str = opt("", "read the training batches from this data store (path, file://, http(s)://, s3:// URL) through caramel.data's loader (shard cache, loader workers, locality sampler) instead of the built-in training set; write one with `caramel data make DIR --workload NAME` (empty = in memory)", flag="--data")
    cache_dir: str = opt("", "--data: local directory of each rank's shard cache (path; empty = OUT_DIR/data-cache)", flag="--cache-dir")
    cache_budget_mib: int = opt(1024, "--data: shard cache size per rank on local disk (MiB)", minimum=0)
    loader_workers: int = opt(2, "--data: loader worker processes per rank, prefetching ahead of the step (count; 0 = load in the training process)", minimum=0)
    data_order: str = opt("locality", "--data: sample order: locality (each rank reads its own 1/W of the store, cached shards first) or global (the in-memory run's global shuffle: the same batches, every rank reading most shards)", choices=("locality", "global"))


@dataclass
class ModelConfig:
    d_model: int = opt(128, "char_gpt: embedding width; digits, ddrl: hidden width (features)", minimum=1)
    layers: int = opt(2, "char_gpt: transformer blocks; digits, ddrl: hidden layers (count)", minimum=1)
    heads: int = opt(4, "char_gpt: attention heads; must divide d_model (count)", minimum=1)
    dropout: float = opt(0.1, "dropout probability (fraction in [0, 1))", minimum=0.0)


@dataclass
class OptimConfig:
    optimizer: str = opt("adamw", "torch optimizer", choices=("adamw", "adam", "sgd"))
    lr: float = opt(3e-3, "peak learning rate (per step, unitless)", minimum=0.0)
    weight_decay: float = opt(0.01, "weight decay (unitless)", minimum=0.0)
    momentum: float = opt(0.9, "sgd momentum (unitless)", minimum=0.0)
    warmup_steps: int = opt(20, "linear LR warm-up (steps)", minimum=0)
    schedule: str = opt("cosine", "LR schedule after warm-up: cosine decay to min_lr_ratio x lr, or constant", choices=("cosine", "constant"))
    min_lr_ratio: float = opt(0.1, "final LR of the cosine schedule as a fraction of lr (fraction)", minimum=0.0)
    clip_grad_norm: float = opt(0.0, "clip the global gradient norm to this value (L2 norm; 0 = no clipping); with the caramel engine this waits for every reduction before any update, which removes the forward overlap", minimum=0.0)


@dataclass
class ParallelConfig:
    workers: int = opt(2, "worker processes on this machine, or hosts on the emulated cluster (count); ignored under torchrun, which sets WORLD_SIZE", minimum=1)
    strategy: str = opt("caramel", "how workers keep in step: NAME[:key=value,...] with the options caramel.parallelize takes, e.g. caramel, caramel:overlap=forward,planner=fifo, ddp, ddp:bucket_cap_mb=50")
    cluster: str = opt("auto", "where the workers run: on (the emulated multi-host cluster: network namespaces, shaped links; needs root and iproute2), off (plain local workers on loopback), or auto (on when root with iproute2 and not under torchrun or --max-restarts, else off)", choices=("auto", "on", "off"))
    bandwidth: str = opt("", "emulated cluster: link rate per host, tc syntax (e.g. 500mbit, 1gbit; empty = 1gbit with --cluster auto, unshaped with --cluster on)")
    max_restarts: int = opt(0, "torchrun --max-restarts: restart failed workers this many times; restarted workers resume from the last checkpoint (count)", minimum=0)
    timeout_s: float = opt(300.0, "collective timeout (seconds)", minimum=1.0)
    slow_worker: str = opt("", "emulate a straggler: RANK:FACTOR makes that worker's forward + backward FACTOR times slower with a calibrated delay, not a CPU quota (e.g. 1:2; empty = none)")


@dataclass
class CheckpointConfig:
    every_steps: int = opt(100, "write a checkpoint every N steps, and always at the end (steps; 0 = only at the end)", flag="--checkpoint-every", minimum=0)
    keep_last: int = opt(3, "keep only the newest N checkpoints (count)", flag="--keep-last", minimum=1)
    resume: str = opt("none", "none (fresh start: old checkpoints in the checkpoint dir are removed), auto (newest valid checkpoint, or fresh if there is none) or a checkpoint directory (path)", flag="--resume")
    dir: str = opt("", "checkpoint directory (path; empty = OUT_DIR/checkpoints)", flag="--checkpoint-dir")


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else Path(self.run.out_dir) / "checkpoints"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> dict[str, Any]:
        """The versioned JSON form (what workers and checkpoints receive)."""
        return {"format": format_tag(CONFIG_KIND), "config": self.to_dict()}

    def describe(self) -> str:
        """The effective config as TOML-like text, one section per block (printed at start)."""
        lines = []
        for section, values in self.to_dict().items():
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        return "\n".join(lines)


SECTIONS: dict[str, type] = {f.name: f.type if isinstance(f.type, type) else globals()[f.type] for f in dataclasses.fields(TrainConfig)}


def _fields(section: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])}


def _typ(f: dataclasses.Field) -> type:
    return {"int": int, "float": float, "str": str, "bool": bool}[f.type] if isinstance(f.type, str) else f.type


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def coerce(section: str, name: str, value: Any, source: str) -> Any:
    """Check and convert one value for `section.name`; a CaramelError names the key and what is expected."""
    fields = _fields(section)
    if name not in fields:
        raise CaramelError(f"{source}: unknown key {section}.{name!r}; expected one of {', '.join(sorted(fields))}")
    f = fields[name]
    typ = _typ(f)
    key = flag_name(f) if source == "command line" else f"{section}.{name}"
    if typ is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            value = value.lower() in ("true", "1", "yes")
        if not isinstance(value, bool):
            raise CaramelError(f"{source}: {key} must be true or false, got {value!r}")
    elif typ is int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise CaramelError(f"{source}: {key} must be an integer ({f.metadata['help']}), got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise CaramelError(f"{source}: {key} must be an integer ({f.metadata['help']}), got {value!r}")
    elif typ is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise CaramelError(f"{source}: {key} must be a number ({f.metadata['help']}), got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise CaramelError(f"{source}: {key} must be a number ({f.metadata['help']}), got {value!r}")
        value = float(value)
    elif not isinstance(value, str):
        raise CaramelError(f"{source}: {key} must be a string ({f.metadata['help']}), got {value!r}")
    choices, minimum = f.metadata.get("choices"), f.metadata.get("minimum")
    if choices and value not in choices:
        raise CaramelError(f"{source}: {key} is {value!r}; expected one of {', '.join(choices)}")
    if minimum is not None and value < minimum:
        raise CaramelError(f"{source}: {key} must be >= {minimum:g} ({f.metadata['help']}), got {value!r}")
    return value


def apply_dict(cfg: TrainConfig, data: Any, source: str, check: bool = True) -> TrainConfig:
    """Override `cfg` from a nested {section: {key: value}} mapping, checking every key and value
    (and, with `check`, the fields together: `validate`)."""
    if not isinstance(data, dict):
        raise CaramelError(f"{source}: expected a table of sections ({', '.join(SECTIONS)}), got {type(data).__name__}")
    for section, values in data.items():
        if section not in SECTIONS:
            raise CaramelError(f"{source}: unknown section [{section}]; expected one of {', '.join(SECTIONS)}")
        if not isinstance(values, dict):
            raise CaramelError(f"{source}: [{section}] must be a table of keys, got {values!r}")
        for name, value in values.items():
            setattr(getattr(cfg, section), name, coerce(section, name, value, source))
    return validate(cfg, source) if check else cfg


def load_file(path: str | Path, cfg: TrainConfig | None = None, check: bool = True) -> TrainConfig:
    """Read a TOML config (or the JSON `caramel train` writes for its workers) over `cfg` (defaults);
    `check=False` leaves `validate` to the caller (flags still to come may complete the file)."""
    path = Path(path)
    cfg = cfg or TrainConfig()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CaramelError(f"config {path}: no such file (expected a TOML file with sections {', '.join(SECTIONS)})") from None
    except IsADirectoryError:
        raise CaramelError(f"config {path}: is a directory (expected a TOML file)") from None
    if path.suffix == ".json":
        try:
            data = check_format(json.loads(raw.decode()), CONFIG_KIND, str(path)).get("config")
        except UnicodeDecodeError:
            raise CaramelError(f"config {path}: not a UTF-8 text file (expected caramel.train-config/1 JSON)") from None
        except json.JSONDecodeError as e:
            raise CaramelError(f"config {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict):
            raise CaramelError(f"config {path}: field 'config' must be an object of sections")
    else:
        try:
            data = tomllib.loads(raw.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise CaramelError(f"config {path}: not valid TOML ({e})") from None
    return apply_dict(cfg, data, f"config {path}", check)


def validate(cfg: TrainConfig, source: str = "config") -> TrainConfig:
    """Checks that span several fields."""
    if not 0.0 < cfg.data.val_fraction < 1.0:
        raise CaramelError(f"{source}: data.val_fraction must be in (0, 1), got {cfg.data.val_fraction}")
    if not 0.0 <= cfg.model.dropout < 1.0:
        raise CaramelError(f"{source}: model.dropout must be in [0, 1), got {cfg.model.dropout}")
    if cfg.run.workload == "char_gpt" and cfg.model.d_model % cfg.model.heads:
        raise CaramelError(f"{source}: model.heads ({cfg.model.heads}) must divide model.d_model ({cfg.model.d_model})")
    if cfg.parallel.bandwidth and cfg.parallel.cluster == "off":
        raise CaramelError(f"{source}: parallel.bandwidth ({cfg.parallel.bandwidth!r}) shapes the emulated cluster's links; use --cluster on or drop --bandwidth")
    from caramel.strategies import STRATEGIES
    try:
        spec = STRATEGIES.spec(cfg.parallel.strategy)
    except CaramelError as e:
        raise CaramelError(f"{source}: parallel.strategy: {e}") from None
    if spec.info.name == "pipeline" and not cfg.run.script:
        if cfg.run.workload == "char_gpt":
            raise CaramelError(f"{source}: parallel.strategy pipeline cannot cut workload char_gpt (its input embedding "
                               f"is tied to its output layer, which would sit on the first and the last stage); "
                               f"use --workload digits or ddrl")
        if cfg.optim.clip_grad_norm > 0:
            raise CaramelError(f"{source}: parallel.strategy pipeline does not clip gradients (each stage updates on "
                               f"its own worker inside the pipeline's step); set optim.clip_grad_norm to 0")
    if cfg.parallel.slow_worker:
        from caramel.profile.slowdown import parse_slow_worker
        parse_slow_worker(cfg.parallel.slow_worker, f"{source}: parallel.slow_worker")
    if getattr(spec.options, "dedicated", False):
        raise CaramelError(f"{source}: parallel.strategy {cfg.parallel.strategy!r}: caramel train does not run dedicated "
                           f"ps servers yet (its data shards, validation and checkpoints span every rank); drop "
                           f"dedicated=true, or run your own script with `caramel cluster run --ps-servers N`")
    if cfg.data.url:
        from caramel.train.store_data import check_config
        check_config(cfg, source)
    else:
        _check_store_only(cfg, source)
    if cfg.parallel.bandwidth:
        from caramel.units import parse_rate_bps
        try:
            parse_rate_bps(cfg.parallel.bandwidth)
        except CaramelError as e:
            raise CaramelError(f"{source}: parallel.bandwidth: {e}") from None
    return cfg


STORE_ONLY = ("cache_dir", "cache_budget_mib", "loader_workers", "data_order")  # DataConfig fields only --data reads


def _check_store_only(cfg: TrainConfig, source: str) -> None:
    """An option only --data reads, given without it, is an error rather than ignored."""
    given = [(f, getattr(cfg.data, f.name)) for f in dataclasses.fields(DataConfig)
             if f.name in STORE_ONLY and getattr(cfg.data, f.name) != f.default]
    if given:
        names = ", ".join(f"{flag_name(f)} {value}" for f, value in given)
        raise CaramelError(f"{source}: {names}: only used with --data URL (without it the batches come from the "
                           f"in-memory training set); give --data or drop {'them' if len(given) > 1 else 'it'}")


# --- command line ---------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per config field, grouped by section; defaults stay unset so the file/defaults show through."""
    for section in SECTIONS:
        group = parser.add_argument_group(f"[{section}]")
        for f in dataclasses.fields(SECTIONS[section]):
            typ, help_text = _typ(f), f.metadata["help"]
            help_text += f" (default: {f.default!r})"
            dest = f"cfg__{section}__{f.name}"
            if typ is bool:
                group.add_argument(flag_name(f), dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            else:
                metavar = {int: "N", float: "X", str: "STR"}[typ] if not f.metadata.get("choices") else None
                group.add_argument(flag_name(f), dest=dest, default=None, metavar=metavar, choices=f.metadata.get("choices"),
                                   help=help_text)


def from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then `--config FILE`, then every flag the user gave."""
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in vars(args).items():
        if key.startswith("cfg__") and value is not None:
            _, section, name = key.split("__", 2)
            overrides.setdefault(section, {})[name] = value
    config = getattr(args, "config", None)
    if not config:
        return apply_dict(TrainConfig(), overrides, "command line")
    # the fields are checked together once the flags are in: a file may set --loader-workers
    # for the --data URL a flag gives
    cfg = apply_dict(load_file(config, check=False), overrides, "command line", check=False)
    return validate(cfg, f"config {config} with the command line" if overrides else f"config {config}")
