"""Droppable unit groups of a model, and the narrow forward that drops some of them.

Structured dropout (`balance="dropout"`) removes whole units: a Linear's output features or a
Conv2d's output channels, together with the matching input columns of the one layer that
consumes them. That saves compute only if both layers run narrow kernels, and it changes no
tensor shape elsewhere only if nothing else reads those units. `find_groups` proves that from
the model's torch.fx graph: a group is a Linear or Conv2d (groups=1, zero padding) called once,
whose output reaches exactly one next Linear or Conv2d through a chain of single-use,
unit-wise steps (ReLU-like activations, pooling, dropout, BatchNorm, and `flatten(x, 1)` before
a Linear). A residual add, a concatenation, a second reader, a reshaping other than that
flatten: not a group. MLP hidden layers, plain CNNs and the first convolution of a residual
block qualify; channels on a residual path never do.

`Narrowing` swaps in forwards that compute on sliced parameters (`W[kept]` for the producer,
`W[:, kept]` for the consumer, BatchNorm's per-channel parameters and statistics sliced too),
with the consumer's input scaled by units / kept as inverted dropout does. Autograd scatters
the sliced parameters' gradients back into full-size tensors with zeros in dropped units, so
buckets keep their dense sizes. With nothing dropped the model's own forwards run, unchanged,
and so they do while evaluating (eval() or no_grad): validation scores the whole model.

A layer whose backward the engine splits (deferred or early weight gradients:
`caramel.profile.split_backward`) has one forward that decides both: the narrowing forward
sits on top of the split one and calls it whole, or calls the split's `narrow_forward` narrow.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from caramel.errors import CaramelError

SUPPORTED = ("balance='dropout' drops the output units of a Linear or Conv2d whose output reaches exactly one next "
             "Linear or Conv2d through ReLU-like activations, pooling, dropout, BatchNorm or flatten(x, 1) only "
             "(MLP hidden layers, plain CNNs such as the zoo's mlp and small_cnn, the digits workload, the first "
             "convolution of a residual block)")
_UNITWISE_MODULES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Dropout,
                     nn.Dropout2d, nn.MaxPool2d, nn.AvgPool2d, nn.Identity)
_UNITWISE_FUNCTIONS = {F.relu, torch.relu, F.relu6, F.leaky_relu, F.gelu, F.silu, torch.tanh, torch.sigmoid,
                       F.dropout, F.max_pool2d, F.avg_pool2d}
_UNITWISE_METHODS = {"relu", "tanh", "sigmoid"}


@dataclasses.dataclass
class Group:
    """One droppable set of units: `producer`'s outputs, read only by `consumer`."""

    name: str  # the producer's module name
    units: int
    producer: nn.Module
    consumer: nn.Module
    consumer_name: str
    norms: list[nn.Module]  # BatchNorms on the way (their per-channel parameters are the units')
    spatial: int  # consumer input columns per unit (a flatten before a Linear), else 1


def find_groups(model: nn.Module) -> list[Group]:
    """Every droppable group of `model`, in the graph's order; an error naming what is supported
    when the model cannot be traced or has none."""
    try:
        graph = fx.symbolic_trace(model).graph
    except Exception as e:  # noqa: BLE001 - any tracing failure means: not supported
        raise CaramelError(f"{SUPPORTED}; this model could not be traced with torch.fx ({type(e).__name__}: {e})") from e
    modules = dict(model.named_modules())
    calls: dict[str, int] = {}
    for n in graph.nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1
    groups = []
    for n in graph.nodes:
        if n.op == "call_module" and _layer(modules[n.target]) and calls[n.target] == 1:
            g = _follow(n, modules, calls)
            if g is not None:
                groups.append(g)
    if not groups:
        raise CaramelError(f"{SUPPORTED}; {type(model).__name__} has no such layer")
    return groups


def _layer(m: nn.Module) -> bool:
    if isinstance(m, nn.Linear):
        return True
    return (isinstance(m, nn.Conv2d) and m.groups == 1 and m.padding_mode == "zeros"
            and not isinstance(m.padding, str))


def _follow(node: fx.Node, modules: dict[str, nn.Module], calls: dict[str, int]) -> Group | None:
    producer = modules[node.target]
    units = producer.out_features if isinstance(producer, nn.Linear) else producer.out_channels
    cur, norms, flattened = node, [], False
    while True:
        if len(cur.users) != 1:
            return None
        user = next(iter(cur.users))
        if not user.args or user.args[0] is not cur or any(_reads(a, cur) for a in list(user.args[1:]) + list(user.kwargs.values())):
            return None
        if user.op == "call_module":
            m = modules[user.target]
            if _layer(m):
                if calls[user.target] != 1:
                    return None
                if isinstance(m, nn.Conv2d):
                    ok = isinstance(producer, nn.Conv2d) and not flattened and m.in_channels == units
                    spatial = 1
                elif flattened:
                    ok = isinstance(producer, nn.Conv2d) and m.in_features % units == 0
                    spatial = m.in_features // units
                else:
                    ok = isinstance(producer, nn.Linear) and m.in_features == units
                    spatial = 1
                if not ok:
                    return None
                return Group(node.target, units, producer, m, user.target, norms, spatial)
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)) and not flattened and m.num_features == units \
                    and calls[user.target] == 1:
                norms.append(m)
            elif not isinstance(m, _UNITWISE_MODULES) or (flattened and isinstance(m, (nn.MaxPool2d, nn.AvgPool2d))):
                return None
        elif user.op == "call_function" and user.target is torch.flatten:
            if flattened or isinstance(producer, nn.Linear) or _start_dim(user) != 1 or len(user.args) > 2:
                return None
            flattened = True
        elif user.op == "call_function" and user.target in _UNITWISE_FUNCTIONS:
            if flattened and user.target in (F.max_pool2d, F.avg_pool2d):
                return None
        elif user.op == "call_method" and user.target in _UNITWISE_METHODS:
            pass
        else:
            return None
        cur = user


def _start_dim(node: fx.Node) -> Any:
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)


def _reads(arg: Any, node: fx.Node) -> bool:
    """`arg` (an argument other than the first) holds `node`."""
    found = []
    fx.node.map_arg(arg, lambda a: found.append(a is node))
    return any(found)


class Narrowing:
    """Forwards of the groups' layers that compute only the kept units (module docstring).

    `set_kept({group name: sorted index tensor or None})` takes effect at the next forward;
    None (or every unit) keeps the layer's own forward for that group. A group narrows only
    while its producer is in train() mode and autograd is on: evaluation (eval() or no_grad)
    computes the whole model. Each patched layer holds a `_NarrowForward` that names its module,
    so a deepcopy (or pickle) of the model narrows its own layers with its own copy of the kept
    units, never the original's.

    `install=False` leaves the layers' own forwards in place until `install()`; `remove()` puts
    them back. A rank that drops nothing runs without the patched forwards at all
    (`DropoutBalancer` installs them only while it drops)."""

    def __init__(self, groups: list[Group], install: bool = True):
        self.groups = groups
        self.kept: dict[str, torch.Tensor | None] = {g.name: None for g in groups}
        roles: dict[int, list] = {}
        for g in groups:
            roles.setdefault(id(g.producer), [g.producer, None, None, None])[1] = g
            roles.setdefault(id(g.consumer), [g.consumer, None, None, None])[2] = g
            for n in g.norms:
                roles.setdefault(id(n), [n, None, None, None])[3] = g
        self._roles = list(roles.values())
        self.installed = False
        if install:
            self.install()

    def install(self) -> None:
        """Patch the groups' layers (an instance attribute `forward`: `__call__` runs it, and the
        module's hooks still run around it)."""
        if not self.installed:
            for m, out_g, in_g, norm_g in self._roles:
                below = m.__dict__.get("forward")
                # a split forward already there (a deferred weight gradient) goes below this one;
                # anything else (another narrowing's, the user's) would be run with stale drops or lost
                if below is not None and getattr(below, "split", None) is None:
                    g = out_g or in_g or norm_g
                    raise CaramelError(f"balance='dropout' cannot narrow {type(m).__name__} of group '{g.name}': it "
                                       f"already has an instance forward ({type(below).__name__}; another "
                                       "narrowing's or the model's own); only a split weight-gradient forward "
                                       "may sit below a narrow one")
            for m, out_g, in_g, norm_g in self._roles:
                m.forward = _NarrowForward(m, self, out_g, in_g, norm_g, below=m.__dict__.get("forward"))
            self.installed = True

    def remove(self) -> None:
        """Give the layers their own forwards back (the kept units stay recorded)."""
        if self.installed:
            for m, *_ in self._roles:
                top = m.__dict__.get("forward")
                if isinstance(top, _NarrowForward):
                    if top.below is not None:
                        m.forward = top.below  # the split forward it wrapped
                    else:
                        del m.forward
            self.installed = False

    def set_kept(self, kept: dict[str, torch.Tensor | None]) -> None:
        for g in self.groups:
            k = kept.get(g.name)
            self.kept[g.name] = None if k is None or len(k) == g.units else k

    def active(self, g: Group | None) -> torch.Tensor | None:
        """The kept units of `g` now, or None where it computes whole (nothing dropped, or evaluating)."""
        if g is None or not (g.producer.training and torch.is_grad_enabled()):
            return None
        return self.kept[g.name]


class _NarrowForward:
    """A patched layer's forward: narrow where its groups drop units, else the class's own, or
    the split forward `below` it (a deferred or early weight gradient), which it also calls narrow.
    A plain object of this module (not a closure), so copies and pickles rebind to their module;
    a copy leaves the split behind (it belongs to the engine of the original)."""

    wraps_forward = True  # tells `SplitBackward.install` to go below this forward, not replace it

    def __init__(self, module: nn.Module, narrowing: Narrowing, out_g: Group | None, in_g: Group | None,
                 norm_g: Group | None, below: Any = None):
        self.module, self.narrowing, self.out_g, self.in_g, self.norm_g = module, narrowing, out_g, in_g, norm_g
        self.below = below

    def __getstate__(self) -> dict:
        return dict(self.__dict__, below=None)

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        m, n = self.module, self.narrowing
        out_k, in_k, norm_k = n.active(self.out_g), n.active(self.in_g), n.active(self.norm_g)
        if out_k is None and in_k is None and norm_k is None:
            if self.below is not None:
                return self.below(x, *args, **kwargs)
            return type(m).forward(m, x, *args, **kwargs)
        if self.norm_g is not None:
            return _narrow_norm(m, x, norm_k)
        return _narrow_layer(m, x, out_k, in_k, self.in_g, getattr(self.below, "split", None))


def _narrow_layer(m: nn.Module, x: torch.Tensor, out_k: torch.Tensor | None, in_k: torch.Tensor | None,
                  in_g: Group | None, split: Any = None) -> torch.Tensor:
    cols = None
    if in_k is not None:
        cols = in_k
        if in_g.spatial > 1:  # flatten(x, 1) laid each channel's spatial positions side by side
            cols = (in_k[:, None] * in_g.spatial + torch.arange(in_g.spatial, device=in_k.device)).reshape(-1)
        x = x * (in_g.units / len(in_k))  # inverted dropout: the kept units stand in for all
    if split is not None and split.splits_now():
        return split.narrow_forward(m, x, out_k, cols)  # the same slices, its weight gradient split
    w, b = m.weight, m.bias
    if out_k is not None:
        w = w.index_select(0, out_k)
        b = b.index_select(0, out_k) if b is not None else None
    if cols is not None:
        w = w.index_select(1, cols)
    if isinstance(m, nn.Linear):
        return F.linear(x, w, b)
    return F.conv2d(x, w, b, m.stride, m.padding, m.dilation, m.groups)


def _narrow_norm(m: nn.Module, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    training = m.training or m.running_mean is None
    rm = m.running_mean.index_select(0, k) if m.running_mean is not None else None
    rv = m.running_var.index_select(0, k) if m.running_var is not None else None
    momentum = m.momentum
    if m.training and m.track_running_stats and m.num_batches_tracked is not None:
        m.num_batches_tracked.add_(1)
        if momentum is None:
            momentum = 1.0 / float(m.num_batches_tracked)
    w = m.weight.index_select(0, k) if m.weight is not None else None
    b = m.bias.index_select(0, k) if m.bias is not None else None
    out = F.batch_norm(x, rm, rv, w, b, training, momentum or 0.0, m.eps)
    if m.training and rm is not None:  # the sliced statistics were updated in place: write them back
        with torch.no_grad():
            m.running_mean.index_copy_(0, k, rm)
            m.running_var.index_copy_(0, k, rv)
    return out

