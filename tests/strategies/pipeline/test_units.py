"""Cut points of a model that is no nn.Sequential: its units in the order a forward runs them."""
import pytest
import torch
import torch.nn as nn

from caramel.errors import CaramelError
from caramel.profile.model_profile import ModelProfile, ModuleInfo
from caramel.strategies.pipeline.units import forward_units, traced_stages, unit_costs


class Net(nn.Module):
    """Defined in another order than it runs; a ModuleList run in a loop; a module never run."""

    def __init__(self, share: bool = False):
        super().__init__()
        self.head = nn.Linear(8, 3)
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
        self.stem = nn.Linear(4, 8)
        self.unused = nn.Linear(2, 2)
        self.share = share

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(b(x))
        if self.share:
            x = self.blocks[0](x)
        return self.head(x)


def test_units_follow_the_forward_and_expand_containers():
    units = forward_units(Net(), torch.randn(5, 4))
    assert [u.name for u in units] == ["stem", "blocks.0", "blocks.1", "blocks.2", "head"]
    assert [u.output_bytes for u in units] == [5 * 8 * 4] * 4 + [5 * 3 * 4]


def test_a_module_run_twice_is_no_cut_point():
    with pytest.raises(CaramelError, match="blocks.0 run"):
        forward_units(Net(share=True), torch.randn(5, 4))


def test_unit_costs_sum_the_profiled_modules_under_each_unit():
    net = Net()
    mods = [ModuleInfo(name=n, type="Linear", forward_start_s=0.0, forward_time_s=f, backward_time_s=2 * f)
            for n, f in [("stem", 1.0), ("blocks.0", 2.0), ("blocks.1", 3.0), ("blocks.2", 4.0), ("head", 5.0)]]
    prof = ModelProfile(model="net", batch_size=10, forward_time_s=15.0, backward_time_s=30.0, optimizer_time_s=0.0,
                        params=[], modules=mods)
    units = forward_units(net, torch.randn(5, 4))
    costs = unit_costs(prof, net, units, torch.randn(5, 4))  # half the profile's batch: half its times
    assert [c.forward_s for c in costs] == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert [c.backward_s for c in costs] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert costs[0].param_bytes == (4 * 8 + 8) * 4 and costs[-1].output_bytes == 5 * 3 * 4


def test_a_tied_weight_split_across_stages_is_the_models_parameter_on_both():
    from caramel.models.zoo import tiny_gpt

    mb = tiny_gpt(batch_size=4, seed=0)  # tok.weight is head.weight: first and last stage
    stages, tied = traced_stages(mb.model, ["blocks.1"], 2, mb.inputs[:2])
    own = {id(p) for p in mb.model.parameters()}
    assert all(id(p) in own for s in stages for p in s.parameters())
    assert [(set(w.names), w.stages) for w in tied] == [({"tok.weight", "head.weight"}, (0, 1))]


class TiedFront(nn.Module):
    """Two uses of one weight, both before the cut."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.b.weight = self.a.weight
        self.c = nn.Linear(6, 2)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def test_a_tied_weight_on_one_stage_keeps_the_models_parameter():
    net = TiedFront()
    stages, tied = traced_stages(net, ["c"], 2, torch.randn(3, 6))
    assert tied == []
    own = {id(p) for p in net.parameters()}
    assert all(id(p) in own for s in stages for p in s.parameters())
    x = torch.randn(3, 6)
    stages[1](stages[0](x)).sum().backward()
    assert net.a.weight.grad is not None and net.a.weight.grad.abs().sum() > 0


def test_a_tied_weight_of_two_sequential_children_is_found_on_both_stages():
    from caramel.strategies.pipeline.layout import split_sequential
    from caramel.strategies.pipeline.tied import share_tied

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6), nn.Linear(6, 6))
    net[3].weight = net[0].weight
    tied = share_tied(net, split_sequential(net, [2]))
    assert [(set(w.names), w.stages) for w in tied] == [({"0.weight", "3.weight"}, (0, 1))]
    assert share_tied(net, split_sequential(net, [3])) != []  # 0 and 3 still apart
    net[3].weight = nn.Parameter(net[0].weight.detach().clone())
    assert share_tied(net, split_sequential(net, [2])) == []


class OneNameTwoStages(nn.Module):
    """`a.weight` used again, under its one name, by a functional call after the cut."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)

    def forward(self, x):
        h = self.b(torch.relu(self.a(x)))
        return torch.nn.functional.linear(h, self.a.weight)


def test_a_weight_used_on_two_stages_under_one_name_is_tied():
    net = OneNameTwoStages()
    stages, tied = traced_stages(net, ["b"], 2, torch.randn(3, 6))
    assert [(w.names, w.stages) for w in tied] == [(("a.weight",), (0, 1))]
    assert all(net.a.weight is p for s in stages for n, p in s.named_parameters() if n == "a.weight")


def test_two_stages_of_one_rank_using_a_tied_weight_are_refused():
    from types import SimpleNamespace

    from caramel.strategies.pipeline.options import PipelineOptions
    from caramel.strategies.pipeline.runtime import Pipeline
    from caramel.strategies.pipeline.tied import TiedWeight, shared_positions

    tied = [TiedWeight(("0.weight", "2.weight"), (0, 2))]  # interleaved, 4 stages on 2 ranks: both on rank 0
    assert shared_positions(tied, 2) == tied
    assert shared_positions([TiedWeight(("0.weight", "4.weight"), (0, 3))], 2) == []
    pipe = Pipeline.__new__(Pipeline)
    pipe.options = PipelineOptions(stages=4, schedule="interleaved")
    pipe.layout = SimpleNamespace(positions=2, replicas=1, replica_group=None)
    with pytest.raises(CaramelError, match=r"one rank would hold two stages.*0.weight = 2.weight on stages \[0, 2\]"):
        pipe._tie(tied)


def test_tied_grads_leave_a_frozen_or_unused_weight_without_a_gradient(tmp_path):
    import torch.distributed as dist

    from caramel.strategies.pipeline.tied import TiedGrads

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        frozen, unused, used = (nn.Parameter(torch.ones(3)) for _ in range(3))
        frozen.requires_grad_(False)
        used.grad = torch.full((3,), 2.0)
        tg = TiedGrads.__new__(TiedGrads)  # one holder here: the sum over a one-rank group
        tg.params, tg.groups, tg.created = [frozen, unused, used], [(dist.group.WORLD, 0)] * 3, []
        tg.reduce()
        assert frozen.grad is None and unused.grad is None  # the optimizer then skips them
        assert torch.equal(used.grad, torch.full((3,), 2.0))
    finally:
        dist.destroy_process_group()


class ReusedAcrossTheCut(nn.Module):
    """Module `a` called before and after the cut at `b`."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)

    def forward(self, x):
        return self.a(torch.tanh(self.b(torch.tanh(self.a(x)))))


def test_a_module_called_on_both_sides_of_the_cut_is_named():
    with pytest.raises(CaramelError, match="module 'a' is called on both sides of the cut"):
        traced_stages(ReusedAcrossTheCut(), ["b"], 2, torch.randn(3, 6))
