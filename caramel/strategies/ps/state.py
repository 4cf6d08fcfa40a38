"""The servers' optimizer state: each rank keeps its shard's; gathered for a checkpoint, moved
when the placement changes; and the step that updates a shard with it (`step_shard`).

The optimizer object is the user's on every rank, but its `state` holds entries only for the
parameters that rank serves (only the owner steps a parameter). `gather_full_state` makes every
rank hold every entry, as one optimizer over the whole model would, so that `state_dict()` on
any rank (the training loop saves from rank 0 only) is the whole server state.
"""
from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn


def _to_cpu(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in state.items()}


def _to(state: dict[str, Any], p: nn.Parameter) -> dict[str, Any]:
    # Adam's "step" stays on the CPU (as torch keeps it unless capturable); the rest follows p
    return {k: (v.to(p.device) if torch.is_tensor(v) and k != "step" else v) for k, v in state.items()}


def _exchange(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], send: list[int], group: Any) -> dict[int, dict]:
    """All ranks: every rank's state of the parameters `send` names, merged (index -> state)."""
    mine = {i: _to_cpu(optimizer.state[params[i]]) for i in send if params[i] in optimizer.state}
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    merged: dict[int, dict] = {}
    for part in everyone:
        merged.update(part)
    return merged


def gather_full_state(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], owner: dict[int, int],
                      rank: int, group: Any) -> None:
    """Every rank gets the state of every parameter (all ranks call this)."""
    merged = _exchange(optimizer, params, [i for i, o in owner.items() if o == rank], group)
    for i, st in merged.items():
        if owner[i] != rank:
            optimizer.state[params[i]] = _to(st, params[i])


def keep_own_state(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], owner: dict[int, int], rank: int) -> None:
    """Drop the state of the parameters another rank serves."""
    for i, o in owner.items():
        if o != rank:
            optimizer.state.pop(params[i], None)


def move_state(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], old: dict[int, int],
               new: dict[int, int], rank: int, group: Any) -> None:
    """A new placement: each moved parameter's state goes from its old server to its new one."""
    moved = [i for i in new if old.get(i) != new[i]]
    merged = _exchange(optimizer, params, [i for i in moved if old.get(i) == rank], group)
    for i in moved:
        if new[i] == rank and i in merged:
            optimizer.state[params[i]] = _to(merged[i], params[i])
    keep_own_state(optimizer, params, new, rank)


def step_shard(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], idx: list[int],
               grads: dict[int, torch.Tensor], hparams: list[dict[str, Any]] | None, inner_step: Any) -> None:
    """The user's optimizer on these parameters only, with their averaged gradients and the
    hyper-parameters of the step that made them (everything restored afterwards)."""
    if not idx:
        return
    chosen = {id(params[i]) for i in idx}
    hparams = hparams if hparams is not None else [{} for _ in optimizer.param_groups]
    saved = [(g["params"], {k: g[k] for k in hp}) for g, hp in zip(optimizer.param_groups, hparams)]
    swapped = [(params[i], params[i].grad) for i in idx]
    try:
        for g, hp in zip(optimizer.param_groups, hparams):
            g.update(hp)
            g["params"] = [p for p in g["params"] if id(p) in chosen]
        for i in idx:
            params[i].grad = grads[i]
        inner_step()
    finally:
        for g, (ps, hp) in zip(optimizer.param_groups, saved):
            g["params"] = ps
            g.update(hp)
        for p, grad in swapped:
            p.grad = grad


def clip_shard(grads: dict[int, torch.Tensor], idx: list[int], max_norm: float, group: Any, device: torch.device) -> None:
    """Scale this shard's averaged gradients `idx` so that the global L2 norm over every shard
    (one all-reduce of the squared norms on `group`, which every server calls) is at most
    `max_norm`: what `torch.nn.utils.clip_grad_norm_` does on DDP's averaged gradients."""
    sq = torch.zeros(1, device=device)
    if idx:
        sq += torch.stack([torch.linalg.vector_norm(grads[i]) for i in idx]).pow(2).sum()
    dist.all_reduce(sq, group=group)
    coef = torch.clamp(max_norm / (sq.sqrt() + 1e-6), max=1.0)  # torch's clip_coef and epsilon
    for i in idx:
        grads[i].mul_(coef)


def send_object(obj: Any, src: int, group: Any, device: torch.device) -> list[tuple[Any, torch.Tensor]]:
    """Broadcast a picklable object from `src` without waiting (its length, then its bytes);
    returns the transfers, to be waited for before the group goes."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    length = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    return [(dist.broadcast(t, src=src, group=group, async_op=True), t) for t in (length, data)]


def recv_object(src: int, group: Any, device: torch.device) -> Any:
    """The receiving side of `send_object`."""
    length = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(length, src=src, group=group)
    data = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=src, group=group)
    return pickle.loads(data.cpu().numpy().tobytes())


def hparams_key(hparams: list[dict[str, Any]] | None) -> Any:
    """A comparable form of a hyper-parameter snapshot (tensors as lists)."""
    if hparams is None:
        return None
    return [sorted((k, v.tolist() if torch.is_tensor(v) else v) for k, v in g.items()) for g in hparams]
