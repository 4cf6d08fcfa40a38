"""Decoding the coflow policy: greedy decides as SB3's deterministic predict (with a margin
it keeps to the base where the policy is unsure), the best of N
sampled schedules is never worse than greedy and keeps the schedule it reports, and bad
decodings are refused; the experiment's per-trace comparison counts what it says."""

import json
import re
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from caramel.errors import CaramelError  # noqa: E402
from caramel.sched.coflow import HEURISTICS, TraceOptions, simulate, synthetic_trace  # noqa: E402
from caramel.sched.coflow.decode import Decoding, decode, parse_decoding, policy_logits  # noqa: E402
from caramel.sched.coflow.env import CoflowEnv, EnvOptions, run_policy  # noqa: E402
from caramel.sched.coflow.rollout import objective_total  # noqa: E402
from caramel.sched.rl import PpoOptions, make_ppo  # noqa: E402

TRACE = TraceOptions(num_jobs=4, max_steps=2, max_layers=5)


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    env = CoflowEnv(TRACE, [0], EnvOptions(objective="weighted_jct", base="weighted_srjf"))
    # an untrained network whose prior does not dominate, so its picks spread over the rows
    model = make_ppo(env, PpoOptions(width=8, prior=0.0, seed=3))
    return env, model


def test_greedy_decoding_is_the_deterministic_policy(setup):
    env, model = setup
    logits = policy_logits(model)
    for seed in range(2):
        w = synthetic_trace(TRACE, seed)
        want = run_policy(env, w, lambda obs: int(model.predict(obs, deterministic=True)[0]))
        got = decode(env, w, logits)
        assert got.kept == 0 and len(got.totals) == 1
        np.testing.assert_array_equal(got.result.jct_s, want.jct_s)


def test_best_of_n_is_never_worse_than_greedy_and_keeps_its_best(setup):
    env, model = setup
    logits = policy_logits(model)
    spread = False
    for seed in range(3):
        w = synthetic_trace(TRACE, seed)
        greedy = decode(env, w, logits).totals[0]
        got = decode(env, w, logits, Decoding(6, temperature=2.0), seed=seed)
        assert got.totals[0] == pytest.approx(greedy, rel=1e-12)  # schedule 0 is greedy
        assert got.totals[got.kept] == min(got.totals) <= greedy
        assert objective_total(got.result, "weighted_jct") == pytest.approx(got.totals[got.kept], rel=1e-12)
        spread |= len(set(np.round(got.totals, 9))) > 1
        again = decode(env, w, logits, Decoding(6, temperature=2.0), seed=seed)
        assert again.totals == got.totals  # a seed gives one set of schedules
    assert spread  # the samples do differ from greedy somewhere


def test_a_margin_leaves_the_base_only_where_the_policy_is_sure(setup):
    env, model = setup
    logits = policy_logits(model)
    assert Decoding(margin=1.0).pick(np.array([0.0, 1.5, 0.9])) == 1
    assert Decoding(margin=1.0).pick(np.array([0.0, 0.9, 0.5])) == 0
    deviated = False
    for seed in range(2):
        w = synthetic_trace(TRACE, seed)
        base = simulate(w, HEURISTICS["weighted_srjf"])
        never = decode(env, w, logits, Decoding(margin=1e6))  # no logit gap is that large: the base
        np.testing.assert_array_equal(never.result.jct_s, base.jct_s)
        zero = decode(env, w, logits, Decoding(margin=0.0))
        deviated |= not np.array_equal(zero.result.jct_s, base.jct_s)
    assert deviated  # the untrained policy does leave the base, so the margin is what held it


def test_checked_decoding_never_loses_to_the_base(setup):
    env, model = setup
    logits = policy_logits(model)
    gains, checked = [], 0
    for seed in range(3):
        w = synthetic_trace(TraceOptions(num_jobs=5, max_steps=2, max_layers=6), seed)
        base = objective_total(simulate(w, HEURISTICS["weighted_srjf"]), "weighted_jct")
        got = decode(env, w, logits, Decoding(check=2.0))
        assert got.totals[0] <= base * (1 + 1e-9), seed
        assert objective_total(got.result, "weighted_jct") == pytest.approx(got.totals[0], rel=1e-12)
        gains.append(base - got.totals[0])
        checked += got.checks
        # a margin no logit gap reaches: every event with two rows or more is checked
        assert decode(env, w, logits, Decoding(check=1e9)).checks >= got.checks
        assert decode(env, w, logits, Decoding(check=0.0)).checks <= got.checks
    assert checked > 0 and max(gains) > 0  # it does check, and the check does find better rows


def test_decodings_parse_and_bad_ones_are_refused():
    assert parse_decoding("greedy") == Decoding()
    assert parse_decoding("greedy:0.5") == Decoding(margin=0.5) and Decoding(margin=0.5).name == "greedy:0.5"
    assert parse_decoding("check:2") == Decoding(check=2.0) and Decoding(check=2.0).name == "check:2"
    assert parse_decoding("sample:8") == Decoding(8, 1.0)
    assert parse_decoding("sample:8:2.5") == Decoding(8, 2.5)
    assert parse_decoding("sample:8:2.5").name == "sample:8:2.5" and Decoding(8).name == "sample:8"
    for mode in ("greedy", "base", "check"):
        assert parse_decoding(f"arrived:{mode}") == Decoding(arrived=mode)
        assert Decoding(arrived=mode).name == f"arrived:{mode}" and Decoding(arrived=mode).online
    for bad in ("sample", "sample:1", "sample:x", "sample:4:0", "sample:4:-1", "sample:4:nan", "best:4",
                "sample:4:2:1", "greedy:-1", "greedy:x", "greedy:inf", "greedy:1:2", "", "check", "check:-1",
                "check:1:2", "greedy:1_0", "check:  2", "check: 2", "sample:\u0663", "sample:+8", "greedy:+1",
                "arrived", "arrived:", "arrived:sample", "arrived:check:1", "arrived:Check"):
        with pytest.raises(CaramelError, match="expected greedy, greedy:M"):
            parse_decoding(bad)


def test_a_sample_count_over_the_cap_is_refused_naming_it():
    from caramel.sched.coflow.decode import MAX_SAMPLES
    assert parse_decoding(f"sample:{MAX_SAMPLES}:2") == Decoding(MAX_SAMPLES, 2.0)
    # zero padding past int()'s digit limit reads as its count, as in the placement decodings
    assert parse_decoding("sample:" + "0" * 5000 + "8") == Decoding(8)
    assert parse_decoding("sample:" + "0" * 5000 + "8:2") == Decoding(8, 2.0)
    for bad in (f"sample:{MAX_SAMPLES + 1}", f"sample:{MAX_SAMPLES + 1}:2", "sample:" + "1" * 5000):
        with pytest.raises(CaramelError, match=rf"decoding '{bad[:20]}.*': N is over the cap of {MAX_SAMPLES} "
                                               rf"samples.*2 <= N <= {MAX_SAMPLES}"):
            parse_decoding(bad)
    for n in (0, MAX_SAMPLES + 1, 2.0, True):
        with pytest.raises(CaramelError, match=f"decoding samples must be an integer from 1 to {MAX_SAMPLES}"):
            Decoding(n)


def test_per_trace_comparison_counts_and_interval():
    from experiments.coflow_rl import _versus
    vs = _versus([0.9, 1.0, 1.2, 2.0], [1.0, 1.0, 1.0, 2.0])
    assert (vs["wins"], vs["losses"]) == (1, 1)
    assert vs["pct"]["mean"] == pytest.approx(100 * (-0.1 + 0.2) / 4)
    lo, hi = vs["pct"]["ci95"]
    assert lo < vs["pct"]["mean"] < hi
    assert vs["pct_of_means"] == pytest.approx(100 * (5.1 / 5.0 - 1))
    from experiments.rl_common import ratio_summary
    # by hand: mean 2.5, sd (ddof 1) 12.583, t(0.975, 3) = 3.1824, half-width 3.1824 * 12.583 / 2 = 20.02
    assert ratio_summary([-10, 0, 20, 0])["ci95"] == pytest.approx([-17.522, 22.522], abs=2e-3)


def test_decodings_say_which_are_online():
    assert Decoding().online and Decoding(margin=3.0).online
    assert not Decoding(check=3.0).online and not Decoding(8).online


TINY = ["--objective", "weighted_jct", "--trace", "num_jobs=3,max_steps=1", "--large", "num_jobs=4,max_steps=1",
        "--ppo", "width=8"]


def test_experiment_saves_a_policy_that_evaluates_the_same_and_refuses_overlaps(tmp_path):
    from caramel.jsonio import read_json
    from experiments.coflow_rl import main
    tiny = TINY
    policy, first, second = tmp_path / "p.pt", tmp_path / "a.json", tmp_path / "b.json"
    assert main(tiny + ["--teacher", "rollout", "--improve", "rounds=1,episodes=2,epochs=1", "--val-seeds", "500:502",
                        "--train-seeds", "2000:2004", "--test-seeds", "0:2", "--decode", "greedy,greedy:1,check:1",
                        "--save-policy", str(policy), "--json", str(first)]) == 0
    assert main(tiny + ["--load-policy", str(policy), "--test-seeds", "0:2", "--decode", "greedy,greedy:1,check:1",
                        "--json", str(second)]) == 0
    a, b = (read_json(p, "coflow-rl") for p in (first, second))
    assert a["held_out"]["per_trace"] == b["held_out"]["per_trace"] and "validation" not in b
    assert b["loaded_from"] == str(policy) and b["improve"] == a["improve"] and b["train_seeds"] == [2000, 2004]
    assert a["held_out"]["offline"] == ["ppo_check:1"] and a["held_out_large"]["offline"] == []
    with pytest.raises(SystemExit, match="trained with env"):
        main(tiny[:-1] + ["width=16", "--load-policy", str(policy), "--test-seeds", "0:2"])
    with pytest.raises(SystemExit, match="trained with env"):  # same shapes, another base heuristic
        main(tiny + ["--env", "objective=weighted_jct,base=sebf", "--load-policy", str(policy), "--test-seeds", "0:2"])
    # the policy's own training seeds (outside the default 1000:1256), not --train-seeds, are held out
    for seeds in (["--test-seeds", "2002:2005"], ["--val-seeds", "1999:2001", "--test-seeds", "0:2"]):
        with pytest.raises(SystemExit, match="seeds overlap \\(the policy's"):
            main(tiny + ["--load-policy", str(policy)] + seeds)
    for flags in (["--train-trace", "num_jobs=6"], ["--train-seeds", "5:6"], ["--teacher", "rollout"],
                  ["--improve", "rounds=2"], ["--finetune-steps", "0"]):
        with pytest.raises(SystemExit, match=f"{flags[0]} shape training"):
            main(tiny + ["--load-policy", str(policy), "--test-seeds", "0:2"] + flags)
    saved = torch.load(policy, weights_only=True)
    del saved["training"]["train_seeds"]
    torch.save(saved, tmp_path / "old.pt")
    with pytest.raises(SystemExit, match="does not record the seeds"):
        main(tiny + ["--load-policy", str(tmp_path / "old.pt"), "--test-seeds", "0:2"])


@pytest.mark.parametrize("seeds, pair", [
    (["--train-seeds", "0:3", "--test-seeds", "2:4"], "training and test"),
    (["--train-seeds", "0:3", "--val-seeds", "2:4", "--test-seeds", "10:12"], "training and validation"),
    (["--val-seeds", "0:3", "--test-seeds", "2:4"], "validation and test")])
def test_experiment_refuses_overlapping_seeds(seeds, pair):
    from experiments.coflow_rl import main
    with pytest.raises(SystemExit, match=f"{pair} seeds overlap"):
        main(TINY + seeds)


def test_experiment_refuses_bad_decoding_lists():
    from experiments.coflow_rl import main
    with pytest.raises(SystemExit, match="must include greedy"):
        main(TINY + ["--decode", "greedy:1", "--test-seeds", "0:2"])
    with pytest.raises(SystemExit, match="repeat a name"):
        main(TINY + ["--decode", "greedy,greedy:1,greedy:1.0000001", "--test-seeds", "0:2"])


def test_reports_of_consecutive_seed_ranges_merge_into_the_whole_runs(tmp_path):
    from experiments.coflow_rl import _report, main, merge_reports
    rng = np.random.default_rng(0)
    names = list(HEURISTICS) + ["ppo", "ppo_arrived:check"]

    def raw(lo, hi):
        n = hi - lo
        return {"seeds": [lo, hi], "trace": {"num_jobs": 3}, "offline": [],
                "per_trace": {m: [float(x) for x in rng.uniform(1, 2, n)] for m in names},
                "solve_s_per_trace": {m: [float(x) for x in rng.uniform(0.1, 1, n)] for m in names},
                "counts_per_trace": {"checks": {"ppo_arrived:check": [int(x) for x in rng.integers(0, 5, n)]},
                                     "decisions": {"ppo_arrived:check": [int(x) for x in rng.integers(5, 9, n)]}}}
    a, b = raw(0, 3), raw(3, 5)
    whole = {k: a[k] for k in ("seeds", "trace", "offline")} | {"seeds": [0, 5]}
    for key in ("per_trace", "solve_s_per_trace"):
        whole[key] = {m: a[key][m] + b[key][m] for m in names}
    whole["counts_per_trace"] = {k: {m: a["counts_per_trace"][k][m] + b["counts_per_trace"][k][m]
                                     for m in a["counts_per_trace"][k]} for k in ("checks", "decisions")}
    want = _report(whole, "weighted_srjf")
    assert merge_reports([_report(b, "weighted_srjf"), _report(a, "weighted_srjf")], "weighted_srjf") == want
    assert want["vs"]["ppo_arrived:check"]["policy"]["pct"]["n"] == 5 and "policy" not in want["vs"]["ppo"]
    per_decision = [t / k for t, k in zip(whole["solve_s_per_trace"]["ppo_arrived:check"],
                                          whole["counts_per_trace"]["decisions"]["ppo_arrived:check"])]
    assert want["solve_s_per_decision"]["ppo_arrived:check"]["mean"] == pytest.approx(np.mean(per_decision))
    with pytest.raises(SystemExit, match="not consecutive ranges"):
        merge_reports([_report(a, "weighted_srjf"), _report(raw(4, 6), "weighted_srjf")], "weighted_srjf")
    # each per-trace list holds one value per seed of its part's range
    with pytest.raises(SystemExit, match=rf"part 1 is on seeds \[3, 4\] \(1 traces\) but its per_trace\[{names[0]!r}\] "
                                         r"holds 2 values"):
        merge_reports([a, {**b, "seeds": [3, 4]}], "weighted_srjf")
    short = {**b, "counts_per_trace": {**b["counts_per_trace"], "decisions": {"ppo_arrived:check": [5]}}}
    with pytest.raises(SystemExit, match=r"counts_per_trace\['decisions'\]\['ppo_arrived:check'\] holds 1 values"):
        merge_reports([a, short], "weighted_srjf")
    from caramel.jsonio import format_tag
    top = {"format": format_tag("coflow-rl"), "env": {"base": "weighted_srjf"}, "decode": ["greedy"]}
    paths = []
    for i, part in enumerate((a, b)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps({**top, "held_out": _report(part, "weighted_srjf")}))
    out = tmp_path / "out.json"
    assert main(["--merge", f"{paths[0]},{paths[1]}", "--json", str(out)]) == 0
    # a missing part: one line naming it, not a traceback
    with pytest.raises(SystemExit, match=rf"--merge: {re.escape(str(tmp_path / 'gone.json'))}: no such file"):
        main(["--merge", f"{paths[0]},{tmp_path / 'gone.json'}", "--json", str(out)])
    assert json.loads(out.read_text())["held_out"]["per_trace"] == json.loads(json.dumps(whole["per_trace"]))
    with pytest.raises(SystemExit, match="no other flag \\(got --test-seeds\\)"):
        main(["--merge", f"{paths[0]},{paths[1]}", "--json", str(out), "--test-seeds", "0:5"])
    # a flag given at its default value, an appended one, an abbreviated one: all refused
    with pytest.raises(SystemExit, match="no other flag \\(got --train-trace, --large, --test-seeds\\)"):
        main(["--merge", f"{paths[0]},{paths[1]}", "--train-trace", "num_jobs=3", "--json", str(out),
              "--test", "0:40", "--large", "num_jobs=30"])
    old = {k: v for k, v in _report(b, "weighted_srjf").items() if k not in ("offline", "counts_per_trace")}
    paths[1].write_text(json.dumps({**top, "held_out": old}))  # a report written before --merge existed
    with pytest.raises(SystemExit, match=f"{paths[1]} \\(held_out\\) has no offline, counts_per_trace: it "
                                         f"predates --merge support"):
        main(["--merge", f"{paths[0]},{paths[1]}", "--json", str(out)])
    paths[1].write_text(json.dumps({**top, "decode": ["greedy", "greedy:1"], "held_out": _report(b, "weighted_srjf")}))
    with pytest.raises(SystemExit, match="differ in training, decodings or sections"):
        main(["--merge", f"{paths[0]},{paths[1]}", "--json", str(out)])
