"""Edge-cloud layer placement: the RL policy against the exact ILP and the greedy heuristics
(issue 33, part 3; docs/rl-scheduling.md).

    python -m experiments.edge_placement --ppo total_timesteps=20000 \
        --json docs/results/rl/edge_placement.json
    python -m experiments.edge_placement --teacher ilp --ppo width=64 \
        --improve rounds=3,episodes=100,epochs=40,learning_rate=1e-3 --test-seeds 0:20 --large-seeds 0:5 \
        --large-time-limit-s 5 --json docs/results/rl/edge_placement_improved.json
    # the same policy decoded greedily and as the best of N sampled placements
    python -m experiments.edge_placement --teacher ilp --ppo width=64 \
        --improve rounds=3,episodes=100,epochs=40,learning_rate=1e-3 --test-seeds 0:20 --large-seeds 0:5 \
        --large-time-limit-s 5 --decode greedy,sample:16,sample:128,sample:1024 \
        --json docs/results/rl/edge_placement_sampled.json

Trains the candidate-scoring policy on random instances with the training seeds (`--train`
options, and `--train-mid` ones too if given), by PPO alone (`--teacher none`) or by imitating a
teacher (caramel.sched.improve: `rollout` of greedy_regret, or `ilp`, the exact best completion;
then `--finetune-steps` of PPO if asked), then on held-out seeds: small instances (`--small`) solved exactly by HiGHS, where
every method's gap to the optimum is reported; large instances (`--large`) where HiGHS gets a
time limit (its best placement and proven lower bound are reported) and the methods are
compared with greedy_regret. The rollout of greedy_regret is reported too, as a lookahead
baseline apart from the policy. `--decode` picks how the policy places (caramel.sched.placement.decode):
`greedy` (row `ppo`) and/or `sample:N` (row `ppo_sample:N`, the cheapest of N rollouts, the
first greedy, the others drawn from the policy with `--decode-seed`). `--decoder fast` (the
default) decodes with the network exported to numpy once after training (`decode_fast`, the
export's time reported apart), `reference` through torch (`decode`, as the results before it
were measured); `--check-reference` also runs the reference on every instance and counts the
instances where it decides exactly the same. `--scheme rounds` trains in `RoundPlacementEnv` and
decodes with `decode_rounds` (a layer of every task per forward pass); `--groups 1,4,8` trains
and decodes one such policy per G, each round split into G groups in greedy_regret's settling
order (rows `ppo_gG`, `ppo_gG_sample:N`), side by side on the same instances; `--search` (rounds)
adds each learned row followed by the local search (`NAME+search`, caramel.sched.placement.local_search)
and the greedy heuristics followed by it (`H+search`); `--finetune-on` continues the imitation
with DAgger rounds on larger instances (`--finetune-teacher`, `--finetune-improve`); `--time-repeats` times
every method several times per instance (the median), and `solve_time_ratio` compares each
decoding's time with each heuristic's, per instance, with a 95% interval. Solve times are wall-clock seconds per instance on
one thread, everything the decoder does per instance included (its tables, every step).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from caramel.errors import CaramelError
from caramel.jsonio import format_tag, write_json
from caramel.sched.placement import HEURISTICS, InstanceOptions, random_instance, solve_ilp
from caramel.sched.improve import ImproveOptions
from caramel.sched.placement.decode import Decoding, decode, parse_decoding
from caramel.sched.placement.env import PlacementEnv
from caramel.sched.placement.fast_decode import NumpyPolicy, decode_fast
from caramel.sched.placement.local_search import SearchOptions, local_search
from caramel.sched.placement.rollout import rollout_placement
from caramel.sched.placement.round_env import RoundPlacementEnv
from caramel.sched.placement.rounds import decode_rounds
from caramel.sched.placement.tables import StepTables
from caramel.sched.rl import PpoOptions, num_policy_parameters
from experiments.placement_focus_check import random_focus_search
from experiments.placement_policy_file import TEACHERS, load_policy, save_policy, train_policies
from experiments.rl_common import options_from, parse_fractions, ratio_summary, seed_range, summary

# the environment the policy trains in, and its decoder (fast, reference) per scheme
SCHEMES = {"sequential": (PlacementEnv, decode_fast, decode), "rounds": (RoundPlacementEnv, decode_rounds, decode_rounds)}


# the heuristics solve times are compared with (all_cloud places in microseconds: a ratio to it says nothing)
RATIO_HEURISTICS = ("greedy_myopic", "greedy_lookahead", "greedy_regret")


def policy_name(decoding: Decoding, groups: int | None = None) -> str:
    """The learned policy's row: `ppo` decoded greedily, `ppo_sample:N` the best of N rollouts;
    with `groups` G (rounds in G groups), `ppo_gG` and `ppo_gG_sample:N`."""
    stem = "ppo" if groups is None else f"ppo_g{groups}"
    return stem if decoding.samples == 1 else f"{stem}_{decoding.name}"


def searched_heuristic(name: str, options: SearchOptions, found: dict | None = None):
    """Heuristic `name`, its placement then improved by `local_search` (the tables built once,
    for both): the baseline a searched policy is compared with. `found`: the search's result
    (`Searched`) is kept there under `name + "+search"`."""
    def solve(inst):
        tables = StepTables(inst)
        result = local_search(inst, HEURISTICS[name](inst, tables), options, tables=tables)
        if found is not None:
            found[name + "+search"] = result
        return result.placement
    return solve


def evaluate(options: InstanceOptions, seeds: list[int], policy, decodings: list[Decoding], decode_seed: int,
             time_limit_s: float, reference: str, rollout: bool, fast: NumpyPolicy | None = None,
             check_reference: bool = False, scheme: str = "sequential", time_repeats: int = 1,
             groups: list[int] | None = None, search: SearchOptions | None = None,
             guided: list[float] | None = None) -> dict:
    """`fast`: the policy's rows decode with `decode_fast` (else the torch reference `decode`);
    `groups` (the rounds scheme): `policy` and `fast` are lists, one policy per G, each decoded
    with its G;
    `search` (the rounds scheme): each learned row also decoded with the local search after it
    (row `NAME+search`), and each heuristic of RATIO_HEURISTICS followed by it (`H+search`);
    `guided` (with `search`): each learned row also followed by the guided search, the fraction
    F of the layers the policy was least sure of tried first (row `NAME+guided:F`), and the
    greedy policy's placement searched with a random focus of F (`ppo+random:F`, the control);
    `check_reference`: also run (and time) the reference decoder on every instance and count
    the instances where it decides exactly as the timed decoder did. Each method is timed
    `time_repeats` times per instance, the repeats interleaved across methods (a burst of host
    load lands on all of them alike), and its median kept."""
    if scheme not in SCHEMES:
        raise CaramelError(f"scheme must be one of {sorted(SCHEMES)}, got {scheme!r}")
    if not (isinstance(time_repeats, int) and time_repeats >= 1):
        raise CaramelError(f"time_repeats must be an integer >= 1, got {time_repeats!r}")
    if groups is not None and scheme != "rounds":
        raise CaramelError(f"groups split the rounds of the rounds scheme, not {scheme!r}")
    if search is not None and scheme != "rounds":
        raise CaramelError(f"search follows the decoder of the rounds scheme, not {scheme!r}")
    _, decode_fast_fn, decode_reference_fn = SCHEMES[scheme]
    # the learned rows: (name, decoding, torch policy, numpy policy, the decoders' extra arguments)
    if groups is None:
        rows = [(policy_name(d), d, policy, fast, {}) for d in decodings]
    else:
        fasts = fast if fast is not None else [None] * len(groups)
        rows = [(policy_name(d, g), d, p, f, {"groups": g}) for g, p, f in zip(groups, policy, fasts)
                for d in decodings]
    searched = [h + "+search" for h in RATIO_HEURISTICS] if search is not None else []
    if guided and search is None:
        raise CaramelError("guided names the focus of a search; give search too")
    if search is not None:
        rows += [(n + suffix, d, p, f, {**kw, "search": search, **more}) for suffix, more in
                 [("+search", {})] + [(f"+guided:{g:g}", {"focus": g}) for g in guided or []]
                 for n, d, p, f, kw in rows]
    learned = [r[0] for r in rows]
    plain = policy_name(Decoding(1), None if groups is None else groups[0])
    controls = [f"{plain}+random:{g:g}" for g in guided or []] if plain in learned else []
    extra = learned + controls + searched + (["rollout", "ilp"] if rollout else ["ilp"])
    costs: dict[str, list[float]] = {n: [] for n in list(HEURISTICS) + extra}
    times: dict[str, list[float]] = {n: [] for n in costs}
    sampled = {n: {"won_by_a_sample": 0, "distinct_placements": []} for n, d, *_ in rows if d.samples > 1}
    checks = {n: {"same_decisions": 0, "solve_s": []} for n in learned}
    is_searched = [r for r in learned if r.endswith("+search") or "+guided:" in r] + controls
    search_runs = {n: {"passes": [], "guided_passes": [], "moves": [], "converged": 0}
                   for n in is_searched + searched}
    bounds, optimal = [], 0
    for s in seeds:
        inst = random_instance(options, s)
        decoded = {}

        def solver(name: str, d: Decoding, pol, fst, kw: dict):
            def solve(i):
                if fst is not None:
                    decoded[name] = decode_fast_fn(i, fst, d, seed=decode_seed * 1_000_003 + s, **kw)
                else:
                    decoded[name] = decode_reference_fn(i, pol, d, seed=decode_seed * 1_000_003 + s, **kw)
                return decoded[name].placement
            return solve

        methods = list(HEURISTICS.items()) + [(r[0], solver(*r)) for r in rows]
        plain_row = next((r for r in rows if r[0] == plain), None)
        methods += [(c, random_focus_search(solver(*plain_row), plain, g, search, decoded, s))
                    for c, g in zip(controls, guided or [])]
        found: dict = {}
        methods += [(h + "+search", searched_heuristic(h, search, found)) for h in RATIO_HEURISTICS] if searched else []
        methods += [("rollout", rollout_placement)] if rollout else []
        runs: dict[str, list[float]] = {name: [] for name, _ in methods}
        placed = {}
        for _ in range(time_repeats):  # the same placement each time (seeded); the median time
            for name, h in methods:
                start = time.perf_counter()
                placed[name] = h(inst)
                runs[name].append(time.perf_counter() - start)
        for name, _ in methods:
            times[name].append(float(np.median(runs[name])))
            assert inst.feasible(placed[name]), name
            costs[name].append(inst.cost_s(placed[name]))
        sol = solve_ilp(inst, time_limit_s)
        costs["ilp"].append(sol.cost_s)
        times["ilp"].append(sol.solve_s)
        bounds.append(sol.bound_s)
        optimal += int(sol.optimal)
        for name, d, pol, _, kw in rows if check_reference else ():
            start = time.perf_counter()
            ref_decoded = decode_reference_fn(inst, pol, d, seed=decode_seed * 1_000_003 + s, **kw)
            checks[name]["solve_s"].append(time.perf_counter() - start)
            checks[name]["same_decisions"] += int(ref_decoded == decoded[name])
        for name, stats in search_runs.items():  # the last timed run's (every run places the same)
            result = found[name] if name in found else decoded[name].searched
            stats["passes"].append(result.passes)
            stats["moves"].append(result.moves)
            stats["guided_passes"].append(result.guided_passes)
            stats["converged"] += int(result.converged)
        for name, stats in sampled.items():
            stats["won_by_a_sample"] += int(decoded[name].rollout > 0)
            stats["distinct_placements"].append(decoded[name].distinct)
    ref = costs[reference]
    best = [min(costs[n][i] for n in HEURISTICS) for i in range(len(seeds))]
    best_searched = [min(costs[n][i] for n in searched) for i in range(len(seeds))] if searched else None
    return {
        "instances": vars(options), "seeds": [seeds[0], seeds[-1] + 1], "ilp_time_limit_s": time_limit_s,
        "ilp_proven_optimal": optimal, "reference": reference,
        "cost_s": {n: summary(v) for n, v in costs.items()},
        "cost_s_per_instance": costs,
        "gap_to_reference_pct": {n: summary([100 * (c / r - 1) for c, r in zip(v, ref)]) for n, v in costs.items()},
        "gap_to_lower_bound_pct": {n: summary([100 * (c / b - 1) for c, b in zip(v, bounds)])
                                   for n, v in costs.items()},
        "solve_s": {n: summary(v) for n, v in times.items()},
        "solve_s_per_instance": times,  # the medians the ratios below are made of
        "time_repeats": time_repeats,
        # per learned decoding and heuristic: the per-instance ratio of their solve times
        "solve_time_ratio": {n: {h: ratio_summary([a / b for a, b in zip(times[n], times[h])])
                                 for h in RATIO_HEURISTICS if all(b > 0 for b in times[h])}
                             for n in learned + controls + searched},
        # per sampling decoding: instances where a sampled rollout beat the greedy one, and how
        # many different placements the N rollouts made per instance
        # the reference (torch) decoder on the same instances: its solve time, and on how many
        # instances every rollout's placement and cost equal the timed decoder's
        "reference_decoder": {n: {"same_decisions": v["same_decisions"], "solve_s": summary(v["solve_s"])}
                              for n, v in checks.items()} if check_reference else None,
        "sampling": {n: {"won_by_a_sample": v["won_by_a_sample"],
                         "distinct_placements": summary(v["distinct_placements"])} for n, v in sampled.items()},
        # "ppo" is the learned policy, however trained; wins and losses per instance
        "vs_best_heuristic": {n: {"wins": int(sum(c < b * (1 - 1e-9) for c, b in zip(costs[n], best))),
                                  "losses": int(sum(c > b * (1 + 1e-9) for c, b in zip(costs[n], best)))}
                              for n in extra},
        # with search: each searched learned row against the best searched heuristic, per instance
        "vs_best_searched_heuristic": {n: {"wins": int(sum(c < b * (1 - 1e-9) for c, b in zip(costs[n], best_searched))),
                                           "losses": int(sum(c > b * (1 + 1e-9) for c, b in zip(costs[n], best_searched)))}
                                       for n in is_searched} if searched else None,
        # with search: each learned row (searched or not) against each searched heuristic, per
        # instance: the solve-time ratio and the cost gap (%), both with 95% intervals, wins, losses
        "vs_searched_heuristics": {n: {h: {
            "solve_time_ratio": ratio_summary([a / b for a, b in zip(times[n], times[h])]),
            "cost_gap_pct": ratio_summary([100 * (a / b - 1) for a, b in zip(costs[n], costs[h])]),
            "wins": int(sum(a < b * (1 - 1e-9) for a, b in zip(costs[n], costs[h]))),
            "losses": int(sum(a > b * (1 + 1e-9) for a, b in zip(costs[n], costs[h])))} for h in searched}
            for n in learned + controls} if searched else None,
        "search": vars(search) if search is not None else None,
        # per searched row: the passes and moves of its search per instance, and on how many
        # instances it converged (no move left gaining more than min_gain) before max_passes
        "search_runs": search_runs if searched else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default="", help="InstanceOptions of the training instances")
    ap.add_argument("--small", default="", help="InstanceOptions of the small held-out instances (solved exactly)")
    ap.add_argument("--large", default="num_tasks=30,num_layers=8", help="InstanceOptions of the large ones")
    ap.add_argument("--ppo", default="", help="PpoOptions as key=value,...")
    ap.add_argument("--train-mid", default="", help="InstanceOptions of a second training size (with --teacher)")
    ap.add_argument("--teacher", default="none", choices=sorted(TEACHERS) + ["none"],
                    help="none: PPO alone; rollout or ilp: imitate that teacher (then --finetune-steps of PPO)")
    ap.add_argument("--improve", default="", help="ImproveOptions as key=value,... (with --teacher)")
    ap.add_argument("--large-rollout", action="store_true", help="run the (slow) rollout baseline on the large ones too")
    ap.add_argument("--finetune-steps", type=int, default=0, help="PPO steps after imitation (with --teacher)")
    ap.add_argument("--finetune-on", default="",
                    help="InstanceOptions of larger instances (e.g. num_tasks=10,num_layers=8): after the "
                         "imitation, more DAgger rounds on them with --finetune-teacher (with --teacher)")
    ap.add_argument("--finetune-teacher", default=None, choices=sorted(TEACHERS),
                    help="the teacher of --finetune-on (default rollout: cheap on larger instances)")
    ap.add_argument("--finetune-improve", default="", help="ImproveOptions of --finetune-on as key=value,...")
    ap.add_argument("--train-seeds", default=None, help="training instances (default 1000:3000)")
    ap.add_argument("--test-seeds", default="0:40")
    ap.add_argument("--large-seeds", default="0:10")
    ap.add_argument("--large-time-limit-s", type=float, default=10.0)
    ap.add_argument("--decode", default="greedy",
                    help="the policy's decodings, comma-separated: greedy and/or sample:N (best of N rollouts, "
                         "rollout 0 greedy), e.g. greedy,sample:16")
    ap.add_argument("--decode-seed", type=int, default=0, help="seed of the sampled rollouts")
    ap.add_argument("--decoder", default="fast", choices=["fast", "reference"],
                    help="fast: the network exported to numpy once (decode_fast); reference: through torch (decode)")
    ap.add_argument("--scheme", default="sequential", choices=sorted(SCHEMES),
                    help="sequential: a forward pass per layer, in greedy_regret's order; rounds: a layer of "
                         "every task per forward pass (trained and decoded so)")
    ap.add_argument("--groups", default=None,
                    help="with --scheme rounds: comma-separated G values (e.g. 1,4,8), one policy trained and "
                         "decoded per G, each round split into G groups in greedy_regret's settling order")
    ap.add_argument("--time-repeats", type=int, default=1,
                    help="run every method this many times per instance; its solve time is the median")
    ap.add_argument("--check-reference", action="store_true",
                    help="also run the reference decoder on every instance: its time, and whether it decides the same")
    ap.add_argument("--search", nargs="?", const="", default=None,
                    help="with --scheme rounds: also improve each learned placement by the local search "
                         "(SearchOptions as key=value,...; none for the defaults), rows NAME+search, and the "
                         "greedy heuristics followed by it, rows H+search")
    ap.add_argument("--guided", default=None,
                    help="with --search: comma-separated fractions F in (0, 1]: each learned row also followed by "
                         "the guided search, the F of the layers the policy was least sure of tried first "
                         "(rows NAME+guided:F); each F with its control, the search from a random mask of "
                         "as many layers, on the greedy row (of the first G with --groups): needs greedy in "
                         "--decode")
    ap.add_argument("--save-policy", default=None, help="write the trained policy (and how it was trained) here")
    ap.add_argument("--load-policy", default=None,
                    help="evaluate a policy --save-policy wrote (no training; training flags refused)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    threadpool_limits(1)  # numpy's BLAS too: one thread, as torch and the heuristics
    train_opts = options_from(InstanceOptions, args.train, "train")
    small = options_from(InstanceOptions, args.small, "small")
    large = options_from(InstanceOptions, args.large, "large")
    if not train_opts.num_edge == small.num_edge == large.num_edge:
        raise SystemExit("train, small and large must have the same num_edge (one policy row per node)")
    ppo = options_from(PpoOptions, args.ppo, "ppo")
    train = seed_range(args.train_seeds or "1000:3000")
    test, large_seeds = seed_range(args.test_seeds), seed_range(args.large_seeds)
    if not args.load_policy and set(train) & (set(test) | set(large_seeds)):  # a loaded file's: below
        raise SystemExit("training and test seeds overlap; the test instances must be held out")
    if args.teacher == "none" and (args.improve or args.finetune_steps or args.train_mid or args.finetune_on):
        raise SystemExit("--improve, --finetune-steps, --train-mid and --finetune-on shape the imitation of a "
                         "teacher; pass --teacher too")
    if (args.finetune_improve or args.finetune_teacher) and not args.finetune_on:
        raise SystemExit("--finetune-improve and --finetune-teacher shape the rounds of --finetune-on; "
                         "pass --finetune-on too")
    finetune_teacher = args.finetune_teacher or "rollout"
    if args.time_repeats < 1:
        raise SystemExit(f"--time-repeats must be >= 1, got {args.time_repeats}")
    if args.finetune_steps < 0:
        raise SystemExit(f"--finetune-steps must be >= 0, got {args.finetune_steps}")
    groups = None
    if args.groups is not None:
        if args.scheme != "rounds":
            raise SystemExit("--groups splits the rounds of --scheme rounds; pass --scheme rounds too")
        try:
            groups = [int(g) for g in args.groups.split(",")]
        except ValueError:
            raise SystemExit(f"--groups must be comma-separated integers >= 1, got {args.groups!r}") from None
        if any(g < 1 for g in groups) or len(set(groups)) != len(groups):
            raise SystemExit(f"--groups must be distinct integers >= 1, got {args.groups!r}")
    search = None
    if args.search is not None:
        if args.scheme != "rounds":
            raise SystemExit("--search follows the decoder of --scheme rounds; pass --scheme rounds too")
        search = options_from(SearchOptions, args.search, "search")
    guided = None
    if args.guided is not None:
        if search is None:
            raise SystemExit("--guided names the focus of the search; pass --search too")
        guided = parse_fractions(args.guided, "--guided")
    if args.save_policy and groups is not None:
        raise SystemExit("--save-policy keeps one policy; --groups trains one per G: drop one of them")
    if args.load_policy:
        given = [f for f, v in (("--teacher", args.teacher != "none"), ("--improve", args.improve),
                                ("--train-mid", args.train_mid), ("--finetune-on", args.finetune_on),
                                ("--finetune-steps", args.finetune_steps), ("--groups", groups),
                                ("--train-seeds", args.train_seeds),
                                ("--save-policy", args.save_policy)) if v]
        if given:
            raise SystemExit(f"--load-policy evaluates a trained policy; {', '.join(given)} would be ignored: "
                             f"drop them (the file records its training)")
    decodings = [parse_decoding(d) for d in args.decode.split(",")]
    if len({d.samples for d in decodings}) != len(decodings):
        raise SystemExit(f"--decode {args.decode!r} names a decoding twice")
    if guided and Decoding(1) not in decodings:  # the random-mask control follows the greedy row
        raise SystemExit(f"--guided needs greedy in --decode (its random-mask control follows the greedy "
                         f"row), got --decode {args.decode!r}")
    improve_opts = options_from(ImproveOptions, args.improve, "improve")
    mid = options_from(InstanceOptions, args.train_mid, "train-mid") if args.train_mid else None
    if mid is not None and mid.num_edge != train_opts.num_edge:
        raise SystemExit("--train-mid must have the same num_edge as --train")
    refine = options_from(InstanceOptions, args.finetune_on, "finetune-on") if args.finetune_on else None
    if refine is not None and refine.num_edge != train_opts.num_edge:
        raise SystemExit("--finetune-on must have the same num_edge as --train")
    refine_opts = options_from(ImproveOptions, args.finetune_improve, "finetune-improve")
    env_class = SCHEMES[args.scheme][0]
    if args.load_policy:
        model, training = load_policy(args.load_policy, env_class,
                                      {"scheme": args.scheme, "ppo": vars(ppo), "train": vars(train_opts)})
        if set(range(*training["train_seeds"])) & (set(test) | set(large_seeds)):
            raise SystemExit(f"the training seeds of {args.load_policy} overlap the test seeds; the test "
                             f"instances must be held out")
        models = [model]
    else:
        models, training = train_policies(args, groups, env_class, train_opts, mid, refine, ppo, improve_opts,
                                          refine_opts, finetune_teacher, train)
        if args.save_policy:
            save_policy(args.save_policy, models[0], training)
    start = time.perf_counter()
    fasts = [NumpyPolicy.from_policy(m.policy) if args.decoder == "fast" else None for m in models]
    export_s, fast = time.perf_counter() - start, fasts[0]  # once per trained policy, not per instance
    model = models[0]
    if groups is None:
        policy, fast_arg = model.policy, fast
    else:
        policy, fast_arg = [m.policy for m in models], fasts if fast is not None else None
    report = {
        **training, "experiment": "edge_placement", "torch_threads": 1,  # the record cannot override these
        "policy_parameters": num_policy_parameters(model),
        "decode": [d.name for d in decodings], "decode_seed": args.decode_seed, "decoder": args.decoder,
        "policy_export_s": export_s if fast is not None else None, "guided": guided,
        "small": evaluate(small, test, policy, decodings, args.decode_seed, None, "ilp", True, fast_arg,
                          args.check_reference, args.scheme, args.time_repeats, groups, search, guided),
        "large": evaluate(large, large_seeds, policy, decodings, args.decode_seed, args.large_time_limit_s,
                          "greedy_regret", args.large_rollout, fast_arg, args.check_reference,
                          args.scheme, args.time_repeats, groups, search, guided),
    }
    for key in ("small", "large"):
        r = report[key]
        print(f"{key} (gap to {r['reference']}, %): " + ", ".join(
            f"{n} {v['mean']:+.2f}" for n, v in r["gap_to_reference_pct"].items())
            + f"; ilp optimal {r['ilp_proven_optimal']}/{r['seeds'][1] - r['seeds'][0]}; solve s: "
            + ", ".join(f"{n} {v['mean']:.4f}" for n, v in r["solve_s"].items()))
        print(f"{key}, solve time over greedy_regret's (mean [95% CI]): " + ", ".join(
            f"{n} {v['greedy_regret']['mean']:.2f} " + ("[{:.2f}, {:.2f}]".format(*v['greedy_regret']['ci95'])
                                                       if v['greedy_regret']['ci95'] else "(one instance)")
            for n, v in r["solve_time_ratio"].items() if "greedy_regret" in v))
        if r["reference_decoder"]:
            print(f"{key}, reference decoder: " + ", ".join(
                f"{n} same {v['same_decisions']}/{r['seeds'][1] - r['seeds'][0]} in {v['solve_s']['mean']:.4f} s"
                for n, v in r["reference_decoder"].items()))
    took = "an unmeasured time" if report["train_s"] is None else f"{report['train_s']:.0f} s"  # a file's record
    print(f"trained ({report['teacher']}) in {took}; {report['policy_parameters']} policy parameters"
          + (f" (loaded from {args.load_policy})" if args.load_policy else ""))
    if args.json:
        write_json(args.json, {"format": format_tag("edge-placement"), **report})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
