"""`caramel train`: train a built-in workload or a user's script on local workers, the emulated cluster, or under torchrun.

    caramel train                                   # 2 local workers, byte-level GPT, about a minute
    caramel train --workload digits --steps 200
    caramel train --config run.toml --lr 1e-3       # TOML file, then flags
    caramel train --cluster on --workers 4 --bandwidth 500mbit
    torchrun --nnodes 2 ... -m caramel.cli train    # under torchrun: uses its environment
    caramel train --script my_train.py -- --epochs 3
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from caramel.errors import CaramelError
from caramel.jsonio import write_json
from caramel.train.config import add_arguments as add_config_arguments
from caramel.train.config import from_args
from caramel.train.workers import launch, under_torchrun


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("Every option can also be set in a TOML file (--config) under its [section]; flags override the file.\n"
                     "Arguments after `--` go to the --script. Outputs in OUT_DIR: metrics.jsonl (one JSON line per step and\n"
                     "per validation), summary.json, trace*.json (Caramel engine), checkpoints/ckpt-<step>/.")
    parser.add_argument("--config", metavar="FILE", help="TOML config file with sections [run] [data] [model] [optim] [parallel] [checkpoint] "
                                                         "(or the config.json that caramel train writes for its workers)")
    parser.add_argument("--json", metavar="OUT", help="also write the end-of-run summary (caramel.train-summary/1 JSON) to OUT")
    add_config_arguments(parser)
    parser.add_argument("script_args", nargs="*", metavar="-- SCRIPT_ARGS", help="arguments passed to --script (after `--`)")


def run(args: argparse.Namespace) -> int:
    cfg = from_args(args)
    script_args = list(args.script_args or [])
    if script_args and not cfg.run.script:
        raise CaramelError(f"unexpected arguments {' '.join(script_args)!r}: arguments after `--` are for --script, which is not set")
    rc, summary = launch(cfg, script_args)
    if args.json and rc == 0:
        _write_summary_json(args.json, summary, Path(cfg.run.out_dir) / "summary.json", cfg.run.script)
    return rc


def _write_summary_json(out: str, summary: dict | None, produced: Path, script: str) -> None:
    if summary is not None:
        if not under_torchrun() or _rank() == 0:
            write_json(out, summary)
        return
    if script:
        raise CaramelError(f"--json {out}: a --script run writes its own results; there is no caramel summary to copy")
    if not produced.is_file():
        raise CaramelError(f"--json {out}: the workers finished but wrote no {produced}")
    json.loads(produced.read_text())  # refuse to copy a damaged file
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(produced, out)


def _rank() -> int:
    import os
    return int(os.environ.get("RANK", "0"))
