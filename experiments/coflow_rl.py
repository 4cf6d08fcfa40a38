"""Coflow scheduling by RL against the classic heuristics, on held-out synthetic traces (issue 33,
part 2; docs/rl-scheduling.md).

    python -m experiments.coflow_rl --objective cct --ppo total_timesteps=20000 \
        --json docs/results/rl/coflow_cct.json

    python -m experiments.coflow_rl --objective weighted_jct --teacher rollout --train-trace num_jobs=6 \
        --ppo width=64 --improve rounds=3,episodes=60,epochs=30,learning_rate=1e-3 --test-seeds 0:20 \
        --rollout-baseline --json docs/results/rl/coflow_weighted_jct_improved.json

    python -m experiments.coflow_rl --objective weighted_jct --teacher rollout --train-trace num_jobs=6 \
        --ppo width=64 --improve rounds=3,episodes=60,epochs=30,learning_rate=1e-3 --val-seeds 500:540 \
        --test-seeds 0:100 --decode greedy,greedy:1,greedy:3,sample:8:2 --save-policy policy.pt --json out.json

    python -m experiments.coflow_rl --objective weighted_jct --ppo width=64 --load-policy policy.pt \
        --test-seeds 0:100 --decode greedy,check:3 --json out.json

Trains the candidate-scoring policy on traces with the training seeds, by PPO alone (`--teacher
none`) or by imitating the rollout of the base heuristic (`--teacher rollout`,
caramel.sched.improve; then `--finetune-steps` of PPO if asked), then runs FIFO, SCF, SEBF,
weighted SEBF, weighted SRJF and the policy under each `--decode` (caramel.sched.coflow.decode;
`greedy`: one forward pass per event) on traces with the disjoint validation and test seeds, and
on larger traces (`--large`) the policy never saw; with `--rollout-baseline`, the rollout itself
too (a lookahead, reported apart from the policy). Reports each scheduler's mean objective, its
solve time per trace, and each learned row against the base and the best heuristic per trace
(mean difference with its 95% interval, wins, losses). `--save-policy`/`--load-policy` keep a
trained policy, so a setting picked on validation seeds runs once on the test seeds (the policy
file keeps its training seeds, and those are checked disjoint from the evaluated ones).
`greedy[:M]` is online (it sees only released jobs); `check:M` and `sample:N` are offline planners
(they roll out or replay the whole trace, future arrivals included): each report lists them
under "offline".
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from caramel.jsonio import FormatError, format_tag, read_json, write_json
from caramel.sched.coflow import HEURISTICS, TraceOptions, simulate, synthetic_trace
from caramel.sched.coflow.decode import Decoding, decode, parse_decoding, policy_logits
from caramel.sched.coflow.env import CoflowEnv, EnvOptions
from caramel.sched.coflow.rollout import rollout_scheduler, rollout_teacher
from caramel.sched.improve import ImproveOptions, improve
from caramel.sched.rl import PpoOptions, make_ppo, num_policy_parameters, train_ppo
from experiments.rl_common import options_from, ratio_summary, seed_range, summary

METRIC = {"cct": "avg_cct_s", "weighted_jct": "avg_weighted_jct_s"}


def evaluate(env: CoflowEnv, trace: TraceOptions, seeds: list[int], model, metric: str, rollout: bool,
             decodings: list[Decoding], decode_seed: int) -> dict:
    """Every heuristic, the policy under each decoding (`ppo` greedy, `ppo_<decoding>`; "offline"
    lists the rows that need the whole trace in advance: check:M, sample:N, the rollout) and,
    with `rollout`, the rollout on the traces of `seeds`; the report of `_report`."""
    logits = policy_logits(model)
    methods = {name: (lambda w, h=h: simulate(w, h)) for name, h in HEURISTICS.items()}
    counts: dict[str, dict[str, list[int]]] = {"checks": {}, "decisions": {}}
    offline = [f"ppo_{d.name}" for d in decodings if not d.online] + (["rollout"] if rollout else [])

    def decoded(w, d: Decoding, name: str):
        out = decode(env, w, logits, d, decode_seed)
        if d.check is not None or d.arrived is not None:
            counts["checks"].setdefault(name, []).append(out.checks)
        if d.arrived is not None:
            counts["decisions"].setdefault(name, []).append(len(out.decisions))
        return out.result
    for d in decodings:
        name = "ppo" if d == Decoding() else f"ppo_{d.name}"
        methods[name] = lambda w, d=d, name=name: decoded(w, d, name)
    if rollout:
        scheduler = rollout_scheduler(env.base_scheduler, env.options.objective, env.options.max_candidates)
        methods["rollout"] = lambda w: simulate(w, scheduler)
    per: dict[str, list[float]] = {name: [] for name in methods}
    solve_s: dict[str, list[float]] = {name: [] for name in methods}
    for s in seeds:
        w = synthetic_trace(trace, s)
        for name, run in methods.items():
            start = time.perf_counter()
            per[name].append(getattr(run(w), metric))
            solve_s[name].append(time.perf_counter() - start)
    raw = {"seeds": [seeds[0], seeds[-1] + 1], "trace": vars(trace), "per_trace": per, "solve_s_per_trace": solve_s,
           "counts_per_trace": counts, "offline": offline}
    return _report(raw, env.options.base)


def _report(raw: dict, base_name: str) -> dict:
    """From the per-trace values (`raw`: seeds, trace, per_trace, solve_s_per_trace,
    counts_per_trace, offline): each scheduler's mean and solve time, and per trace each learned
    method's objective over the best heuristic's, the base's and (for the policy's other
    decodings) the greedy policy's (mean with a 95% t-interval over the traces, wins, losses);
    for `arrived:*` the decisions per trace and the solve time per decision."""
    per, solve_s, counts = raw["per_trace"], raw["solve_s_per_trace"], raw["counts_per_trace"]
    n = len(next(iter(per.values())))
    best = [min(per[h][i] for h in HEURISTICS) for i in range(n)]
    best_name = [min(HEURISTICS, key=lambda h: per[h][i]) for i in range(n)]
    report = {**raw, "schedulers": {m: summary(v) for m, v in per.items()},
              "solve_s": {m: summary(v) for m, v in solve_s.items()},
              "best_heuristic_per_trace": {h: best_name.count(h) for h in HEURISTICS if h in best_name},
              "checks_per_trace": {m: summary(v) for m, v in counts["checks"].items()},
              "decisions_per_trace": {m: summary(v) for m, v in counts["decisions"].items()},
              "solve_s_per_decision": {m: summary([t / max(k, 1) for t, k in zip(solve_s[m], v)])
                                       for m, v in counts["decisions"].items()}, "vs": {}}
    for name in (m for m in per if m not in HEURISTICS):  # "ppo": the learned policy, however trained
        refs = [("best_heuristic", best), ("base", per[base_name])]
        if name.startswith("ppo_") and "ppo" in per:
            refs.append(("policy", per["ppo"]))
        report["vs"][name] = {ref: _versus(per[name], values) for ref, values in refs}
        report["vs"][name]["time_vs_base"] = ratio_summary([a / b for a, b in zip(solve_s[name], solve_s[base_name])])
    return report


_MERGED_KEYS = ("seeds", "trace", "offline", "per_trace", "solve_s_per_trace", "counts_per_trace")


def _check_part(part: dict, where: str) -> None:
    """A part `merge_reports` can join: the keys it reads (reports written before --merge
    existed lack `offline` and the per-trace solve times and counts) and one value per seed of
    its range in every per-trace list."""
    missing = [k for k in _MERGED_KEYS if k not in part]
    if missing:
        raise SystemExit(f"--merge: {where} has no {', '.join(missing)}: it predates --merge support; rerun its "
                         f"seed range with this version of the experiment")
    n = part["seeds"][1] - part["seeds"][0]
    rows = [(f"{key}[{m!r}]", v) for key in ("per_trace", "solve_s_per_trace") for m, v in part[key].items()]
    rows += [(f"counts_per_trace[{k!r}][{m!r}]", v) for k, c in part["counts_per_trace"].items() for m, v in c.items()]
    for name, values in rows:
        if len(values) != n:
            raise SystemExit(f"--merge: {where} is on seeds {part['seeds']} ({n} traces) but its {name} holds "
                             f"{len(values)} values; expected one per seed")


def merge_reports(parts: list[dict], base_name: str, names: list[str] | None = None) -> dict:
    """One report from reports on consecutive seed ranges of the same traces and rows (a run
    split across processes); refuses parts that do not line up (`names`: how errors call them)."""
    for i, part in enumerate(parts):
        _check_part(part, names[i] if names else f"part {i}")
    parts = sorted(parts, key=lambda r: r["seeds"][0])
    for a, b in zip(parts, parts[1:]):
        if a["seeds"][1] != b["seeds"][0] or a["trace"] != b["trace"] or list(a["per_trace"]) != list(b["per_trace"]) \
                or a["offline"] != b["offline"]:
            raise SystemExit(f"--merge: the parts on seeds {a['seeds']} and {b['seeds']} are not consecutive ranges "
                             f"of the same trace options and rows")

    def joined(key: str) -> dict:
        return {m: [x for r in parts for x in r[key][m]] for m in parts[0][key]}
    counts = {k: {m: [x for r in parts for x in r["counts_per_trace"][k][m]] for m in parts[0]["counts_per_trace"][k]}
              for k in ("checks", "decisions")}
    raw = {"seeds": [parts[0]["seeds"][0], parts[-1]["seeds"][1]], "trace": parts[0]["trace"],
           "per_trace": joined("per_trace"), "solve_s_per_trace": joined("solve_s_per_trace"),
           "counts_per_trace": counts, "offline": parts[0]["offline"]}
    return _report(raw, base_name)


def _versus(values: list[float], reference: list[float]) -> dict:
    """Per trace value / reference - 1 in percent (mean, 95% interval), the ratio of the means,
    wins and losses (beyond 1e-9 relative)."""
    return {"pct": ratio_summary([100 * (p / b - 1) for p, b in zip(values, reference)]),
            "pct_of_means": 100 * (float(np.mean(values)) / float(np.mean(reference)) - 1),
            "wins": int(sum(p < b * (1 - 1e-9) for p, b in zip(values, reference))),
            "losses": int(sum(p > b * (1 + 1e-9) for p, b in zip(values, reference)))}


def _print(key: str, r: dict) -> None:
    print(f"{key} (seeds {r['seeds'][0]}:{r['seeds'][1]}): "
          + ", ".join(f"{n} {v['mean']:.5f}" for n, v in r["schedulers"].items()))
    for name, vs in r["vs"].items():
        b, t = vs["best_heuristic"], vs["time_vs_base"]
        ci = "[{:+.2f}, {:+.2f}]".format(*b["pct"]["ci95"]) if b["pct"]["ci95"] else ""
        print(f"  {name} vs best heuristic {b['pct']['mean']:+.3f}% {ci} ({b['wins']} wins, {b['losses']} losses),"
              f" vs base {vs['base']['pct']['mean']:+.3f}%; time {t['mean']:.1f}x the base's"
              + (f", vs the greedy policy {vs['policy']['pct']['mean']:+.3f}%" if "policy" in vs else "")
              + (f", {1e3 * r['solve_s_per_decision'][name]['mean']:.2f} ms per decision"
                 if name in r.get("solve_s_per_decision", {}) else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objective", default="cct", choices=sorted(METRIC))
    ap.add_argument("--trace", default="", help="TraceOptions as key=value,... (training and test traces)")
    ap.add_argument("--train-trace", action="append", default=None,
                    help="TraceOptions of the training traces (default: --trace); repeat it to label episodes of "
                         "each (the imitation; PPO alone trains on the first)")
    ap.add_argument("--large", default="num_jobs=30", help="TraceOptions of the larger held-out traces; 'none' "
                                                           "to skip them")
    ap.add_argument("--env", default="", help="EnvOptions as key=value,... (default base: the best heuristic "
                                              "of the objective, sebf for cct, weighted_srjf for weighted_jct)")
    ap.add_argument("--ppo", default="", help="PpoOptions as key=value,...")
    ap.add_argument("--teacher", default=None, choices=("none", "rollout"),
                    help="none: PPO alone; rollout: imitate the base heuristic's rollout (then --finetune-steps of PPO)")
    ap.add_argument("--improve", default="", help="ImproveOptions as key=value,... (with --teacher rollout)")
    ap.add_argument("--finetune-steps", type=int, default=None, help="PPO steps after imitation (with --teacher)")
    ap.add_argument("--rollout-baseline", action="store_true", help="also run the rollout itself (slow lookahead)")
    ap.add_argument("--decode", default="greedy", help="comma-separated decodings of the policy: greedy, greedy:M "
                                                       "(leave the base's pick only by a logit margin over M), "
                                                       "check:M (roll out the policy's proposal against the base's "
                                                       "pick where within M of it; offline: rolls out to the trace's "
                                                       "end, future arrivals included), sample:N or sample:N:T (the "
                                                       "best of N schedules drawn at temperature T; offline, it "
                                                       "needs the whole trace)")
    ap.add_argument("--large-decode", default="greedy", help="the decodings on the larger traces (--large)")
    ap.add_argument("--decode-seed", type=int, default=0)
    ap.add_argument("--train-seeds", default=None, help="training traces (default 1000:1256)")
    ap.add_argument("--val-seeds", default=None, help="validation traces (settings are chosen on these); "
                                                      "'none' to skip")
    ap.add_argument("--test-seeds", default="0:40", help="held-out test traces; 'none' to skip")
    ap.add_argument("--save-policy", default=None, help="write the trained policy (and how it was trained) here")
    ap.add_argument("--load-policy", default=None, help="evaluate a policy --save-policy wrote; no training")
    ap.add_argument("--json", default=None)
    ap.add_argument("--merge", default=None, help="comma-separated reports of this script on consecutive seed "
                                                  "ranges (one run split across processes): write them as one "
                                                  "to --json; no other flag")
    args = ap.parse_args(argv)
    if args.merge is not None:
        return _merge_files(args, _given_flags(ap, argv))
    training_flags = [flag for flag, value in (("--teacher", args.teacher), ("--improve", args.improve or None),
                                               ("--finetune-steps", args.finetune_steps),
                                               ("--train-trace", args.train_trace), ("--train-seeds", args.train_seeds))
                      if value is not None]
    if args.load_policy and training_flags:
        raise SystemExit(f"--load-policy {args.load_policy} evaluates a trained policy; {', '.join(training_flags)} "
                         f"shape training and would be ignored: drop them (the policy file records its training)")
    args.teacher = args.teacher or "none"
    args.finetune_steps = 0 if args.finetune_steps is None else args.finetune_steps
    torch.set_num_threads(1)
    trace = options_from(TraceOptions, args.trace, "trace")
    large = None if args.large == "none" else options_from(TraceOptions, args.large, "large")
    train_traces = [trace] if args.train_trace is None else [options_from(TraceOptions, t, "train-trace")
                                                             for t in args.train_trace]
    env_text = args.env or f"objective={args.objective},base={'sebf' if args.objective == 'cct' else 'weighted_srjf'}"
    env_opts = options_from(EnvOptions, env_text, "env")
    if env_opts.objective != args.objective:
        raise SystemExit(f"--env objective={env_opts.objective} differs from --objective {args.objective}")
    ppo = options_from(PpoOptions, args.ppo, "ppo")
    decodings, large_decodings = ([parse_decoding(d) for d in text.split(",")]
                                  for text in (args.decode, args.large_decode))
    for flag, decs in (("--decode", decodings), ("--large-decode", large_decodings)):
        names = [d.name for d in decs]
        if len(set(names)) < len(names):
            raise SystemExit(f"{flag} {getattr(args, flag[2:].replace('-', '_'))!r}: decodings {names} repeat a "
                             f"name (one row each); give each once")
    if Decoding() not in decodings or Decoding() not in large_decodings:
        raise SystemExit("--decode and --large-decode must include greedy (the policy's own row, 'ppo')")
    saved = None
    if args.load_policy:
        # weights_only: the file holds a state_dict and plain dicts/lists, nothing to unpickle
        saved = torch.load(args.load_policy, weights_only=True)
        if "train_seeds" not in saved.get("training", {}):
            raise SystemExit(f"--load-policy {args.load_policy}: the file does not record the seeds the policy was "
                             f"trained on, so the held-out seeds cannot be checked disjoint; retrain with "
                             f"--save-policy")
        train = list(range(*saved["training"]["train_seeds"]))
    else:
        train = seed_range(args.train_seeds or "1000:1256")
    test = [] if args.test_seeds == "none" else seed_range(args.test_seeds)
    val = [] if args.val_seeds in (None, "none") else seed_range(args.val_seeds)
    for a, b, what in ((train, test, "training and test"), (train, val, "training and validation"),
                       (val, test, "validation and test")):
        if set(a) & set(b):
            trained = f" (the policy's, from {args.load_policy})" if saved is not None and a is train else ""
            raise SystemExit(f"{what} seeds overlap{trained}; the test and validation traces must be held out")
    if not test and not val:
        raise SystemExit("nothing to evaluate: give --test-seeds or --val-seeds")
    if args.teacher == "none" and (args.improve or args.finetune_steps):
        raise SystemExit("--improve, --finetune-steps shape the imitation of a teacher; pass --teacher too")
    if args.finetune_steps < 0:
        raise SystemExit(f"--finetune-steps must be >= 0, got {args.finetune_steps}")
    improve_opts = options_from(ImproveOptions, args.improve, "improve")
    if saved is not None:
        if saved["training"]["env"] != vars(env_opts) or saved["training"]["ppo"] != vars(ppo):
            raise SystemExit(f"--load-policy {args.load_policy}: trained with env {saved['training']['env']} and "
                             f"ppo {saved['training']['ppo']}; pass the same --env and --ppo")
        model = make_ppo(CoflowEnv(trace, [0], env_opts), ppo)  # the spaces come from the env options only
        model.policy.load_state_dict(saved["state_dict"])
        training = {**saved["training"], "loaded_from": args.load_policy}
    else:
        train_envs = [CoflowEnv(t, train, env_opts) for t in train_traces]
        train_env = train_envs[0]
        start = time.perf_counter()
        rounds = []
        if args.teacher == "none":
            model = train_ppo(train_env, ppo)
        else:
            model = make_ppo(train_env, ppo)
            rounds = improve(model, train_envs, rollout_teacher, improve_opts)
            if args.finetune_steps > 0:
                model.learn(total_timesteps=args.finetune_steps)
        traces = [vars(t) for t in train_traces]
        training = {
            "env": vars(env_opts), "train_trace": traces if len(traces) > 1 else traces[0], "ppo": vars(ppo),
            "teacher": args.teacher,
            "improve": vars(improve_opts) if args.teacher != "none" else None, "improve_rounds": rounds,
            "finetune_steps": args.finetune_steps if args.teacher != "none" else None,
            "train_seeds": [train[0], train[-1] + 1], "train_s": time.perf_counter() - start}
        print(f"trained ({args.teacher}) in {training['train_s']:.0f} s")
    if args.save_policy:
        torch.save({"state_dict": model.policy.state_dict(), "training": training}, args.save_policy)
    metric = METRIC[args.objective]
    env = CoflowEnv(trace, [0], env_opts)
    report = {"experiment": "coflow_rl", "objective": args.objective, "metric": metric, **training,
              "policy_parameters": num_policy_parameters(model), "torch_threads": 1,
              "decode": [d.name for d in decodings], "large_decode": [d.name for d in large_decodings],
              "decode_seed": args.decode_seed}
    ev = dict(model=model, metric=metric, decode_seed=args.decode_seed)
    for key, seeds, opts, rollout, decs in (
            ("validation", val, trace, False, decodings), ("validation_large", val, large, False, large_decodings),
            ("held_out", test, trace, args.rollout_baseline, decodings),
            ("held_out_large", test, large, False, large_decodings)):
        if seeds and opts is not None:
            report[key] = evaluate(env, opts, seeds, rollout=rollout, decodings=decs, **ev)
            _print(key, report[key])
    print(f"{report['policy_parameters']} policy parameters")
    if args.json:
        write_json(args.json, {"format": format_tag("coflow-rl"), **report})
    return 0


def _given_flags(ap: argparse.ArgumentParser, argv: list[str] | None) -> list[str]:
    """The flags given in `argv`, even at their default value: `argv` parsed again with every
    default None (`set_defaults`; no given option parses to None), so the options not None were
    given. It leaves `ap` with those defaults."""
    ap.set_defaults(**dict.fromkeys(vars(ap.parse_args([]))))
    return ["--" + dest.replace("_", "-") for dest, value in vars(ap.parse_args(argv)).items() if value is not None]


def _merge_files(args, given: list[str]) -> int:
    """`--merge A,B,... --json OUT`: the reports' evaluations joined by `merge_reports`; the rest
    (training, decodings) must be the same in every part; `given`: the flags on the command line."""
    others = [flag for flag in given if flag not in ("--merge", "--json")]
    if others or not args.json:
        raise SystemExit(f"--merge takes --json OUT and no other flag (got {', '.join(others) or 'no --json'})")
    paths = args.merge.split(",")
    if len(paths) < 2:
        raise SystemExit(f"--merge {args.merge!r}: expected two or more comma-separated reports")
    parts = []
    for path in paths:
        try:
            part = read_json(path, "coflow-rl")
        except FormatError as err:  # a missing, truncated or foreign part: one line naming it
            raise SystemExit(f"--merge: {err}") from None
        part.pop("format", None)
        parts.append(part)
    sections = ("validation", "validation_large", "held_out", "held_out_large")
    rest = [{k: v for k, v in p.items() if k not in sections} for p in parts]
    if any(r != rest[0] for r in rest[1:]) or any({k for k in p if k in sections} != {k for k in parts[0] if k in
                                                                                     sections} for p in parts):
        raise SystemExit(f"--merge: {', '.join(paths)} differ in training, decodings or sections; only runs of one "
                         f"command on consecutive seed ranges merge")
    report = {**rest[0], "merged_from": paths}
    for key in (k for k in sections if k in parts[0]):
        report[key] = merge_reports([p[key] for p in parts], report["env"]["base"],
                                    [f"{path} ({key})" for path in paths])
        _print(key, report[key])
    write_json(args.json, {"format": format_tag("coflow-rl"), **report})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
