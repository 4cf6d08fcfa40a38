"""Worker functions for the balance="dropout" tests (spawned; must be importable)."""
from __future__ import annotations

import collections
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

import caramel
import caramel.profile.slowdown as slowdown
import caramel.strategies.caramel.dropout as dropout
from caramel.models.zoo import SmallCNN
from caramel.profile.slowdown import slow_down
from caramel.strategies.caramel.dropout import kept_units
from tests.distributed.workers import max_diff, params_of
from tests.strategies.adapt.virtual_clock import VirtualClock


def _data(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 3, 16, 16, generator=g), torch.randint(0, 10, (6,), generator=g)


def _train(model, opt, steps: int, rank: int, start: int = 0) -> None:
    for s in range(start, start + steps):
        x, y = _data(s, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()


def _fresh():
    torch.manual_seed(0)
    return SmallCNN()


def zero_fraction_worker(rank: int, world: int, table: str, steps: int) -> dict:
    """balance='off' against balance='dropout' that never drops: the same parameters, bit for bit."""
    torch.set_num_threads(1)
    out = []
    for options in ({}, {"balance": "dropout", "dropout_table": table, "balance_every": 0}):
        m = _fresh()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        model, opt = caramel.parallelize(m, opt, overlap="forward", **options)
        _train(model, opt, steps, rank)
        out.append(params_of(model.module))
    return {"same": all(torch.equal(a, b) for a, b in zip(*out)), "diff": max_diff(*out),
            "patched": _patched(model.module)}


def _patched(model: torch.nn.Module) -> list[str]:
    """The modules running a narrow forward (a split one, for a deferred weight gradient, is not)."""
    return [n for n, m in model.named_modules() if getattr(m.__dict__.get("forward"), "wraps_forward", False)]


def _computed(rank_kept: list[dict[str, torch.Tensor]], model: SmallCNN) -> list[dict[str, torch.Tensor]]:
    """Per rank, 1.0 on the parameter entries that rank computed (written out for SmallCNN: the
    reference does not use the strategy's own bookkeeping)."""
    out = []
    for kept in rank_kept:
        k1, k2 = (torch.zeros(n).index_fill_(0, kept[g], 1.0) for g, n in (("conv1", 8), ("conv2", 16)))
        fc_cols = k2.repeat_interleave(16)
        out.append({"conv1.weight": k1.view(8, 1, 1, 1).expand(8, 3, 3, 3), "bn1.weight": k1, "bn1.bias": k1,
                    "conv2.weight": (k2[:, None] * k1[None, :]).view(16, 8, 1, 1).expand(16, 8, 3, 3),
                    "bn2.weight": k2, "bn2.bias": k2, "fc.weight": fc_cols[None, :].expand(10, 256),
                    "fc.bias": torch.ones(10)})
    return out


def fixed_masks_worker(rank: int, world: int, table: str, fractions: list[float]) -> dict:
    """Two undropped steps, then one step with fixed fractions: SGD lr 1, so the update is minus
    the averaged gradient; against each entry's mean over the ranks that computed it."""
    torch.set_num_threads(1)
    m = _fresh()
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    model, opt = caramel.parallelize(m, opt, overlap="forward", balance="dropout", dropout_table=table, balance_every=0)
    _train(model, opt, 2, rank)
    balancer = opt.engine.controller.balancer
    balancer.set_fractions(fractions)
    before = copy.deepcopy(model.module.state_dict())
    _train(model, opt, 1, rank, start=2)
    # the reference: every rank's narrowed gradient, computed here in one process
    kept = [{g: kept_units(0, 2, r, gi, n, fractions[r]) for gi, (g, n) in enumerate((("conv1", 8), ("conv2", 16)))}
            for r in range(world)]
    kept = [{g: (torch.arange(n) if k is None else k) for (g, k), n in zip(kr.items(), (8, 16))} for kr in kept]
    grads = []
    for r in range(world):
        ref = _fresh()
        ref.load_state_dict(before)
        x, y = _data(2, r)
        # the narrow model, written out by hand: sliced weights, input scaled by units / kept
        k1, k2 = kept[r]["conv1"], kept[r]["conv2"]
        h = F.conv2d(x, ref.conv1.weight[k1], padding=1)
        h = F.batch_norm(h, None, None, ref.bn1.weight[k1], ref.bn1.bias[k1], True)
        h = F.max_pool2d(F.relu(h), 2) * (8 / len(k1))
        h = F.conv2d(h, ref.conv2.weight[k2][:, k1], padding=1)
        h = F.batch_norm(h, None, None, ref.bn2.weight[k2], ref.bn2.bias[k2], True)
        h = torch.flatten(F.max_pool2d(F.relu(h), 2), 1) * (16 / len(k2))
        cols = (k2[:, None] * 16 + torch.arange(16)).reshape(-1)
        loss = F.cross_entropy(F.linear(h, ref.fc.weight[:, cols], ref.fc.bias), y)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in ref.named_parameters()})
    masks = _computed(kept, model.module)
    diffs = {}
    for n, p in model.module.named_parameters():
        total = sum(g[n] * mk[n] for g, mk in zip(grads, masks))
        count = sum(mk[n] for mk in masks)
        expected = before[n] - torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
        diffs[n] = float((p.detach() - expected).abs().max())
    dropped = {n: float((grads[1][n] == 0).float().mean()) for n in ("conv2.weight", "fc.weight")}
    patched_while_dropping = _patched(model.module)
    balancer.set_fractions([0.0, 0.0])  # nothing dropped again: the layers' own forwards come back
    return {"diffs": diffs, "dropped_share": dropped, "patched": patched_while_dropping,
            "patched_after": _patched(model.module)}


class _GatherBehind:
    """`torch.distributed` for the dropout balancer on the `VirtualClock`: its all-gather blocks
    the faster rank by `lead_s()`, the slow rank's longer step, as it does on a real clock (the
    ranks are not level at a step's end: the reductions overlap the next forward)."""

    def __init__(self, clock: VirtualClock, lead_s) -> None:
        self.clock, self.lead_s = clock, lead_s
        self.held_s: list[float] = []  # each virtual block, so a test sees that there were some

    def all_gather(self, *args, **kwargs):
        out = dist.all_gather(*args, **kwargs)
        if self.clock.t is not None:
            self.held_s.append(self.lead_s())
            self.clock.t += self.held_s[-1]
        return out

    def __getattr__(self, name: str):
        return getattr(dist, name)


_SLOW_S_PER_SAMPLE = (0.002, 0.014)  # rank 0's and rank 1's forward slow-down


def decide_worker(rank: int, world: int, table: str, steps: int) -> dict:
    """Rank 1's forward is slowed by 14 ms per sample, rank 0's by 2 ms (84 against 12 ms a step;
    `slow_down`, scaled by the drop's time ratio): the balancer gives rank 1 the table's fastest
    entry and keeps it. The slow-downs are real sleeps while the first steps are profiled and
    planned; from the plan's adoption on they pass on a `VirtualClock`, the engine's clock, so
    the windows hold exact compute times: on a loaded host, wall-clock windows let the noise
    of the two windows (a drop's rank's estimates scaled up by 1 / its time ratio) withdraw the
    drop again at the last decisions. Each decision's gather holds rank 0 by rank 1's lead
    (`_GatherBehind`): only counting it as a wait keeps rank 0's window at its 12 ms."""
    torch.set_num_threads(1)
    m = _fresh()
    clock = VirtualClock()
    slowdown.time = clock  # this spawned process's slow-downs only
    slow_down(m, _SLOW_S_PER_SAMPLE[rank])
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    # default options: deferred and early weight gradients allowed, profiled and planned first
    model, opt = caramel.parallelize(m, opt, overlap="forward", balance="dropout", dropout_table=table, balance_every=4)
    c = opt.engine.controller
    b = c.balancer

    def lead_s() -> float:  # rank 0 reaches the gather this much before rank 1 (6 samples a step)
        steps_s = [6 * _SLOW_S_PER_SAMPLE[r] * b.table.ratio(b.fractions[r]) for r in range(world)]
        return max(steps_s[1] - steps_s[0], 0.0) if rank == 0 else 0.0

    gathers = dropout.dist = _GatherBehind(clock, lead_s)  # this spawned process's balancer only
    # per step: whether its time entered the window, and whether it was a profiling step
    # or one whose period held a plan's adoption (planned at the end of the step before)
    record, adopted_at = [], set()
    step_end, adopt = b.step_end, c.adopt

    b.times = _CountingDeque(b.times, maxlen=b.times.maxlen)

    def recording_step_end(*args, **kwargs) -> None:
        before = b.times.appended
        untimed = c.profiling or c.uses_pending or opt.engine.stats.step - 1 in adopted_at
        step_end(*args, **kwargs)
        record.append((opt.engine.stats.step, b.times.appended > before, untimed))

    def recording_adopt(*args, **kwargs):
        adopted_at.add(opt.engine.stats.step)
        out = adopt(*args, **kwargs)
        clock.start(opt.engine)
        return out

    b.step_end, c.adopt = recording_step_end, recording_adopt
    _train(model, opt, steps, rank)
    return {"fractions": b.fractions, "changes": len(b.changes), "ratio": b.compute_ratio(),
            "first_drop_step": b.changes[0]["step"] if b.changes else None, "window": list(b.times),
            "held_s": gathers.held_s,
            "untimed_steps": [s for s, _, u in record if u], "timed_untimed": [s for s, t, u in record if t and u]}


def _left_on(model: torch.nn.Module) -> list[str]:
    """What a parallelized run left on the module: instance forwards, module and gradient hooks."""
    left = [f"{n}.forward" for n, mod in model.named_modules() if "forward" in mod.__dict__]
    left += [f"{n} hooks" for n, mod in model.named_modules()
             if mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks]
    return left + [f"{n} grad hook" for n, p in model.named_parameters() if p._post_accumulate_grad_hooks]


class _CountingDeque(collections.deque):
    appended = 0

    def append(self, x) -> None:
        self.appended += 1
        super().append(x)


def split_worker(rank: int, world: int, table: str, steps: int) -> dict:
    """balance='dropout' with fixed drops (from the first step) and nothing dropped, each with its
    layers' weight gradients deferred (compute_schedule=3: conv1, conv2, fc), early, or neither:
    the same parameters, bit for bit; nothing dropped with deferral is balance='off' with it."""
    torch.set_num_threads(1)
    runs = {"off/defer": ({"compute_schedule": 3}, None),
            "zero/defer": ({"balance": "dropout", "compute_schedule": 3}, [0.0, 0.0])}
    for split, extra in (("plain", {"compute_schedule": "off", "early_weight_grad": False}),
                         ("defer", {"compute_schedule": 3, "early_weight_grad": False}),
                         ("early", {"compute_schedule": "off", "early_weight_grad": True})):
        runs[f"drop/{split}"] = (dict(extra, balance="dropout"), [0.25, 0.5])
    out, deferred, early, split_steps, kept_bytes, left = {}, {}, {}, {}, {}, {}
    for name, (options, fractions) in runs.items():
        if "balance" in options:
            options = dict(options, dropout_table=table, balance_every=0)
        m = _fresh()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        model, opt = caramel.parallelize(m, opt, overlap="forward", profile_steps=1, **options)
        if fractions is not None:
            opt.engine.controller.balancer.set_fractions(fractions)
        split_steps[name] = 0
        for s in range(steps):
            before = opt.engine.early_handovers
            x, y = _data(s, rank)
            F.cross_entropy(model(x), y).backward()
            # a step both dropped (every conv and linear layer of SmallCNN narrowed on both ranks)
            # and split: a deferred layer under a narrow forward, or an early hand-over
            narrowed = getattr(model.module.conv2.__dict__.get("forward"), "wraps_forward", False)
            deferred_now = any(getattr(mod.__dict__.get("forward"), "below", None) is not None
                               for _, mod in opt.engine._split_names)
            split_steps[name] += int(narrowed and (deferred_now or opt.engine.early_handovers > before))
            opt.step()
            opt.zero_grad()
        opt.synchronize()
        out[name] = params_of(model.module)
        schedule = opt.engine.plan.compute_schedule
        deferred[name] = list(schedule.modules) if schedule else []
        early[name] = opt.engine.early_handovers
        profile = opt.engine.controller.profile
        kept_bytes[name] = {i.name: i.deferred_bytes for i in profile.modules if i.deferred_bytes} if profile else {}
        caramel.shutdown()
        left[name] = _left_on(m)
    # the module of the last run (dropped, split early) parallelized again: it trains as a fresh one
    m2 = copy.deepcopy(m)
    again = {}
    for mod in (m, m2):
        opt = torch.optim.SGD(mod.parameters(), lr=0.1)
        model, opt = caramel.parallelize(mod, opt, overlap="forward", profile_steps=1, compute_schedule=3)
        _train(model, opt, 3, rank)
        again[mod is m] = params_of(model.module)
        caramel.shutdown()
    same = {k: all(torch.equal(a, b) for a, b in zip(out[ref], out[k]))
            for k, ref in (("drop/defer", "drop/plain"), ("drop/early", "drop/plain"), ("zero/defer", "off/defer"))}
    return {"same": same, "deferred": deferred, "early": early, "split_steps": split_steps, "kept_bytes": kept_bytes,
            "left": left, "again_same": all(torch.equal(a, b) for a, b in zip(again[True], again[False])),
            "dropped": not all(torch.equal(a, b) for a, b in zip(out["drop/plain"], out["off/defer"]))}
