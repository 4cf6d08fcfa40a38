"""The `caramel` command: one entry point, one registry of subcommands.

Each subcommand lives in its own module (imported only when used, so `caramel --help` is
fast) that defines `add_arguments(parser)` and `run(args) -> int`. User mistakes
(`CaramelError`) print one line and exit 2, with no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from caramel.errors import CaramelError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("caramel.train.cli", "train a model with Caramel on local workers, the emulated cluster, or under torchrun"),
    "bench": ("caramel.bench.cli", "run strategies side by side (DDP, Caramel variants) and report speedups"),
    "data-bench": ("caramel.bench.data_cli", "data loading side by side on a generated data set (see bench --data URL)"),
    "data": ("caramel.commands.data", "make a sharded data set, or serve one over http behind an emulated link"),
    "profile": ("caramel.commands.profile", "profile a model: per-parameter sizes, gradient-ready and first-use times"),
    "plan": ("caramel.commands.plan", "make a communication plan from a profile and a cluster spec"),
    "simulate": ("caramel.commands.simulate", "predict step time for planners on a (possibly imaginary) cluster"),
    "tune": ("caramel.commands.tune", "search plan knobs with the simulator; the tuner next to random search and TPE"),
    "cluster": ("caramel.cluster.cli", "emulated multi-node cluster on this host (network namespaces + tc)"),
    "trace": ("caramel.commands.trace", "merge, plot and summarize timelines"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # exit 2 with one line, as argparse does, but naming the program path
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, import just that subcommand's module."""
    parser = _Parser(prog="caramel", description="Computation/communication co-scheduling for data-parallel PyTorch training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=name if name in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if not hasattr(args, "_run"):
        parser.error(f"subcommand {args.command!r} is not available")
    try:
        return int(args._run(args) or 0)
    except CaramelError as e:
        print(f"caramel {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"caramel {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
