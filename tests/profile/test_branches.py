"""Independent branches found by FX tracing, and forwards that run them in another order (`caramel.profile.branches`)."""
import copy
import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from caramel.models.zoo import two_tower
from caramel.profile.branches import find_branches
from caramel.runtime.branch_forward import BranchForward

torch.set_num_threads(1)


def conv_bn(cin, cout, k):
    return [nn.Conv2d(cin, cout, k, padding=k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class Inception(nn.Module):
    """A small Inception block (four branches, concatenated) between a stem and a head."""

    def __init__(self, c=4):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.b1 = nn.Sequential(*conv_bn(c, c, 1))
        self.b2 = nn.Sequential(*conv_bn(c, c, 1), *conv_bn(c, c, 3))
        self.b3 = nn.Sequential(*conv_bn(c, c, 1), *conv_bn(c, c, 3), *conv_bn(c, c, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), *conv_bn(c, c, 1))
        self.head = nn.Linear(4 * c, 10)

    def forward(self, x):
        x = F.relu(self.stem(x))
        y = torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)
        return self.head(y.mean((2, 3)))


def _inception():
    torch.manual_seed(0)
    return Inception(), torch.randn(2, 3, 8, 8)


def test_inception_block_has_four_branches():
    model, _ = _inception()
    g = find_branches(model)
    assert g.reason is None
    assert len(g.blocks) == 1
    b = g.blocks[0]
    assert b.fixed is None
    assert b.branches == (("b1.0", "b1.1", "b1.2"), ("b2.0", "b2.1", "b2.2", "b2.3", "b2.4", "b2.5"),
                          ("b3.0", "b3.1", "b3.2", "b3.3", "b3.4", "b3.5", "b3.6", "b3.7", "b3.8"),
                          ("b4.0", "b4.1", "b4.2", "b4.3"))


@pytest.mark.parametrize("perm", [(3, 2, 1, 0), (2, 0, 3, 1)])
def test_reordered_inception_is_bitwise_equal_and_runs_in_the_new_order(perm):
    model, x = _inception()
    g = find_branches(model)
    gm = g.reordered({0: perm})
    firsts = [n.target for n in gm.graph.nodes if n.op == "call_module" and n.target.endswith(".0")]
    assert firsts == [f"b{j + 1}.0" for j in perm]
    twin = copy.deepcopy(model)
    ref = twin(x)  # training mode: BatchNorm uses batch statistics and updates its running ones
    out = gm(x)
    assert torch.equal(out, ref)
    # the model's own modules ran (not copies): its BatchNorms' running statistics moved, as the twin's did
    assert model.b1[1].num_batches_tracked.item() == 1
    for (k, v), (k2, v2) in zip(model.state_dict().items(), twin.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_two_tower_has_two_towers_and_reorders_exactly_with_gradients():
    mb = two_tower(batch_size=4, vocab=500, seq=8, channels=8)
    g = find_branches(mb.model)
    assert [b.branches for b in g.blocks] == [(("wide_emb", "wide_proj"),
                                               ("deep_emb", "deep.0", "deep.1", "deep.2", "deep.3", "deep.4", "deep.5"))]
    keys = list(mb.model.state_dict())
    ref = mb.model(mb.inputs)
    mb.loss_fn(ref, mb.targets).backward()
    grads = [p.grad.clone() for p in mb.model.parameters()]
    mb.model.zero_grad()
    bf = BranchForward(mb.model)
    bf.apply(["deep_emb", "deep.0", "deep.2", "deep.4", "wide_emb", "wide_proj", "head"])
    assert bf.order == {0: (1, 0)}
    seen = []
    handles = [m.register_forward_pre_hook(lambda m, a, n=n: seen.append(n))
               for n, m in mb.model.named_modules() if n in ("wide_emb", "deep_emb", "head")]
    out = mb.model(mb.inputs)
    assert seen == ["deep_emb", "wide_emb", "head"]  # the model's own modules, its hooks fire, in the new order
    assert torch.equal(out, ref)
    mb.loss_fn(out, mb.targets).backward()
    assert all(torch.equal(p.grad, g0) for p, g0 in zip(mb.model.parameters(), grads))  # two branches: one sum, either order
    assert list(mb.model.state_dict()) == keys
    bf.restore()
    for h in handles:
        h.remove()
    assert "forward" not in mb.model.__dict__
    assert torch.equal(mb.model(mb.inputs), ref)


class _Twin(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        if self.kind == "dropout":
            return torch.cat([F.dropout(self.a(x), 0.5), self.drop(self.b(x))], 1)
        if self.kind == "shared":
            return torch.cat([self.a(x), self.a(self.b(x))], 1)
        if self.kind == "inplace":
            return torch.cat([self.a(x), self.b(x.relu_())], 1)
        if self.kind == "one_dropout":
            return torch.cat([self.a(x), self.drop(self.b(x))], 1)
        return self.a(x) + self.b(x)


@pytest.mark.parametrize("kind,fixed", [("dropout", "random"), ("shared", "two branches"), ("inplace", "in place"),
                                        ("one_dropout", None), ("plain", None)])
def test_blocks_whose_order_could_change_a_result_stay_fixed(kind, fixed):
    g = find_branches(_Twin(kind))
    assert len(g.blocks) == 1
    if fixed is None:
        assert g.blocks[0].fixed is None and g.reorderable() == [0]
    else:
        assert fixed in g.blocks[0].fixed and g.reorderable() == []
        with pytest.raises(ValueError, match="keeps its order"):
            g.reordered({0: (1, 0)})


def test_a_residual_chain_has_no_blocks():
    class Res(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return x + self.b(F.relu(self.a(x)))

    assert find_branches(Res()).blocks == []


def test_untraceable_forwards_are_skipped_with_a_reason():
    class Dynamic(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) if x.sum() > 0 else x

    class ReadsWeight(nn.Module):  # F.linear on a child's weight: its pre-hook would not run first
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return F.linear(x, self.fc.weight)

    g = find_branches(Dynamic())
    assert g.gm is None and "not FX-traceable" in g.reason
    g = find_branches(ReadsWeight())
    assert g.gm is None and "fc.weight" in g.reason
    bf = BranchForward(ReadsWeight())
    bf.apply(["fc"])  # nothing to reorder: the model's own forward stays
    assert bf.order == {} and "forward" not in bf.model.__dict__


def test_every_permutation_of_a_three_branch_block_is_exact():
    class Three(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            return torch.cat([self.a(x), torch.tanh(self.b(x)), self.c(x) * 2], 1)

    torch.manual_seed(0)
    model, x = Three(), torch.randn(5, 4)
    g = find_branches(model)
    ref = model(x)
    for perm in itertools.permutations(range(3)):
        assert torch.equal(g.reordered({0: perm})(x), ref)


def test_another_training_mode_runs_the_models_own_forward():
    class Drop(nn.Module):  # FX bakes training=True in when traced in training mode
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return torch.cat([self.a(x), F.dropout(self.b(x), 0.5, training=self.training)], 1)

    torch.manual_seed(0)
    model, x = Drop(), torch.randn(3, 4)
    bf = BranchForward(model)
    bf.apply(["b", "a"])
    assert bf.order == {0: (1, 0)}
    model.eval()
    assert torch.equal(model(x), torch.cat([model.a(x), model.b(x)], 1))  # no dropout in eval
    model.train()
    torch.manual_seed(1)
    out = model(x)
    torch.manual_seed(1)
    bf.restore()
    assert torch.equal(out, model(x))  # one random branch: the same stream in either order


def test_a_branch_reading_a_later_value_from_outside_stays_valid():
    class Late(nn.Module):  # branch b reads y, computed between the branches from a value before the fork
        def __init__(self):
            super().__init__()
            self.pre, self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.pre(x)
            ha = self.a(h)
            y = self.c(x)
            hb = self.b(h) + y
            return torch.cat([ha, hb], 1)

    torch.manual_seed(0)
    model, x = Late(), torch.randn(2, 4)
    g = find_branches(model)
    assert [b.branches for b in g.blocks] == [(("a",), ("b",))]
    assert torch.equal(g.reordered({0: (1, 0)})(x), model(x))
