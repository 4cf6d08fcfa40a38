"""A trained placement policy kept in a file, so that training runs apart from a timed
evaluation (`edge_placement --save-policy` then `--load-policy`): the actor's and critic's
weights (a state_dict, loaded with `weights_only`) and how the policy was trained, whose
training seeds the loading run checks disjoint from its held-out seeds."""
from __future__ import annotations

import torch

from caramel.sched.placement import InstanceOptions
from caramel.sched.rl import PpoOptions, make_ppo

# what a file records of its training, and what a loading run must match (the network's shape)
MUST_MATCH = ("scheme", "ppo", "train")


def save_policy(path: str, model, training: dict) -> None:
    torch.save({"state_dict": model.policy.state_dict(), "training": training}, path)


def load_policy(path: str, env_class, expected: dict):
    """(model, training) from a `save_policy` file; `expected`: the loading run's values of
    MUST_MATCH (refused where the file's differ) and nothing else is read from it."""
    saved = torch.load(path, weights_only=True)
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
    return model, {**training, "loaded_from": path}
