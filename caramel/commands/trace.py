"""`caramel trace merge|plot|summary|check`: timelines and metrics from recorded or predicted traces.

Inputs are caramel.trace/1 files: the per-rank files a run writes (`run.rank0.json`, ...), a
directory of them, or one multi-rank file (e.g. the simulator's prediction).
"""
from __future__ import annotations

import argparse
import math
import sys

from caramel.errors import CaramelError
from caramel.jsonio import format_tag, write_json

# action -> (function name in this module, one-line help)
ACTIONS: dict[str, tuple[str, str]] = {
    "merge": ("_merge", "write one Chrome/Perfetto JSON for all ranks (open it in ui.perfetto.dev)"),
    "plot": ("_plot", "draw a PNG timeline of a few steps, measured above predicted"),
    "summary": ("_summary", "per-step metrics: step time, compute, exposed/hidden communication, bandwidth, stragglers"),
    "check": ("_check", "check that a trace executes a plan: every bucket once per step, ready <= issue <= done <= wait"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_action", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    for name, (_, help_text) in ACTIONS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("traces", nargs="+", metavar="TRACE", help="caramel.trace/1 files or directories of per-rank files")
        if name == "merge":
            p.add_argument("-o", "--output", required=True, metavar="OUT.json", help="Chrome trace JSON to write")
            p.add_argument("--no-flows", action="store_true", help="omit the ready -> wait flow arrows")
        if name == "plot":
            p.add_argument("-o", "--output", required=True, metavar="OUT.png", help="PNG to write")
            p.add_argument("--predicted", nargs="+", metavar="TRACE", help="predicted trace(s) (from `caramel simulate`) drawn below")
            p.add_argument("--first-step", type=int, default=1, help="first step to draw, 0-based (default 1: skips warm-up)")
            p.add_argument("--steps", type=int, default=3, help="how many steps to draw (default 3)")
            p.add_argument("--title", default=None, help="figure title")
        if name == "summary":
            p.add_argument("--warmup-steps", type=int, default=0, help="complete steps to skip at the start (default 0)")
            p.add_argument("--predicted", nargs="+", metavar="TRACE", help="predicted trace(s): also report the simulator's step-time error")
        if name == "check":
            p.add_argument("--plan", required=True, metavar="PLAN.json", help="the caramel.plan/1 the run executed")
            p.add_argument("--allow-missing-waits", action="store_true", help="accept buckets that no wait event consumed")
            p.add_argument("--first-step", type=int, default=0, help="check steps from this iteration on (after a re-plan)")
        p.add_argument("--json", metavar="OUT", default=None, help="also write the results as JSON")
        p.set_defaults(_trace_run=globals()[ACTIONS[name][0]])


def run(args: argparse.Namespace) -> int:
    return int(args._trace_run(args) or 0)


def _write_result(path: str | None, kind: str, data: dict) -> None:
    if path:
        write_json(path, {"format": format_tag(kind), **data})


def _merge(args) -> int:
    from caramel.trace.chrome import write_chrome
    from caramel.trace.load import load_traces

    trace = load_traces(args.traces)
    data = write_chrome(trace, args.output, flows=not args.no_flows)
    slices = sum(1 for e in data["traceEvents"] if e["ph"] == "X")
    threads = sum(1 for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name")
    ranks = len({e.rank for e in trace.events})
    print(f"wrote {args.output}: {ranks} rank(s), {slices} events on {threads} lanes, {data['otherData']['flows']} flow arrows")
    _write_result(args.json, "trace_merge", {"output": args.output, "ranks": ranks, "events": slices,
                                             "lanes": threads, "flows": data["otherData"]["flows"]})
    return 0


def _plot(args) -> int:
    from caramel.trace.load import load_traces
    from caramel.trace.plot import PlotConfig, plot_timeline

    measured = load_traces(args.traces)
    predicted = load_traces(args.predicted) if args.predicted else None
    cfg = PlotConfig(first_step=args.first_step, num_steps=args.steps, title=args.title)
    plot_timeline(measured, args.output, predicted=predicted, config=cfg)
    print(f"wrote {args.output}")
    _write_result(args.json, "trace_plot", {"output": args.output, "first_step": args.first_step, "steps": args.steps,
                                            "predicted": bool(predicted)})
    return 0


def _nan_to_none(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _summary(args) -> int:
    from caramel.trace.load import load_traces
    from caramel.trace.summary import compare, format_summary, summarize

    summary = summarize(load_traces(args.traces), warmup_steps=args.warmup_steps)
    print(format_summary(summary))
    data = summary.to_dict()
    if args.predicted:
        pred = summarize(load_traces(args.predicted))
        cmp = compare(summary, pred)
        print(f"predicted      p50 {cmp['predicted_step_time_p50_s'] * 1e3:.2f} ms vs measured "
              f"{cmp['measured_step_time_p50_s'] * 1e3:.2f} ms: error {cmp['step_time_error'] * 100:.1f}%")
        data["prediction"] = {k: _nan_to_none(v) for k, v in cmp.items()}
    if args.json:
        write_json(args.json, data)
    return 0


def _check(args) -> int:
    from caramel.plan.plan import Plan
    from caramel.trace.load import load_traces
    from caramel.trace.validate import inspect_trace

    trace = load_traces(args.traces)
    plan = Plan.load(args.plan)
    result = inspect_trace(trace, plan, require_waits=not args.allow_missing_waits, first_step=args.first_step)
    _write_result(args.json, "trace_check", {"ok": result.ok, "problems": result.problems,
                                             "steps_checked": result.steps_checked,
                                             "buckets_checked": result.buckets_checked})
    if not result.ok:
        for p in result.problems:
            print(f"  {p}", file=sys.stderr)
        raise CaramelError(f"trace does not match plan {args.plan}: {len(result.problems)} problem(s), listed above")
    print(f"ok: {result.buckets_checked} bucket-steps over {result.steps_checked} rank-steps match plan {plan.fingerprint}")
    return 0


__all__ = ["ACTIONS", "add_arguments", "run"]
