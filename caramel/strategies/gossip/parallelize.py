"""Run the `gossip` strategy: `parallelize_gossip` wraps the model and the user's optimizer
around an `Exchange` (`caramel.strategies.gossip.engine`).

Every worker starts from rank 0's model (as DDP does) and then keeps its own parameters: after
each `optimizer.step()` they go to the worker's out-neighbours of the step's mixing matrix
(`topology.py`), and each module mixes what arrived just before its next forward. Workers'
parameters differ between mixes; `GossipRun.consensus` (`run.py`) records by how much, and
`averaged_module()` gives the workers' average (for evaluation and reports).
"""
from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from caramel.distributed import init_distributed, resolve_timeout_s
from caramel.errors import CaramelError
from caramel.profile.profiler import unique_params
from caramel.strategies.gossip.moments import check_second_moment_optimizer
from caramel.strategies.gossip.options import GossipOptions
from caramel.strategies.gossip.run import GossipRun, momentum_keys
from caramel.strategies.gossip.topology import mixing_matrix
from caramel.strategies.gossip.tracking import check_dense_grads
from caramel.strategies.gossip.wrappers import GossipModel, GossipOptimizerMixin, wrap_optimizer
from caramel.strategies.options import check_same_everywhere


def _check_optimizer(optimizer: torch.optim.Optimizer, options: GossipOptions) -> None:
    if options.mixes_moments:
        keys = momentum_keys(optimizer, options.algorithm)
        if keys == ("momentum_buffer",) and any(g.get("momentum", 0) <= 0 for g in optimizer.param_groups):
            raise CaramelError(f"strategy 'gossip': algorithm={options.algorithm} needs SGD with momentum > 0 in every "
                               "parameter group (there is no momentum buffer to exchange otherwise)")
    if options.algorithm == "adam" and not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise CaramelError(f"strategy 'gossip': algorithm=adam is decentralized Adam(W) (Wang et al.); "
                           f"pass torch.optim.Adam or AdamW, got {type(optimizer).__name__} "
                           "(algorithm=overlap is the same overlapped form for any optimizer)")
    if options.debiases:
        check_second_moment_optimizer(optimizer)


def parallelize_gossip(model: nn.Module, optimizer: torch.optim.Optimizer, options: GossipOptions, *,
                       process_group: Any = None, broadcast_buffers: bool | str = True,
                       find_unused_parameters: bool | None = None, timeout_s: float | None = None,
                       plan: Any = None, profile: Any = None, cluster: Any = None,
                       trace: str | None = None, session: Any = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """`caramel.parallelize(model, optimizer, "gossip", ...)`; see the module docstring.
    `broadcast_buffers` has no meaning here (floating buffers are gossiped like parameters)."""
    if plan is not None or profile is not None:
        raise CaramelError("strategy 'gossip' takes no plan= or profile= (its exchange follows the topology)")
    if isinstance(optimizer, GossipOptimizerMixin):
        raise CaramelError("strategy 'gossip': this optimizer is already parallelized")
    _check_optimizer(optimizer, options)
    names, params = unique_params(model)
    if options.tracks:  # before any process group exists
        check_dense_grads(model, [(n, p) for n, p in zip(names, params) if not options.is_local(n)])
    known = {id(p) for p in params}
    if any(id(p) not in known for g in optimizer.param_groups for p in g["params"]):
        raise CaramelError("strategy 'gossip': the optimizer holds parameters that are not the model's; "
                           "make the optimizer from this model's parameters()")
    if not dist.is_initialized():
        init_distributed(timeout_s=timeout_s)
    ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
    if isinstance(options.topology, list) or options.topology.endswith(".json"):
        mixing_matrix(options.topology, len(ranks))  # a bad matrix is an error before any group exists
    # frozen parameters are not gossiped: ranks freezing different ones would cut other messages
    check_same_everywhere("gossip", options, [(n, tuple(p.shape), p.requires_grad) for n, p in model.named_parameters()],
                          process_group, "parameters (shapes, requires_grad)")
    timeout = datetime.timedelta(seconds=resolve_timeout_s(timeout_s))
    up, down, control = (dist.new_group(ranks, timeout=timeout) for _ in range(3))
    # A group's first batch_isend_irecv must involve all its ranks (NCCL); a one-peer topology
    # leaves some ranks without a message on `down` at the first exchange, so set both up here.
    for g in (up, down):
        dist.barrier(group=g)
    with torch.no_grad():  # every worker starts from rank 0's model, as DDP does
        for t in list(params) + list(model.buffers()):
            dist.broadcast(t, src=ranks[0], group=control)
    run = GossipRun(model, optimizer, options, ranks, (up, down), control, str(trace) if trace else None)
    if session is not None:
        session.register(run)
    return GossipModel(model, run), wrap_optimizer(optimizer, run)
