"""Split backward: deferred weight gradients equal autograd's bit for bit, arrive in the chosen order, and
the input gradients flow on unchanged."""
import copy

import pytest
import torch
import torch.nn as nn

from caramel.profile.split_backward import SplitBackward, splittable


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8, padding_idx=0)
        self.conv1 = nn.Conv1d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(1, 4, 3, stride=2, padding=1, bias=False)
        self.fc1 = nn.Linear(4 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, ids):
        h = self.emb(ids).transpose(1, 2)            # (B, 8, 8)
        h = torch.relu(self.conv1(h)).unsqueeze(1)    # (B, 1, 8, 8)
        h = torch.relu(self.conv2(h)).flatten(1)      # (B, 64)
        h = torch.relu(self.fc1(h))
        return self.fc2(self.fc1.weight.new_ones(1) * h[:, :16]) + self.fc2(h)  # fc2 used twice


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 20, (6, 8), generator=g), torch.randn(6, 5, generator=g)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("names", [["emb"], ["emb", "conv1"], ["emb", "conv1", "conv2", "fc1", "fc2"], ["fc2"]])
def test_deferred_gradients_equal_autograds(names):
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    ids, y = _data()
    nn.functional.mse_loss(ref(ids), y).backward()
    order = []
    split = SplitBackward([getattr(model, n) for n in names], on_ready=lambda p: order.append(p))
    split.install()
    with split.recording():
        loss = nn.functional.mse_loss(model(ids), y)
    loss.backward()
    for n in names:  # nothing accumulated yet for the deferred weights
        assert getattr(model, n).weight.grad is None
    assert split.pending() and split.deferred_bytes() > 0
    split.run()
    assert not split.pending()
    want, got = _grads(ref), _grads(model)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), (k, (got[k] - want[k]).abs().max().item())  # bit for bit
    weights = [getattr(model, n).weight for n in names]
    assert [p for p in order if any(p is w for w in weights)] == weights  # first layer first


def test_accumulates_across_backwards_and_leaves_plain_forwards_alone():
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    split = SplitBackward([model.fc1, model.emb])
    split.install()
    for seed in (1, 2):
        ids, y = _data(seed)
        nn.functional.mse_loss(ref(ids), y).backward()
        with split.recording():
            nn.functional.mse_loss(model(ids), y).backward()
        split.run()
    ids, y = _data(3)
    nn.functional.mse_loss(ref(ids), y).backward()
    nn.functional.mse_loss(model(ids), y).backward()  # not recording: autograd's own order
    assert not split.pending()
    for k, v in _grads(ref).items():
        assert torch.allclose(_grads(model)[k], v, atol=1e-6), k
    split.remove()
    assert "forward" not in model.fc1.__dict__


def test_what_cannot_be_split_is_named():
    assert not splittable(nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"))
    assert not splittable(nn.Embedding(4, 2, max_norm=1.0))
    assert not splittable(nn.LayerNorm(4))
    frozen = nn.Linear(2, 2)
    frozen.weight.requires_grad_(False)
    assert not splittable(frozen)
    with pytest.raises(ValueError, match="LayerNorm"):
        SplitBackward([nn.LayerNorm(4)])


def test_no_gradient_hook_fires_for_a_deferred_weight():
    """Autograd sees no edge to a deferred weight: its post-accumulate hooks stay quiet (they
    would fire even for a None gradient), so only `on_ready` reports it."""
    torch.manual_seed(0)
    model = Net()
    fired = []
    for n in ("emb", "conv1", "fc1"):
        getattr(model, n).weight.register_post_accumulate_grad_hook(lambda p, n=n: fired.append(n))
    split = SplitBackward([model.emb, model.conv1])
    split.install()
    ids, y = _data()
    with split.recording():
        nn.functional.mse_loss(model(ids), y).backward()
    assert fired == ["fc1"]
    split.run()
    assert fired == ["fc1"] and model.emb.weight.grad is not None


def test_an_early_weight_gradient_is_handed_over_before_its_input_gradient_is_computed():
    """fc1 goes early: its weight gradient (bit for bit autograd's) is delivered inside backward,
    before conv2's gradient, which needs fc1's input gradient, exists; nothing is kept."""
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    ids, y = _data()
    nn.functional.mse_loss(ref(ids), y).backward()
    events = []
    model.conv2.weight.register_post_accumulate_grad_hook(lambda p: events.append("conv2"))
    split = SplitBackward([], on_ready=lambda p: events.append("fc1.weight" if p is model.fc1.weight else "fc1.bias"),
                          early=[model.fc1])
    split.install()
    with split.recording():
        loss = nn.functional.mse_loss(model(ids), y)
    loss.backward()
    assert events == ["fc1.weight", "fc1.bias", "conv2"]
    assert not split.pending()
    want, got = _grads(ref), _grads(model)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), (k, (got[k] - want[k]).abs().max().item())


def test_an_early_layer_called_twice_is_kept_and_delivered_once_as_the_sum():
    """fc2 runs twice in the forward: an early hand-over of the first backward call would deliver
    half a gradient, so both calls are kept and `run()` delivers the sum once."""
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    ids, y = _data()
    nn.functional.mse_loss(ref(ids), y).backward()
    ready = []
    split = SplitBackward([], on_ready=ready.append, early=[model.fc2])
    split.install()
    for _ in range(2):  # a second step: the call count starts afresh after run()
        model.zero_grad(set_to_none=True)
        ready.clear()
        with split.recording():
            loss = nn.functional.mse_loss(model(ids), y)
        loss.backward()
        assert ready == [] and split.pending()
        split.run()
        assert ready == [model.fc2.weight, model.fc2.bias]
        for k, v in _grads(ref).items():
            assert torch.allclose(_grads(model)[k], v, atol=1e-6), k


def test_an_early_layer_must_be_dense_and_not_deferred():
    model = Net()
    with pytest.raises(ValueError, match="dense layer"):
        SplitBackward([model.fc1], early=[model.fc1])
    with pytest.raises(ValueError, match="dense layer"):
        SplitBackward([], early=[model.emb])


@pytest.mark.parametrize("deferred", [False, True])
def test_autograd_grad_through_a_split_layer_touches_no_grad(deferred):
    """`torch.autograd.grad` (an input's gradient, as adversarial training takes) accumulates into
    no `.grad`: a split layer then neither accumulates, nor hands over, nor keeps its weight
    gradient; the input gradient is autograd's; a `.backward()` after it still delivers."""
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    x = torch.randn(6, 64, requires_grad=True)
    want = torch.autograd.grad(ref.fc2(torch.relu(ref.fc1(x))).sum(), x)[0]
    ready = []
    split = SplitBackward([model.fc1] if deferred else [], on_ready=ready.append,
                          early=[] if deferred else [model.fc1])
    split.install()
    with split.recording():
        out = model.fc2(torch.relu(model.fc1(x))).sum()
    got = torch.autograd.grad(out, x, retain_graph=True)[0]
    assert torch.equal(got, want)
    assert model.fc1.weight.grad is None and ready == [] and not split.pending()
    out.backward()
    split.run()
    assert model.fc1.weight in ready and model.fc1.weight.grad is not None


def test_a_double_backward_through_a_split_layer_is_an_error():
    """A gradient penalty's `create_graph=True` would drop the second-order terms through the
    weight the split layer detaches: refused with the option that avoids it named."""
    from caramel.errors import CaramelError
    model = Net()
    split = SplitBackward([], early=[model.fc1])
    split.install()
    x = torch.randn(6, 64, requires_grad=True)
    with split.recording():
        out = model.fc2(torch.relu(model.fc1(x))).sum()
    with pytest.raises(CaramelError, match="early_weight_grad=False"):
        torch.autograd.grad(out, x, create_graph=True)
