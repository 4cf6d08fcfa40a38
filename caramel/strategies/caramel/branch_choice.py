"""The `caramel` planner's choice of branch order (`branch_order="auto"`), by simulation.

The identity order, as modelled (`caramel.plan.branch_order.reordered_profile`), is planned
first; the candidate runs each block's branches in the order their updates could arrive
(`arrival_order`: gradient ready plus the branch's bytes on the link). The candidate is planned too,
and kept only when its objective (the same the plan search minimizes: the mean step time over
the input spread) beats the identity's by more than `BRANCH_MARGIN`; else the model's own
order stays, and the plan is made for the measured profile exactly as without the option.
"""
from __future__ import annotations

from typing import Any, Callable

from caramel.plan.branch_order import arrival_order, identity_order, order_for, profile_blocks, reordered_profile
from caramel.plan.plan import Plan
from caramel.profile.model_profile import ModelProfile

BRANCH_MARGIN = 0.01  # a reorder must beat the identity by more than 1% of the objective


def choose_branch_order(profile: ModelProfile, per_byte_s: float,
                        search: Callable[[ModelProfile], tuple[Plan, float]]) -> tuple[ModelProfile, list[str] | None, dict[str, Any]]:
    """(the profile to plan for, its module order or None for the model's own, the decision
    for `plan.options["branch_order"]`). `search(profile)` plans a profile: (plan, objective)."""
    blocks = profile_blocks(profile)
    decision: dict[str, Any] = {"mode": "auto", "blocks": len(blocks), "chosen": None}
    if profile.meta.get("branches_reason"):
        decision["untraced"] = profile.meta["branches_reason"]
    if not blocks:
        return profile, None, decision
    ident = reordered_profile(profile, identity_order(profile))
    _, obj_id = search(ident)
    perms = arrival_order(ident, per_byte_s)
    decision["identity_s"] = obj_id
    if all(perm == tuple(range(len(perm))) for perm in perms.values()):
        return profile, None, decision
    order = order_for(profile, perms)
    cand = reordered_profile(profile, order)
    _, obj_c = search(cand)
    decision.update(candidate_s=obj_c, permutations={str(i): list(p) for i, p in perms.items()})
    if obj_c < obj_id * (1 - BRANCH_MARGIN):
        decision["chosen"] = order
        return cand, order, decision
    return profile, None, decision
