"""balance="dropout" with split backward: a narrowed layer whose weight gradient is deferred or
early (`caramel.profile.split_backward`) gives the same gradients, bit for bit, as autograd's
narrow path; installing and removing them in either order leaves the other's forward in place.
On 2 gloo ranks, training with drops gives the same parameters deferred, early or neither, and
nothing dropped with deferral is balance='off' with deferral."""

import pytest
import torch
import torch.nn.functional as F

from caramel.models.zoo import SmallCNN
from caramel.profile.dropout_groups import Narrowing, find_groups
from caramel.profile.split_backward import SplitBackward

torch.set_num_threads(1)


def _mlp() -> torch.nn.Module:
    # its middle layer is in two groups: sliced on both sides
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 5))


CASES = {
    "small_cnn": (SmallCNN, lambda g: (torch.randn(6, 3, 16, 16, generator=g), torch.randint(0, 10, (6,), generator=g)),
                  {"conv1": [0, 2, 3, 5, 7], "conv2": [1, 2, 4, 8, 9, 10, 15]}, ("conv1", "conv2", "fc")),
    "mlp": (_mlp, lambda g: (torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)),
            {"0": [1, 3, 4, 9, 11, 14], "2": [0, 5, 6, 7, 12]}, ("0", "2", "4")),
}


def _grads(case: str, split_mode: str | None, narrow_first: bool, kept_now: bool = True) -> tuple[dict, int, tuple]:
    """(gradients, early hand-overs, (bytes kept for deferred weight gradients, the same scaled to
    the whole layers)) of one step."""
    make, data, kept, layers = CASES[case]
    torch.manual_seed(0)
    m = make()
    x, y = data(torch.Generator().manual_seed(1))
    named = dict(m.named_modules())
    narrowing = Narrowing(find_groups(m), install=False)
    narrowing.set_kept({k: torch.tensor(v) for k, v in kept.items()} if kept_now else {})
    split = None
    if narrow_first:
        narrowing.install()
    if split_mode is not None:
        mods = [named[n] for n in layers]
        split = SplitBackward(mods if split_mode == "defer" else [], early=mods if split_mode == "early" else [])
        split.install()
    narrowing.install()
    kept_bytes = (0, 0)
    for _ in range(2):  # twice: the second backward accumulates into .grad
        if split is not None:
            with split.recording():
                loss = F.cross_entropy(m(x), y)
        else:
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        if split is not None:
            kept_bytes = (split.deferred_bytes(), split.deferred_bytes(whole=True))
            split.run()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    if split is not None and narrow_first:
        split.remove()
        # the narrowing forward stays, with nothing below it
        assert all(named[n].__dict__["forward"].below is None for n in layers)
    narrowing.remove()
    if split is not None and not narrow_first:
        assert all(named[n].__dict__["forward"].split is split for n in layers)  # the split forward is back
        split.remove()
    assert not any("forward" in mod.__dict__ for mod in m.modules())  # both gone: the classes' forwards
    return grads, split.handovers if split is not None else 0, kept_bytes


@pytest.mark.parametrize("case", sorted(CASES))
def test_narrow_layers_with_split_backward_give_autograds_gradients(case):
    ref, _, _ = _grads(case, None, True)
    assert ref["2.weight" if case == "mlp" else "conv2.weight"].eq(0).any()  # a real drop
    whole, _, whole_bytes = _grads(case, "defer", True, kept_now=False)
    for mode in ("defer", "early"):
        for narrow_first in (True, False):
            got, handed, kept_bytes = _grads(case, mode, narrow_first)
            assert all(torch.equal(ref[n], got[n]) for n in ref), (mode, narrow_first)
            if mode == "early":
                assert handed == 2 * len(CASES[case][3])  # every layer went early, in both backwards
            else:
                # the narrow input and gradient were kept, not whole ones; scaled, the whole ones'
                # bytes (what a plan made from a profile taken while dropping must cap)
                assert 0 < kept_bytes[0] < whole_bytes[0] and kept_bytes[1] == whole_bytes[0] == whole_bytes[1]


@pytest.mark.timeout(150)
def test_deferred_and_early_weight_gradients_with_drops_match_autograds(tmp_path):
    import json

    from caramel.testing import run_workers
    from tests.strategies.adapt.dropout_workers import split_worker
    from tests.strategies.adapt.test_dropout import ENTRIES
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"format": "caramel.dropout-table/1", "model": "small_cnn",
                                 "groups": ["conv1", "conv2"], "entries": ENTRIES}))
    for res in run_workers(split_worker, 2, args=(str(table), 5), timeout_s=130):
        assert all(res["same"].values()), res
        # caramel.shutdown() leaves the module as it was; parallelized again, it trains as a fresh copy
        assert all(v == [] for v in res["left"].values()), res["left"]
        assert res["again_same"]
        assert res["dropped"]  # the drops changed the training: a real comparison
        assert res["deferred"]["drop/defer"] == ["conv1", "conv2", "fc"] == res["deferred"]["zero/defer"]
        # profiled while dropping, the deferred bytes are the whole layers' (the memory cap's terms)
        assert res["kept_bytes"]["drop/defer"] == res["kept_bytes"]["zero/defer"] != {}, res["kept_bytes"]
        assert res["split_steps"]["drop/defer"] >= 2, res  # steps that ran narrow and deferred at once
        # which layers go early follows the profiled timings (the first bucket's); any of them is narrowed
        assert res["early"]["drop/early"] > 0 and res["split_steps"]["drop/early"] >= 1, res


def test_a_copy_leaves_the_split_behind_and_computes_with_its_own_weights():
    import copy
    m = SmallCNN()
    x = torch.randn(3, 3, 16, 16)
    split = SplitBackward([m.conv1, m.conv2, m.fc])
    split.install()
    narrowing = Narrowing(find_groups(m), install=False)
    narrowing.set_kept({"conv1": torch.tensor([0, 2, 5]), "conv2": torch.arange(8)})
    narrowing.install()  # over the split forwards
    c = copy.deepcopy(m)
    assert c.conv1.forward.below is None and m.conv1.forward.below is not None
    with torch.no_grad():
        for p in c.parameters():
            p.zero_()
    copied = c.conv1.forward.narrowing  # the copy's own narrowing
    assert copied is not narrowing
    for kept in ({"conv1": torch.tensor([0, 2, 5]), "conv2": torch.arange(8)}, {}):  # narrow, then whole
        copied.set_kept(kept)
        with split.recording():
            out = c(x)
        assert torch.equal(out, torch.zeros(3, 10)), kept  # the copy's own (zero) weights
        out.sum().backward()
        assert not split.pending() and split.deferred_bytes() == 0  # nothing recorded into the original's split
    split.remove()
    narrowing.remove()


def test_narrowing_goes_only_over_a_split_forward():
    from caramel.errors import CaramelError
    m = SmallCNN()
    first = Narrowing(find_groups(m))
    with pytest.raises(CaramelError, match="cannot narrow Conv2d of group 'conv1': it already has an instance forward"):
        Narrowing(find_groups(m))  # over another narrowing's forwards
    assert all(mod.__dict__["forward"].below is None for mod in (m.conv1, m.conv2, m.fc))  # nothing half-installed
    first.remove()
    m.fc.forward = lambda x: x  # the model's own instance forward
    with pytest.raises(CaramelError, match="cannot narrow Linear of group 'conv2'"):
        Narrowing(find_groups(m))
    assert "forward" not in m.conv1.__dict__
