"""The placement policy of `edge_placement`, trained (`train_policies`) and kept in a file, so
that training runs apart from a timed evaluation (`--save-policy` then `--load-policy`): the
actor's and critic's weights (a state_dict, loaded with `weights_only`) and how the policy was
trained, whose training seeds the loading run checks disjoint from its held-out seeds, and
which code trained it (the checkout's commit, and whether tracked files differed from it), so
that a file whose training does not reproduce can be traced to its code."""
from __future__ import annotations

import time

import torch

from caramel.bench.provenance import code_version
from caramel.sched.improve import improve
from caramel.sched.placement import InstanceOptions
from caramel.sched.placement.rollout import ilp_teacher, rollout_teacher
from caramel.sched.rl import PpoOptions, make_ppo, train_ppo

TEACHERS = {"rollout": rollout_teacher, "ilp": ilp_teacher}

# what a file records of its training, and what a loading run must match (the network's shape)
MUST_MATCH = ("scheme", "ppo", "train")
# the training record `train_policies` writes: a loading run reports these keys as its own; any
# other key a file carries is kept under FILE_NOTES, so that it cannot stand in for a report field
TRAINING_KEYS = ("train", "ppo", "train_mid", "teacher", "improve", "improve_rounds", "finetune_steps",
                 "finetune_on", "finetune_teacher", "finetune_improve", "finetune_rounds", "finetune_s",
                 "train_seeds", "train_s", "scheme", "groups", "train_s_per_groups", "trained_commit",
                 "trained_dirty")
FILE_NOTES = "policy_file_notes"


def code_record() -> dict:
    """The code training starts on: `trained_commit` (12 hex digits) and `trained_dirty` (tracked
    files differ from that commit: the code that ran was not committed); both None outside a
    git checkout."""
    code = code_version()
    if code.startswith("caramel "):
        return {"trained_commit": None, "trained_dirty": None}
    return {"trained_commit": code.removesuffix("-dirty"), "trained_dirty": code.endswith("-dirty")}


def save_policy(path: str, model, training: dict) -> None:
    torch.save({"state_dict": model.policy.state_dict(), "training": training}, path)


def load_policy(path: str, env_class, expected: dict):
    """(model, training) from a `save_policy` file; `expected`: the loading run's values of
    MUST_MATCH (refused where the file's differ) and nothing else is read from it. `training`
    holds the file's TRAINING_KEYS, `loaded_from`, and its other keys under FILE_NOTES (None
    when it has none)."""
    try:
        saved = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"--load-policy {path}: no such file; expected a file --save-policy wrote") from None
    except Exception as e:  # not a torch file, or one holding more than weights and a record
        raise SystemExit(f"--load-policy {path}: not a file --save-policy wrote ({type(e).__name__})") from None
    training = saved.get("training", {}) if isinstance(saved, dict) else {}
    missing = [key for key in MUST_MATCH + ("train_seeds",) if key not in training]
    if missing or "state_dict" not in saved:
        raise SystemExit(f"--load-policy {path}: not a file --save-policy wrote (it lacks {missing or 'weights'})")
    for key in MUST_MATCH:
        if key in expected and training[key] != expected[key]:
            raise SystemExit(f"--load-policy {path}: trained with {key} {training[key]!r}, this run has "
                             f"{expected[key]!r}; pass the same (or drop the flag)")
    env = env_class(InstanceOptions(**training["train"]), [0])
    model = make_ppo(env, PpoOptions(**training["ppo"]))
    model.policy.load_state_dict(saved["state_dict"])
    notes = {key: value for key, value in training.items() if key not in TRAINING_KEYS}
    return model, {**{key: training[key] for key in TRAINING_KEYS if key in training}, "loaded_from": path,
                   FILE_NOTES: notes or None}


def train_policies(args, groups, env_class, train_opts, mid, refine, ppo, improve_opts, refine_opts,
                   finetune_teacher, train) -> tuple[list, dict]:
    """One policy per G (one without --groups), trained as it is decoded; and what the report
    (and a --save-policy file) records of the training."""
    models, train_times, rounds_per, refine_per, refine_s = [], [], [], [], []
    code = code_record()  # at the start: the modules training imports are the ones loaded now
    for g in groups or [None]:
        kw = {} if g is None else {"groups": g}
        start = time.perf_counter()
        envs = [env_class(train_opts, train, **kw)] + ([env_class(mid, train, **kw)] if mid is not None else [])
        rounds = []
        if args.teacher == "none":
            model = train_ppo(envs[0], ppo)
        else:
            model = make_ppo(envs[0], ppo)
            rounds = improve(model, envs, TEACHERS[args.teacher], improve_opts)
            if refine is not None:  # round 0 follows the teacher, later ones the policy (DAgger)
                refine_start = time.perf_counter()
                refine_per.append(improve(model, [env_class(refine, train, **kw)], TEACHERS[finetune_teacher],
                                          refine_opts))
                refine_s.append(time.perf_counter() - refine_start)
            if args.finetune_steps > 0:
                model.learn(total_timesteps=args.finetune_steps)
        train_times.append(time.perf_counter() - start)
        models.append(model)
        rounds_per.append(rounds)
    return models, {
        "train": vars(train_opts), "ppo": vars(ppo),
        "train_mid": vars(mid) if mid is not None else None, "teacher": args.teacher,
        "improve": vars(improve_opts) if args.teacher != "none" else None,
        "improve_rounds": rounds_per[0] if groups is None else rounds_per,
        "finetune_steps": args.finetune_steps if args.teacher != "none" else None,
        # DAgger rounds on larger instances after the imitation (their time is in train_s too)
        "finetune_on": vars(refine) if refine is not None else None,
        "finetune_teacher": finetune_teacher if refine is not None else None,
        "finetune_improve": vars(refine_opts) if refine is not None else None,
        "finetune_rounds": (refine_per[0] if groups is None else refine_per) if refine is not None else None,
        "finetune_s": refine_s if refine is not None else None,
        "train_seeds": [train[0], train[-1] + 1], "train_s": sum(train_times),
        "scheme": args.scheme, "groups": groups, "train_s_per_groups": train_times if groups else None,
        **code}
