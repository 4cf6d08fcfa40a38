"""Branch order, the offline half: which order forward runs independent branches in, and what that does.

With lazy updates each module waits, in the next forward, for the buckets it uses. Where a
block's branches are independent (`caramel.profile.branches`), forward may first run the
branch whose parameters arrive first, hiding the other branches' transfers behind its compute.
The order also moves backward: autograd runs the branches in the reverse of forward's order,
so the branch forward runs last has its gradients ready first.

A profile carries the model's blocks in `meta["branches"]` (`Block.to_dict` each, module names
as in `model.named_modules()`). `reordered_profile(profile, order)` is the profile a forward
running the modules in `order` produces, by this rule, per reorderable block (its *span*: the
profile's modules from its first to its last):

- forward: every module keeps its `forward_time_s`; starts are laid end to end in the new
  order; each parameter's first use moves with its first module in the new order;
- backward: the span's backward ends when it did as measured (its latest parameter ready, a
  tied weight's rows counted) and lasts the sum of its modules' `backward_time_s`; inside it the
  modules run in the reverse of the new order, each parameter ready when the last of its users
  in backward (its first in forward) ends. Parameters used outside the span, and every
  parameter outside it, keep their measured ready times.

The identity order goes through the same rule (`reordered_profile(p, identity_order(p))`), so
a candidate is compared with the identity as modelled, not with a measurement.
`arrival_order` proposes the order; the `caramel` planner simulates it against the identity and
keeps the identity unless the candidate wins.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile, ModuleInfo, ready_orders

BRANCH_ORDER_MODES = ("off", "auto")
META_KEY = "branches"  # in a profile's meta: the model's blocks (`Block.to_dict` each)


def check_branch_order(value: Any) -> str:
    """`value` when it is "off" or "auto", else one `CaramelError` naming the option."""
    if isinstance(value, str) and value in BRANCH_ORDER_MODES:
        return value
    raise CaramelError(f"branch_order must be 'off' (forward runs the model's own order) or 'auto' (the planner may "
                       f"run independent branches in another order when simulation says it is faster), got {value!r}")


@dataclass(frozen=True)
class ProfileBlock:
    """A reorderable block as the profile sees it: per branch, the profile modules (indices into
    `profile.modules`) it calls, and the span [lo, hi] of module indices the block covers."""

    branches: tuple[tuple[int, ...], ...]
    lo: int
    hi: int


def profile_blocks(profile: ModelProfile) -> list[ProfileBlock]:
    """The blocks of `profile.meta["branches"]` that can be reordered in this profile: not fixed,
    at least two branches with profiled modules, and nothing else inside their span."""
    index = {m.name: i for i, m in enumerate(profile.modules)}
    out = []
    for b in profile.meta.get(META_KEY) or []:
        if not isinstance(b, dict) or b.get("fixed") is not None:
            continue
        branches = tuple(tuple(index[n] for n in br if n in index) for br in b.get("branches", []))
        if sum(1 for br in branches if br) < 2:
            continue
        mods = [m for br in branches for m in br]
        lo, hi = min(mods), max(mods)
        if len(set(mods)) != len(mods) or hi - lo + 1 != len(mods):
            continue  # a module in two branches, or another module inside the span: leave it
        if any(br and list(br) != sorted(br) for br in branches):
            continue  # a branch's modules out of forward order: the profile disagrees with the trace
        out.append(ProfileBlock(branches, lo, hi))
    return out


def identity_order(profile: ModelProfile) -> list[str]:
    return [m.name for m in profile.modules]


def order_for(profile: ModelProfile, perms: dict[int, tuple[int, ...]]) -> list[str]:
    """The module order that runs block i's branches (of `profile_blocks`) in `perms[i]`."""
    blocks = profile_blocks(profile)
    order = list(range(len(profile.modules)))
    for i, perm in perms.items():
        b = blocks[i]
        order[b.lo:b.hi + 1] = [m for j in perm for m in b.branches[j]]
    return [profile.modules[m].name for m in order]


def reordered_profile(profile: ModelProfile, module_order: list[str]) -> ModelProfile:
    """The profile a forward in `module_order` produces (module docstring's rule); `profile` is not changed."""
    names = identity_order(profile)
    if sorted(module_order) != sorted(names) or len(set(module_order)) != len(names):
        raise CaramelError(f"module order must list profile {profile.model!r}'s {len(names)} modules once each")
    by_name = {m.name: k for k, m in enumerate(profile.modules)}
    new_pos = {n: k for k, n in enumerate(module_order)}
    # forward: starts end to end in the new order
    t = profile.modules[0].forward_start_s if profile.modules else 0.0
    start: dict[str, float] = {}
    for n in module_order:
        start[n] = t
        t += profile.modules[by_name[n]].forward_time_s
    ready = {p.index: p.ready_time_s for p in profile.params}
    for b in profile_blocks(profile):
        span = profile.modules[b.lo:b.hi + 1]
        span_names = {m.name for m in span}
        moved = [p for m in span for p in m.params
                 if profile.params[p].ready_time_s is not None and profile.params[p].rows_ready_time_s is None
                 and all(u in span_names for u in profile.params[p].use_modules)]
        done = [_done_s(profile, p) for m in span for p in m.params if _done_s(profile, p) is not None]
        if not done:
            continue
        t = max(max(done) - sum(m.backward_time_s for m in span), 0.0)
        end_of: dict[str, float] = {}
        for m in sorted(span, key=lambda m: -new_pos[m.name]):  # backward: the reverse of the new forward
            t += m.backward_time_s
            end_of[m.name] = t
        for p in moved:
            first = min(profile.params[p].use_modules, key=new_pos.__getitem__)
            ready[p] = end_of[first]
    params = []
    for p in profile.params:
        uses = [u for u in p.use_modules if u in new_pos]
        if uses:
            first = min(uses, key=new_pos.__getitem__)
            old_first = profile.modules[p.first_use_order].name if p.first_use_order is not None else first
            shift = start[first] - profile.modules[by_name[old_first]].forward_start_s
            use_t = None if p.first_use_time_s is None else max(p.first_use_time_s + shift, 0.0)
            p = dataclasses.replace(p, first_use_order=new_pos[first], first_use_time_s=use_t)
        params.append(dataclasses.replace(p, ready_time_s=ready[p.index]))
    orders = ready_orders({p.index: p.ready_time_s for p in params if p.ready_time_s is not None})
    for p in params:
        p.ready_order = orders.get(p.index)
    modules = [dataclasses.replace(profile.modules[by_name[n]], forward_start_s=start[n],
                                   params=[p.index for p in params if p.first_use_order == k])
               for k, n in enumerate(module_order)]
    return dataclasses.replace(profile, params=params, modules=modules, meta=dict(profile.meta))


def _done_s(profile: ModelProfile, i: int) -> float | None:
    p = profile.params[i]
    return p.rows_ready_time_s if p.rows_ready_time_s is not None else p.ready_time_s


def arrival_order(profile: ModelProfile, per_byte_s: float) -> dict[int, tuple[int, ...]]:
    """Per reorderable block, its branches sorted by when their parameters' updates could arrive:
    the latest gradient-ready time among a branch's parameters plus the time its bytes take on
    the link (`per_byte_s`), as if it had the link to itself. Whichever way the planner issues
    the transfers, a branch with small, early gradients is back before one with large, late
    ones; the order that runs it first hides the other's transfer behind its compute. A branch
    without parameters goes first; ties keep the model's order."""
    out = {}
    for i, b in enumerate(profile_blocks(profile)):
        def key(j: int) -> tuple[float, int]:
            ps = {p for m in b.branches[j] for p in _uses(profile, profile.modules[m])
                  if profile.params[p].requires_grad and profile.params[p].ready_time_s is not None}
            if not ps:
                return (float("-inf"), j)
            nbytes = sum(profile.params[p].bytes for p in ps)
            return (max(profile.params[p].ready_time_s for p in ps) + nbytes * per_byte_s, j)
        out[i] = tuple(sorted(range(len(b.branches)), key=key))
    return out


def _uses(profile: ModelProfile, m: ModuleInfo) -> list[int]:
    return [p.index for p in profile.params if m.name in p.use_modules]
