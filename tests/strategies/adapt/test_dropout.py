"""balance="dropout": droppable groups, the table (its checks and its lookup), and 2-rank gloo
runs: nothing dropped is bit-identical to balance='off'; fixed masks give each entry the mean
over the ranks that computed it; a slowed rank is given a drop."""
import json

import pytest
import torch

from caramel.errors import CaramelError
from caramel.models.zoo import SmallCNN, get_model
from caramel.profile.dropout_groups import Narrowing, find_groups
from caramel.profile.dropout_table import DropoutTable, check_fractions
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.options import build_options
from caramel.testing import run_workers

torch.set_num_threads(1)

ENTRIES = [{"fraction": 0.0, "time_ratio": 1.0, "val_loss": 2.0, "loss_increase": 0.0},
           {"fraction": 0.125, "time_ratio": 0.9, "val_loss": 2.002, "loss_increase": 0.002},
           {"fraction": 0.25, "time_ratio": 0.75, "val_loss": 2.01, "loss_increase": 0.01},
           {"fraction": 0.5, "time_ratio": 0.4, "val_loss": 2.2, "loss_increase": 0.2}]


def _table(path, groups=("conv1", "conv2"), entries=ENTRIES):
    path.write_text(json.dumps({"format": "caramel.dropout-table/1", "model": "small_cnn", "groups": list(groups),
                                "entries": entries}))
    return str(path)


def test_groups_are_the_units_read_by_one_next_layer_only():
    assert [(g.name, g.consumer_name, g.spatial, len(g.norms)) for g in find_groups(SmallCNN())] == \
        [("conv1", "conv2", 1, 1), ("conv2", "fc", 16, 1)]
    # a residual block: only its first convolution; the residual path's channels never
    names = [g.name for g in find_groups(get_model("resnet18")(batch_size=2).model)]
    assert names and all(n.endswith(".conv1") and n.startswith("layer") for n in names)
    with pytest.raises(CaramelError, match="Linear or Conv2d whose output reaches exactly one"):
        find_groups(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_narrowing_computes_only_kept_units_and_nothing_dropped_is_the_model():
    m = SmallCNN()
    x = torch.randn(3, 3, 16, 16)
    y0 = m(x)
    narrow = Narrowing(find_groups(m))
    assert torch.equal(m(x), y0)
    narrow.set_kept({"conv1": torch.tensor([0, 2, 5]), "conv2": torch.arange(8)})
    m(x).sum().backward()
    assert m.conv1.weight.grad[[1, 3, 4, 6, 7]].abs().sum() == 0 and m.conv1.weight.grad[[0, 2, 5]].abs().sum() > 0
    assert m.fc.weight.grad[:, 128:].abs().sum() == 0 and m.fc.weight.grad[:, :128].abs().sum() > 0


def test_evaluation_computes_the_whole_model_even_with_units_dropped():
    import copy
    m = SmallCNN()
    ref = copy.deepcopy(m)  # never narrowed
    x = torch.randn(3, 3, 16, 16)
    narrow = Narrowing(find_groups(m))
    narrow.set_kept({"conv1": torch.tensor([0, 2, 5]), "conv2": torch.arange(8)})
    assert not torch.allclose(m(x), ref(x))  # training: narrowed
    ref.load_state_dict(m.state_dict())  # the same BatchNorm statistics from here on
    with torch.no_grad():  # no_grad alone computes whole
        assert torch.equal(m(x), ref(x))
    m.eval()
    ref.eval()
    with torch.no_grad():  # what caramel train's validation runs
        assert torch.equal(m(x), ref(x))
    assert torch.equal(m(x), ref(x))  # eval() with autograd on: whole too
    m.train()
    assert not torch.allclose(m(x), ref.train()(x))  # back to training: narrowed again


def test_a_copy_of_a_narrowed_model_computes_with_its_own_weights():
    import copy
    import io
    m = SmallCNN()
    x = torch.randn(3, 3, 16, 16)
    narrow = Narrowing(find_groups(m))
    narrow.set_kept({"conv1": torch.tensor([0, 2, 5]), "conv2": torch.arange(8)})
    c = copy.deepcopy(m)
    with torch.no_grad():
        for p in c.parameters():
            p.zero_()
    assert torch.equal(c(x), torch.zeros(3, 10)) and m(x).abs().sum() > 0  # narrowed and whole alike: zero
    with torch.no_grad():
        for p in c.parameters():
            p.normal_()
    c(x).sum().backward()  # the copy's own drops, its own gradients; none reach the original
    assert c.conv1.weight.grad[[1, 3, 4, 6, 7]].abs().sum() == 0 and c.conv1.weight.grad[[0, 2, 5]].abs().sum() > 0
    assert m.conv1.weight.grad is None
    narrow.set_kept({})  # the original's narrowing no longer steers the copy
    assert c.conv1.forward.narrowing is not narrow and c.conv1.forward.module is c.conv1
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    torch.save(m, buf)  # the whole module pickles too (no closure, no balancer on it)
    assert set(m.state_dict()) == set(SmallCNN().state_dict())


def test_dropout_table_flags_without_the_table_are_errors(capsys):
    from caramel.cli import main
    for flag, value in (("--dropout-fractions", "0,0.5"), ("--dropout-train-steps", "5")):
        assert main(["profile", "--model", "mlp", "--steps", "1", flag, value]) != 0
        assert f"{flag} is only for measuring a dropout table: add --dropout-table OUT" in capsys.readouterr().err


def test_the_lookup_picks_the_least_costly_entry_fast_enough(tmp_path):
    t = DropoutTable.load(_table(tmp_path / "t.json"))
    assert t.choose(1.0).fraction == 0.0
    assert t.choose(1.05).fraction == 0.125  # 0.125, 0.25 and 0.5 are fast enough: 0.125 costs least
    assert t.choose(1.2).fraction == 0.25  # 0.9 x 1.2 > 1: 0.25 and 0.5 are, 0.25 costs less
    assert t.choose(2.0).fraction == 0.5  # only 0.5 (0.4 x 2 <= 1)
    assert t.choose(3.0).fraction == 0.5  # nothing is: the fastest
    assert t.ratio(0.25) == 0.75


def test_bad_tables_and_options_are_errors(tmp_path):
    with pytest.raises(CaramelError, match="needs dropout_table=PATH"):
        build_options(CaramelOptions, {"balance": "dropout"})
    with pytest.raises(CaramelError, match="dropout_table is for balance='dropout'"):
        build_options(CaramelOptions, {"dropout_table": "t.json"})
    with pytest.raises(CaramelError, match="balance must be one of off, batch, dropout"):
        build_options(CaramelOptions, {"balance": "filters"})
    with pytest.raises(CaramelError, match="format"):
        DropoutTable.from_dict({"format": "caramel.profile/1"})
    bad = dict(ENTRIES[1], time_ratio=0)
    with pytest.raises(CaramelError, match=r"entries\[1\].time_ratio must be a number > 0"):
        DropoutTable.load(_table(tmp_path / "a.json", entries=[ENTRIES[0], bad]))
    with pytest.raises(CaramelError, match="needs an entry with fraction 0"):
        DropoutTable.load(_table(tmp_path / "b.json", entries=ENTRIES[1:]))
    with pytest.raises(CaramelError, match=r"entries\[0\] needs numbers"):
        DropoutTable.load(_table(tmp_path / "c.json", entries=[{"fraction": 0.0}]))
    with pytest.raises(CaramelError, match="cannot read it as JSON"):
        DropoutTable.load(tmp_path / "missing.json")
    with pytest.raises(CaramelError, match="--dropout-fractions"):
        check_fractions("0,1.5")
    t = DropoutTable.load(_table(tmp_path / "d.json", groups=["layers.0"]))
    with pytest.raises(CaramelError, match=r"measured for groups \['layers.0'\].*\['conv1', 'conv2'\]"):
        t.check_groups(["conv1", "conv2"])


@pytest.mark.timeout(120)
def test_nothing_dropped_is_bit_identical_to_balance_off(tmp_path):
    from tests.strategies.adapt.dropout_workers import zero_fraction_worker
    for res in run_workers(zero_fraction_worker, 2, args=(_table(tmp_path / "t.json"), 5), timeout_s=100):
        assert res["same"], res["diff"]
        assert res["patched"] == []  # nothing dropped: no narrow forward was installed


@pytest.mark.timeout(120)
def test_fixed_masks_average_each_unit_over_the_ranks_that_kept_it(tmp_path):
    from tests.strategies.adapt.dropout_workers import fixed_masks_worker
    for res in run_workers(fixed_masks_worker, 2, args=(_table(tmp_path / "t.json"), [0.25, 0.5]), timeout_s=100):
        assert max(res["diffs"].values()) <= 1e-5, res["diffs"]
        assert res["dropped_share"]["conv2.weight"] >= 0.5  # rank 1 kept half of conv2's rows: a real drop
        assert res["patched"] == ["conv1", "bn1", "conv2", "bn2", "fc"] and res["patched_after"] == []


@pytest.mark.timeout(120)
def test_a_slowed_rank_is_given_a_drop(tmp_path):
    from tests.strategies.adapt.dropout_workers import decide_worker
    # decisions every 4 steps; a drop applies when two in a row agree (dropout_rule)
    results = run_workers(decide_worker, 2, args=(_table(tmp_path / "t.json"), 20), timeout_s=100)
    for res in results:
        # given once and kept (exact windows: nothing withdraws it)
        assert res["fractions"] == [0.0, 0.5] and res["changes"] == 1, res
        # profiling, trial and planning steps stay out of the windows (there are some: default options)
        assert res["untimed_steps"] and res["timed_untimed"] == [], res
    assert results[1]["ratio"] == 0.4 and results[0]["ratio"] == 1.0
    # rank 0 blocks in each decision's gather by rank 1's lead (72 ms, 21.6 ms once rank 1 drops):
    # a wait, so its window holds its own 12 ms a step; rank 1's holds its full model's 84 ms
    assert results[0]["held_s"] and min(results[0]["held_s"]) > 0.02, results[0]["held_s"]
    assert results[0]["window"] and results[0]["window"] == [pytest.approx(0.012)] * len(results[0]["window"])
    assert results[1]["window"] and results[1]["window"] == [pytest.approx(0.084)] * len(results[1]["window"])


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_the_decisions_gather_is_a_wait_not_compute(monkeypatch, tmp_path, backend):
    """The decision's all-gather blocks a faster rank until the slow one arrives: counted as the
    wait of the step it falls in (as `balance="batch"`'s), else the faster rank's next compute
    time reads as the slow rank's step and widens its window. On gloo the host blocks in the
    call; on NCCL the call only orders streams and the host blocks where it reads the result."""
    import collections
    from types import SimpleNamespace

    import caramel.strategies.caramel.dropout as dropout
    from caramel.strategies.caramel.dropout_rule import Confirmation

    clock_s, waits, pending = [100.0], [], [False]

    class InFlight(torch.Tensor):
        """A gathered result not yet on the host: its first read blocks on the slow rank."""

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if pending[0]:
                pending[0] = False
                clock_s[0] += 0.07
            return super().__torch_function__(func, types, args, kwargs or {})

    def gather(out, mine, group):
        if backend == "gloo":
            clock_s[0] += 0.07  # blocked on the slow rank
            for o in out:
                o.copy_(mine)
        else:
            out[:] = [mine.clone().as_subclass(InFlight) for _ in out]
            pending[0] = True

    monkeypatch.setattr(dropout.dist, "all_gather", gather)
    monkeypatch.setattr(dropout.dist, "get_backend", lambda group: backend)
    b = dropout.DropoutBalancer.__new__(dropout.DropoutBalancer)  # _decide's state only: no engine hooks
    b.engine = SimpleNamespace(params=[], recorder=SimpleNamespace(now=lambda: clock_s[0]), count_wait=waits.append,
                               stats=SimpleNamespace(log=lambda *args: None))
    b.group, b.world, b.table, b.step = None, 2, DropoutTable.load(_table(tmp_path / "t.json")), 4
    b.times, b.confirmation, b.fractions, b.changes = collections.deque([0.01] * 3), Confirmation(), [0.0, 0.0], []
    b._decide()
    assert not pending[0] and clock_s[0] == pytest.approx(100.07)  # the result was read: the block happened
    assert waits == [pytest.approx(0.07)]


def test_the_simulator_scales_the_slow_worker_by_its_entry(tmp_path):
    from caramel.strategies.caramel.simulate import simulate_caramel
    from caramel.topology.spec import ClusterSpec, WorkerSpec
    from tests.sim.helpers import two_layer_profile
    prof = two_layer_profile()
    uneven = ClusterSpec([WorkerSpec("fast", 1.0), WorkerSpec("slow", 0.5)], bandwidth_bps=1e9, latency_s=1e-6)
    table = _table(tmp_path / "t.json")
    equal = simulate_caramel(prof, uneven, build_options(CaramelOptions, {"overlap": "forward"}))
    dropped = simulate_caramel(prof, uneven, build_options(CaramelOptions, {"overlap": "forward", "balance": "dropout",
                                                                            "dropout_table": table}))
    # compute 3.2 s at speed 1: 6.4 s on the slow worker; slowness 2 picks fraction 0.5 (ratio 0.4): 2.56 s,
    # under the fast worker's 3.2 s
    assert equal.step_time_s == pytest.approx(6.4, rel=0.02)
    assert dropped.step_time_s == pytest.approx(3.2, rel=0.02)
