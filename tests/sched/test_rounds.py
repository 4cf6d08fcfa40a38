"""The placement policy in rounds (a layer of every task per forward pass): the batched rounds
equal the training environment (observations, placements, memory, costs), the numpy decoder
decides as the torch reference, memory is settled in greedy_regret's order, and the return is
minus the placement's cost."""
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from caramel.errors import CaramelError  # noqa: E402
from caramel.sched.placement import InstanceOptions, random_instance  # noqa: E402
from caramel.sched.placement.decode import Decoding  # noqa: E402
from caramel.sched.placement.env import run_policy  # noqa: E402
from caramel.sched.placement.fast_decode import NumpyPolicy  # noqa: E402
from caramel.sched.placement.local_search import SearchOptions, local_search  # noqa: E402
from caramel.sched.placement.round_env import RoundPlacementEnv  # noqa: E402
from caramel.sched.placement.rounds import RoundBatch, commit, decode_rounds  # noqa: E402
from caramel.sched.rl import PpoOptions, make_ppo  # noqa: E402

SMALL = InstanceOptions(num_tasks=3, num_layers=4, num_edge=3)
TIGHT = InstanceOptions(num_tasks=6, num_layers=5, num_edge=4, memory_fraction=0.1)
LARGE = InstanceOptions(num_tasks=30, num_layers=8, num_edge=3, memory_fraction=0.3)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    m = make_ppo(RoundPlacementEnv(SMALL, [0]), PpoOptions(width=16, prior=0.0, seed=3))
    m.policy.set_training_mode(False)
    return m


@pytest.mark.parametrize("opts,seeds,groups", [(SMALL, range(3), 1), (TIGHT, range(3), 1), (LARGE, [0], 1),
                                               (SMALL, range(2), 2), (TIGHT, range(3), 4), (LARGE, [0], 8)],
                         ids=["small", "tight", "large", "small-g2", "tight-g4", "large-g8"])
def test_batch_equals_the_environment(opts, seeds, groups):
    """Random actions, 4 samples: every observation the environment shows equals the batch's
    row for that task; placements, memory left and costs (`Instance.cost_s`) equal too; with
    the round split into groups as well (each group seeing the memory the earlier ones took)."""
    for seed in seeds:
        inst, rng = random_instance(opts, seed), np.random.default_rng(seed)
        batch = RoundBatch(inst, 4, groups=groups)
        envs = [RoundPlacementEnv(opts, [0], groups=groups) for _ in range(4)]
        seen = [e.reset(options={"instance": inst})[0] for e in envs]
        returns = np.zeros(4)
        while not batch.done:
            obs = batch.observe()
            actions = rng.integers(inst.num_nodes, size=obs.shape[:2])
            for i, env in enumerate(envs):
                for _ in range(obs.shape[1]):
                    a = int(np.flatnonzero(batch.tasks[i] == env.task)[0])
                    assert np.array_equal(seen[i], obs[i, a])
                    seen[i], reward, _, _, _ = env.step(actions[i, a])
                    returns[i] += reward
            batch.step(actions)
        costs = batch.costs_s()
        for i, env in enumerate(envs):
            p = batch.placements()[i]
            assert env.state.done and env.placement() == p and inst.feasible(p)
            assert np.array_equal(np.append(env.state.free_mb, np.inf), batch._free_ext[i])
            assert costs[i] == inst.cost_s(p)
            assert returns[i] == pytest.approx(-costs[i] / env.scale_s, rel=1e-9)


@pytest.mark.parametrize("opts,seeds,groups", [(SMALL, range(4), 1), (LARGE, [1], 1), (LARGE, [1], 4)],
                         ids=["small", "large", "large-g4"])
def test_numpy_decoder_decides_as_the_torch_reference(model, opts, seeds, groups):
    """Greedy and 8 samples (the same seed): every sample's cost, the winner and the placement
    equal the torch reference's; greedy equals the deterministic actor stepping the environment."""
    fast = NumpyPolicy.from_policy(model.policy)
    for s in seeds:
        inst = random_instance(opts, s)
        for n in (1, 8):
            got = decode_rounds(inst, fast, Decoding(n), seed=s, groups=groups)
            assert got == decode_rounds(inst, model.policy, Decoding(n), seed=s, groups=groups)
            assert inst.feasible(got.placement) and got.cost_s == min(got.costs_s)
        want = run_policy(RoundPlacementEnv(opts, [0], groups=groups), inst,
                          lambda o: int(model.predict(o, deterministic=True)[0]))
        assert decode_rounds(inst, fast, Decoding(1), groups=groups).placement == want


def test_search_after_decoding_improves_the_kept_placement(model):
    """`search`: the kept sample, improved by `local_search` on the decoder's tables, the same
    through the numpy and the torch decoders; without it, the decoding as before."""
    fast = NumpyPolicy.from_policy(model.policy)
    inst = random_instance(LARGE, 2)
    for n, groups in ((1, 1), (4, 2)):
        plain = decode_rounds(inst, fast, Decoding(n), seed=5, groups=groups)
        got = decode_rounds(inst, fast, Decoding(n), seed=5, groups=groups, search=SearchOptions())
        assert got == decode_rounds(inst, model.policy, Decoding(n), seed=5, groups=groups, search=SearchOptions())
        assert got.placement == local_search(inst, plain.placement).placement
        assert (got.rollout, got.costs_s) == (plain.rollout, plain.costs_s)
        assert inst.feasible(got.placement) and got.cost_s < plain.cost_s
        assert got.cost_s == pytest.approx(inst.cost_s(got.placement), rel=1e-12)
        assert got.searched.converged and got.searched.moves > 0 and plain.searched is None


def test_a_search_guided_by_the_policy_is_deterministic_and_ends_at_a_local_optimum(model):
    """`focus`: the search tries first the layers the policy was least sure of; the same
    through the numpy and the torch decoders, the same twice, never worse than the decoding,
    and where it ends the unguided search finds nothing more to gain."""
    fast = NumpyPolicy.from_policy(model.policy)
    inst = random_instance(LARGE, 2)
    for n, groups in ((1, 1), (4, 2)):
        plain = decode_rounds(inst, fast, Decoding(n), seed=5, groups=groups)
        got = decode_rounds(inst, fast, Decoding(n), seed=5, groups=groups, search=SearchOptions(), focus=0.1)
        assert got == decode_rounds(inst, fast, Decoding(n), seed=5, groups=groups, search=SearchOptions(),
                                    focus=0.1)
        assert got == decode_rounds(inst, model.policy, Decoding(n), seed=5, groups=groups,
                                    search=SearchOptions(), focus=0.1)
        assert (got.rollout, got.costs_s) == (plain.rollout, plain.costs_s)
        assert inst.feasible(got.placement) and got.cost_s < plain.cost_s
        assert got.searched.converged and 0 < got.searched.guided_passes < got.searched.passes
        assert local_search(inst, got.placement).moves == 0
    for bad, match in ((0, "in \\(0, 1\\]"), (1.5, "in \\(0, 1\\]"), (True, "in \\(0, 1\\]"),
                       ("0.5", "in \\(0, 1\\]")):
        with pytest.raises(CaramelError, match=match):
            decode_rounds(inst, fast, Decoding(1), search=SearchOptions(), focus=bad)
    with pytest.raises(CaramelError, match="and no search"):
        decode_rounds(inst, fast, Decoding(1), focus=0.5)


TIGHT_3 = InstanceOptions(num_tasks=12, num_layers=5, num_edge=3, memory_fraction=0.1)  # the model's 3 edge nodes


def _sure_by_hand(inst, fast, groups):
    """Greedy rounds stepped by hand: each (task, layer)'s probability of the row of the node it
    ended on (after `commit`, looked up node by node), how many layers commit moved off the row
    the policy chose, and the placement."""
    batch = RoundBatch(inst, 1, groups=groups)
    sure, moved = {}, 0
    while not batch.done:
        obs = batch.observe()
        probs = fast.probabilities(obs[0])
        order, tasks, layer = batch.order[0].copy(), batch.tasks[0].copy(), batch.layer
        node = batch.step(np.argmax(probs, axis=1)[None, :])[0]
        for a, t in enumerate(tasks):
            row = list(order[a]).index(node[a])
            sure[(int(t), layer)] = float(probs[a, row])
            moved += row != int(np.argmax(probs[a]))
    return sure, moved, batch.placements()[0]


def _mask(inst, keys, fraction):
    mask = np.zeros((len(inst.tasks), max(len(t.gflop) for t in inst.tasks)), dtype=bool)
    for t, l in keys[:max(1, round(fraction * len(keys)))]:
        mask[t, l] = True
    return mask


@pytest.mark.parametrize("opts,seed,groups", [(TIGHT_3, 4, 1), (LARGE, 2, 1), (LARGE, 3, 4)],
                         ids=["tight", "large", "large-g4"])
def test_the_guided_search_focuses_the_least_sure_layers(model, opts, seed, groups):
    """`focus=F` searches from the mask of the F least sure layers built apart (the lowest
    probability of the node each layer ended on, after `commit`; ties by task, layer): the
    same result as `local_search` given that mask; the first layers by position, or the most
    sure ones, give another."""
    fast = NumpyPolicy.from_policy(model.policy)
    inst = random_instance(opts, seed)
    sure, moved, placement = _sure_by_hand(inst, fast, groups)
    least = sorted(sure, key=lambda tl: (sure[tl], tl))
    most = sorted(sure, key=lambda tl: (-sure[tl], tl))
    if opts is TIGHT_3:
        assert moved > 0  # commit moved some layer off the node the policy chose
    for fraction in (0.1, 0.3):
        got = decode_rounds(inst, fast, Decoding(1), groups=groups, search=SearchOptions(), focus=fraction)
        assert got.searched == local_search(inst, placement, SearchOptions(), focus=_mask(inst, least, fraction))
        for keys in (sorted(sure), most):  # what a mask by position or of the most sure layers finds
            other = local_search(inst, placement, SearchOptions(), focus=_mask(inst, keys, fraction))
            assert other != got.searched, fraction


def test_commit_settles_memory_in_priority_order():
    """Node 0 has room for 5 MB: of the three tasks that want it, in priority order 2, 0, 1,
    task 2 (4 MB) keeps it; task 0 (3 MB) and task 1 (1 MB) claim their first node with room
    left: node 1 for task 0, node 0's last 1 MB for task 1."""
    chosen = np.array([[0, 0, 0]])
    priority = np.array([[2, 0, 1]])
    order = np.array([[[0, 1, 2], [0, 1, 2], [0, 1, 2]]])
    free = np.array([[5.0, 3.0, np.inf]])
    nodes = commit(chosen, priority, order, np.array([3.0, 1.0, 4.0]), free)
    assert nodes.tolist() == [[1, 0, 0]]
    assert free.tolist() == [[0.0, 0.0, np.inf]]


def test_bad_inputs_are_refused(model):
    inst = random_instance(SMALL, 0)
    with pytest.raises(CaramelError, match="decoding must be a Decoding"):
        decode_rounds(inst, NumpyPolicy.from_policy(model.policy), 4)
    with pytest.raises(CaramelError, match="policy must be"):
        decode_rounds(inst, object(), Decoding(1))
    with pytest.raises(CaramelError, match="search must be a SearchOptions"):
        decode_rounds(inst, NumpyPolicy.from_policy(model.policy), Decoding(1), search={"max_passes": 3})
    with pytest.raises(CaramelError, match="samples >= 1"):
        RoundBatch(inst, 0)
    for bad in (0, 1.5):
        with pytest.raises(CaramelError, match="groups >= 1"):
            RoundBatch(inst, 1, groups=bad)
        with pytest.raises(CaramelError, match="groups >= 1"):
            RoundPlacementEnv(SMALL, [0], groups=bad)
    batch = RoundBatch(inst, 2)
    batch.observe()
    with pytest.raises(CaramelError, match="actions must be"):
        batch.step(np.zeros((2, 1), dtype=int))


def test_experiment_trains_and_decodes_in_rounds(tmp_path):
    """A tiny `edge_placement --scheme rounds --groups 1,3` run (a policy per G): the numpy
    decoder decided as the torch reference on every instance, and every decoding's time is
    compared with every heuristic's."""
    from caramel.jsonio import read_json
    from experiments.edge_placement import main

    out = tmp_path / "r.json"
    assert main(["--scheme", "rounds", "--teacher", "rollout", "--ppo", "width=8",
                 "--improve", "rounds=1,episodes=2,epochs=1", "--test-seeds", "0:2", "--large",
                 "num_tasks=5,num_layers=3", "--large-seeds", "0:2", "--large-time-limit-s", "1",
                 "--decode", "greedy,sample:4", "--check-reference", "--time-repeats", "2",
                 "--groups", "1,3", "--search", "max_passes=8", "--finetune-on", "num_tasks=4,num_layers=2",
                 "--finetune-improve", "rounds=1,episodes=1,epochs=1", "--json", str(out)]) == 0
    report = read_json(out, "edge-placement")
    assert report["scheme"] == "rounds" and report["groups"] == [1, 3] and len(report["train_s_per_groups"]) == 2
    assert report["finetune_on"]["num_tasks"] == 4 and report["finetune_teacher"] == "rollout"
    assert len(report["finetune_rounds"]) == 2 and len(report["finetune_s"]) == 2  # one per G
    for key in ("small", "large"):
        r = report[key]
        assert all(v["same_decisions"] == 2 for v in r["reference_decoder"].values())
        learned = {"ppo_g1", "ppo_g1_sample:4", "ppo_g3", "ppo_g3_sample:4"}
        searched = {"greedy_myopic+search", "greedy_lookahead+search", "greedy_regret+search"}
        assert set(r["solve_time_ratio"]) == learned | {n + "+search" for n in learned} | searched
        assert set(r["vs_best_searched_heuristic"]) == {n + "+search" for n in learned}
        costs = r["cost_s_per_instance"]
        assert set(r["search_runs"]) == {n + "+search" for n in learned} | searched
        for runs in r["search_runs"].values():  # max_passes=8 binds on none of these tiny instances
            assert len(runs["passes"]) == len(runs["moves"]) == 2 and runs["converged"] == 2
        for n in learned | {h.removesuffix("+search") for h in searched}:  # the search never makes one worse
            assert all(a <= b * (1 + 1e-12) for a, b in zip(costs[n + "+search"], costs[n]))
        assert set(r["solve_time_ratio"]["ppo_g3"]) == {"greedy_myopic", "greedy_lookahead", "greedy_regret"}
        assert all(len(v) == 2 for v in r["solve_s_per_instance"].values())
    for argv, match in ((["--time-repeats", "0"], "time-repeats"), (["--groups", "2"], "scheme rounds"),
                        (["--scheme", "rounds", "--groups", "1,0"], "distinct integers"),
                        (["--scheme", "rounds", "--groups", "x"], "comma-separated integers"),
                        (["--search"], "scheme rounds"), (["--finetune-on", "num_tasks=9"], "pass --teacher"),
                        (["--teacher", "rollout", "--finetune-improve", "rounds=1"], "pass --finetune-on"),
                        (["--teacher", "rollout", "--finetune-teacher", "ilp"], "pass --finetune-on")):
        with pytest.raises(SystemExit, match=match):
            main(argv)
    with pytest.raises(CaramelError, match="did you mean 'max_passes'"):
        main(["--scheme", "rounds", "--search", "max_pases=3"])


def test_experiment_loads_a_saved_policy_and_runs_the_guided_search(tmp_path):
    """`--save-policy` then `--load-policy` (no training): the loaded policy places every
    instance as the saved run did; `--guided` adds the searches guided by the policy, compared
    with every searched heuristic; flags a loaded policy cannot honour are refused."""
    from caramel.jsonio import read_json
    from experiments.edge_placement import main

    base = ["--scheme", "rounds", "--ppo", "width=8", "--test-seeds", "0:2", "--large", "num_tasks=6,num_layers=3",
            "--large-seeds", "0:2", "--large-time-limit-s", "1", "--search", "max_passes=50"]
    saved, out, policy = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "p.pt"
    assert main(base + ["--teacher", "rollout", "--improve", "rounds=1,episodes=2,epochs=1",
                        "--save-policy", str(policy), "--json", str(saved)]) == 0
    assert main(base + ["--load-policy", str(policy), "--guided", "0.25,1", "--json", str(out)]) == 0
    first, report = read_json(saved, "edge-placement"), read_json(out, "edge-placement")
    assert report["loaded_from"] == str(policy) and report["train_s"] == first["train_s"]
    assert report["teacher"] == "rollout" and report["guided"] == [0.25, 1.0]
    from caramel.bench.provenance import code_version  # which code trained it, kept in the file
    code = code_version()
    stored = torch.load(policy, weights_only=True)["training"]
    assert stored["trained_commit"] == code.removesuffix("-dirty") and len(code.removesuffix("-dirty")) == 12
    assert stored["trained_dirty"] is code.endswith("-dirty")
    for key in ("trained_commit", "trained_dirty"):
        assert report[key] == first[key] == stored[key]
    for key in ("small", "large"):
        r, was = report[key], first[key]
        for n in ("ppo", "ppo+search"):
            assert r["cost_s_per_instance"][n] == was["cost_s_per_instance"][n]
        rows = {"ppo+search", "ppo+guided:0.25", "ppo+guided:1"}
        controls = {"ppo+random:0.25", "ppo+random:1"}
        assert rows <= set(r["search_runs"]) and set(r["vs_best_searched_heuristic"]) == rows | controls
        assert all(len(v["guided_passes"]) == 2 for v in r["search_runs"].values())
        for n in rows | {"ppo"}:
            assert set(r["vs_searched_heuristics"][n]) == {h + "+search" for h in
                                                           ("greedy_myopic", "greedy_lookahead", "greedy_regret")}
        assert controls <= set(r["search_runs"]) & set(r["vs_searched_heuristics"])
        costs = r["cost_s_per_instance"]
        for n in ("ppo+guided:0.25", "ppo+random:0.25"):  # never worse than the policy's placement
            assert all(a <= b * (1 + 1e-12) for a, b in zip(costs[n], costs["ppo"]))
        assert costs["ppo+random:1"] == costs["ppo+guided:1"] == costs["ppo+search"]  # every layer: no guide
    from experiments.placement_focus_check import main as focus_check  # the same file, untimed, three ways
    check = tmp_path / "c.json"
    assert focus_check(["--load-policy", str(policy), "--ppo", "width=8", "--seeds", "0:3", "--instances",
                        "num_tasks=6,num_layers=3", "--fractions", "0.25,1", "--json", str(check)]) == 0
    rows = read_json(check, "placement-focus-check")["rows"]
    assert set(rows) == {"search", "guided:0.25", "random:0.25", "guided:1", "random:1"}
    assert rows["guided:1"]["cost_s"] == rows["random:1"]["cost_s"] == rows["search"]["cost_s"]
    with pytest.raises(SystemExit, match="overlap the policy's training seeds"):
        focus_check(["--load-policy", str(policy), "--ppo", "width=8", "--seeds", "1000:1002"])
    with pytest.raises(SystemExit, match="distinct fractions"):
        focus_check(["--load-policy", str(policy), "--ppo", "width=8", "--seeds", "0:3", "--fractions", "0.1,0.10"])
    from experiments.placement_policy_file import FILE_NOTES, load_policy  # a record's own keys: kept apart
    from caramel.sched.placement.round_env import RoundPlacementEnv as env_class
    saved = torch.load(policy, weights_only=True)
    saved["training"].update(experiment="other", rebuilt="by hand")
    noted, corrupt = tmp_path / "noted.pt", tmp_path / "corrupt.pt"
    torch.save(saved, noted)
    corrupt.write_bytes(b"not a torch file")
    training = load_policy(str(noted), env_class, {})[1]
    assert "experiment" not in training and "rebuilt" not in training and training["train_s"] == first["train_s"]
    assert training[FILE_NOTES] == {"experiment": "other", "rebuilt": "by hand"}
    assert load_policy(str(policy), env_class, {})[1][FILE_NOTES] is None
    for argv, match in ((["--guided", "0.5"], "pass --search"), (base + ["--guided", "0"], "fractions in"),
                        (base + ["--guided", "x"], "fractions in"), (base + ["--guided", "0.5,0.50"], "distinct"),
                        (base + ["--guided", "0.5", "--decode", "sample:4"], "needs greedy in --decode"),
                        (base + ["--load-policy", str(tmp_path / "none.pt")], "none.pt: no such file"),
                        (base + ["--load-policy", str(corrupt)], "corrupt.pt: not a file --save-policy wrote"),
                        (base + ["--load-policy", str(policy), "--teacher", "ilp"], "--teacher would be ignored"),
                        (["--scheme", "rounds", "--load-policy", str(policy)], "trained with ppo"),
                        (base + ["--load-policy", str(policy), "--train-seeds", "5000:5005"], "--train-seeds would be"),
                        (base + ["--load-policy", str(policy), "--large-seeds", "1500:1501"],
                         "training seeds of .* overlap"),
                        (base + ["--groups", "1,2", "--teacher", "rollout", "--save-policy", str(policy)],
                         "keeps one policy")):
        with pytest.raises(SystemExit, match=match):
            main(argv)


def test_evaluate_refuses_bad_arguments_and_one_instance_has_no_interval():
    from experiments.edge_placement import evaluate, ratio_summary

    assert ratio_summary([0.5])["ci95"] is None and ratio_summary([0.5, 0.7])["ci95"] is not None
    for kw, match in (({"scheme": "bogus"}, "scheme"), ({"time_repeats": 0}, "time_repeats"),
                      ({"groups": [2]}, "groups split"), ({"search": SearchOptions()}, "search follows")):
        with pytest.raises(CaramelError, match=match):
            evaluate(InstanceOptions(), [0], None, [], 0, 1.0, "greedy_regret", False, **kw)
