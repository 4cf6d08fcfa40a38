"""Independent branches of a model's forward, found by FX tracing, and forwards that run them in another order.

An Inception block's four branches, or the towers of a multi-tower model, depend on the same
input (or on separate inputs) and meet again at one node (a `cat`, an add); nothing flows
between them, so forward may run them in any order. Backward runs them in the reverse of the
order forward did, so the order decides which branch's gradients are ready first and which
branch's updates the next forward needs first (`caramel.plan.branch_order` chooses it).

`find_branches(model)` traces the forward with `torch.fx` (every module that owns parameters or
buffers stays one call, so the engine's pre-hooks on it still fire) and returns the `Block`s:
for each fork (a value with several users, or the inputs together) and its join (the first
node every path from the fork passes through), the region's connected components that call
modules. `BranchGraph.reordered(orders)` is a `GraphModule` over the same module objects whose
forward runs each block's branches in the given order: the same outputs bit for bit, the same
parameters. A block is left as it is (`Block.fixed` says why) where its order could change a
result: two branches drawing random numbers, a module called from two branches (its state, a
BatchNorm's running statistics, would update in another order), or an in-place op on a value
from outside its branch. An untraceable forward is no error: `BranchGraph.reason` says why.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn

# call_function targets that draw random numbers (order across branches changes the stream)
_RANDOM_FUNCTIONS = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.bernoulli, torch.multinomial,
                     torch.normal, torch.rand_like, torch.randn_like, torch.randint_like,
                     nn.functional.dropout, nn.functional.dropout1d, nn.functional.dropout2d,
                     nn.functional.dropout3d, nn.functional.alpha_dropout, nn.functional.feature_alpha_dropout}
_RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_INPLACE_FUNCTIONS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.setitem}


@dataclass(frozen=True)
class Block:
    """Branches that forward may run in any order: per branch, the modules it calls (FX targets,
    the names of `model.named_modules()`), in the order the traced forward calls them."""

    branches: tuple[tuple[str, ...], ...]
    fixed: str | None = None  # why this block must keep its order; None: it may be reordered

    def to_dict(self) -> dict:
        return {"branches": [list(b) for b in self.branches], "fixed": self.fixed}


@dataclass
class BranchGraph:
    """A traced forward and its blocks; `gm` None (and `reason` set) when the forward could not be traced."""

    gm: fx.GraphModule | None
    blocks: list[Block] = field(default_factory=list)
    reason: str | None = None
    # per block: the region's node lists, one per connected component, in graph order
    _regions: list[list[list[fx.Node]]] = field(default_factory=list, repr=False)
    _module_comp: list[list[int]] = field(default_factory=list, repr=False)  # per block: component index of each branch

    def reorderable(self) -> list[int]:
        """Indices of the blocks whose order may change."""
        return [i for i, b in enumerate(self.blocks) if b.fixed is None]

    def reordered(self, orders: dict[int, tuple[int, ...]]) -> fx.GraphModule:
        """A GraphModule whose forward runs block i's branches in `orders[i]` (a permutation of
        its branch indices; blocks not named keep theirs). It calls the model's own module objects."""
        assert self.gm is not None, self.reason
        # each reordered region is emitted where its last node was: every value a region node
        # reads from outside it is defined before that, and only the join (after it) reads the region
        moved: dict[fx.Node, int] = {}  # last node of each reordered region -> block
        skip: set[fx.Node] = set()
        for i, order in orders.items():
            block = self.blocks[i]
            if block.fixed is not None:
                raise ValueError(f"block {i} keeps its order: {block.fixed}")
            if sorted(order) != list(range(len(block.branches))):
                raise ValueError(f"block {i}: {order} is not a permutation of its {len(block.branches)} branches")
            nodes = [n for comp in self._regions[i] for n in comp]
            moved[max(nodes, key=self._position)] = i
            skip.update(nodes)
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}

        def copy(n: fx.Node) -> None:
            env[n] = graph.node_copy(n, lambda a: env[a])

        for n in self.gm.graph.nodes:
            if n in moved:
                i = moved[n]
                comps = self._regions[i]
                branch_comps = [self._module_comp[i][b] for b in orders[i]]
                rest = [c for c in range(len(comps)) if c not in branch_comps]  # module-free pieces: first, as they were
                for c in rest + branch_comps:
                    for m in comps[c]:
                        copy(m)
            elif n not in skip:
                copy(n)
        graph.lint()  # every value defined before its use
        return fx.GraphModule(self.gm, graph, class_name=type(self.gm).__name__)

    def _position(self, n: fx.Node) -> int:
        if not hasattr(self, "_pos"):
            self._pos = {m: k for k, m in enumerate(self.gm.graph.nodes)}
        return self._pos[n]


class _Tracer(fx.Tracer):
    """Keeps every module that owns parameters or buffers as one call (torch's leaves too), so a
    module the engine hooks is always called, never inlined."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        own = next(m.parameters(recurse=False), None) is not None or next(m.buffers(recurse=False), None) is not None
        return own or super().is_leaf_module(m, qualname)


def trace(model: nn.Module) -> tuple[fx.GraphModule | None, str | None]:
    """(the traced forward, None), or (None, why not)."""
    try:
        graph = _Tracer().trace(model)
    except Exception as e:  # FX raises many kinds (TraceError, TypeError on data-dependent control flow, ...)
        return None, f"forward is not FX-traceable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    gm = fx.GraphModule(model, graph, class_name=type(model).__name__)
    for n in gm.graph.nodes:
        # a parameter read outside its module's call (F.linear(x, self.fc.weight)) would run
        # before that module's pre-hook applies its update; the root's own are applied first
        if n.op == "get_attr" and "." in n.target:
            return None, f"forward reads {n.target} outside its module's call"
    return gm, None


def find_branches(model: nn.Module) -> BranchGraph:
    """Trace `model` and find its blocks of independent branches (module docstring)."""
    gm, reason = trace(model)
    if gm is None:
        return BranchGraph(None, reason=reason)
    nodes = list(gm.graph.nodes)
    pos = {n: k for k, n in enumerate(nodes)}
    modules = dict(model.named_modules())
    out = BranchGraph(gm)
    seen_regions: set[frozenset] = set()
    placeholders = [n for n in nodes if n.op == "placeholder" and n.users]
    forks: list[list[fx.Node]] = [[n] for n in nodes if n.op != "output" and len(n.users) > 1]
    if len(placeholders) > 1:
        forks.insert(0, placeholders)  # the inputs together: towers on separate inputs
    for fork in forks:
        region = _region(fork, nodes, pos)
        if not region or frozenset(region) in seen_regions:
            continue
        comps = _components(region, pos)
        module_comps = [c for c, comp in enumerate(comps) if any(n.op == "call_module" for n in comp)]
        if len(module_comps) < 2:
            continue
        if any(frozenset(region) < s for s in seen_regions):
            continue  # nested in a branch of an outer block: the outer order is what matters here
        seen_regions.add(frozenset(region))
        branches = tuple(tuple(n.target for n in comps[c] if n.op == "call_module") for c in module_comps)
        fixed = _why_fixed([comps[c] for c in module_comps] + [comps[c] for c in range(len(comps))
                                                               if c not in module_comps], modules)
        out.blocks.append(Block(branches, fixed))
        out._regions.append(comps)
        out._module_comp.append(module_comps)
    return out


def _region(fork: list[fx.Node], nodes: list[fx.Node], pos: dict[fx.Node, int]) -> list[fx.Node]:
    """The nodes strictly between `fork` and its join, in graph order; [] when the paths meet only at the output.

    Walks forward in graph (topological) order counting the edges still open from the fork's
    descendants: the join is the first node that closes them all."""
    inside = set(fork)
    open_edges = sum(len(f.users) for f in fork)
    region: list[fx.Node] = []
    for n in nodes[max(pos[f] for f in fork) + 1:]:
        incoming = sum(1 for a in n.all_input_nodes if a in inside)
        if incoming == 0:
            continue
        open_edges -= incoming
        if open_edges == 0:
            return region if n.op != "output" else []
        inside.add(n)
        region.append(n)
        if not n.users:  # a dead end: the paths through it never meet the others
            return []
        open_edges += len(n.users)
    return []


def _components(region: list[fx.Node], pos: dict[fx.Node, int]) -> list[list[fx.Node]]:
    """Connected components of the region (edges inside it, either direction), each in graph order."""
    parent = {n: n for n in region}

    def find(n: fx.Node) -> fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in region:
        for a in n.all_input_nodes:
            if a in parent:
                parent[find(a)] = find(n)
    comps: dict[fx.Node, list[fx.Node]] = {}
    for n in region:
        comps.setdefault(find(n), []).append(n)
    return sorted(comps.values(), key=lambda c: pos[c[0]])


def _why_fixed(comps: list[list[fx.Node]], modules: dict[str, nn.Module]) -> str | None:
    """Why the order of these components could change a result, or None."""
    random_comps = 0
    owner: dict[str, int] = {}
    for c, comp in enumerate(comps):
        members = set(comp)
        draws = False
        for n in comp:
            mod = modules.get(n.target) if n.op == "call_module" else None
            if mod is not None:
                if owner.setdefault(n.target, c) != c:
                    return f"module {n.target} is called from two branches"
                draws |= isinstance(mod, _RANDOM_MODULES) and mod.training and mod.p > 0
            draws |= n.op == "call_function" and n.target in _RANDOM_FUNCTIONS
            draws |= n.op == "call_method" and n.target in ("bernoulli_", "uniform_", "normal_", "random_", "exponential_")
            first = n.args[0] if n.args else None
            if isinstance(first, fx.Node) and first not in members and _inplace(n, mod):
                return f"{n.name} changes a value from outside its branch in place"
        random_comps += draws
    if random_comps > 1:
        return "two branches draw random numbers (dropout), whose stream the order would change"
    return None


def _inplace(n: fx.Node, mod: nn.Module | None) -> bool:
    if mod is not None:
        return bool(getattr(mod, "inplace", False))
    if n.op == "call_method":
        return n.target.endswith("_") and not n.target.endswith("__")
    if n.op == "call_function":
        return n.target in _INPLACE_FUNCTIONS or bool(n.kwargs.get("inplace")) or \
            getattr(n.target, "__name__", "").endswith("_") and not getattr(n.target, "__name__", "").endswith("__")
    return False
