"""dlADMM: every subproblem update lowers the augmented Lagrangian, the output constraint's
residual goes to zero, the network learns, options are checked, and the run sharded over two
gloo processes equals the serial one."""
from __future__ import annotations

import pytest
import torch

from caramel.admm import AdmmOptions, DlAdmm, shard
from caramel.errors import CaramelError
from caramel.strategies.options import build_options
from caramel.testing import run_workers
from tests.admm.admm_workers import blobs, options, serial_run, sharded_worker


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("solve", ["backtrack", "exact"])
def test_every_update_lowers_the_augmented_lagrangian(solve):
    x, y = blobs()
    model = DlAdmm(x, y, 3, options(solve))
    seen = set()
    for _ in range(4):
        for name, layer, apply in model.updates():
            before = model.measures()["lagrangian"]
            apply()
            after = model.measures()["lagrangian"]
            assert after <= before + 1e-9 * abs(before), (name, layer, before, after)
            seen.add(name)
        model.dual_update()
    assert seen == {"W", "b", "z", "a"}


@pytest.mark.parametrize("solve", ["backtrack", "exact"])
def test_the_output_residual_goes_to_zero_and_the_network_learns(solve):
    model = serial_run(solve, 1)
    first = model.measures()
    for _ in range(59):
        model.iterate()
    last = model.measures()
    assert last["primal_residual"] < 0.02 * first["primal_residual"], (first, last)
    assert last["train_loss"] < 0.5 * first["train_loss"]
    x, y = blobs()
    assert float((model.predict(x).argmax(1) == y).double().mean()) > 0.9
    # the exported torch module is the same network
    assert torch.allclose(model.to_module()(x), model.predict(x))


def test_options_are_checked_with_clear_errors():
    assert build_options(AdmmOptions, {"hidden": "16x8", "rho": 2}).hidden == (16, 8)
    with pytest.raises(CaramelError, match="did you mean 'rho'"):
        build_options(AdmmOptions, {"rh": 1.0}, "admm")
    with pytest.raises(CaramelError, match="solve must be one of backtrack, exact"):
        AdmmOptions(solve="newton")
    with pytest.raises(CaramelError, match="nu must be > 0"):
        AdmmOptions(nu=0.0)
    with pytest.raises(CaramelError, match="labels must lie in 0..2"):
        DlAdmm(torch.zeros(4, 2), torch.tensor([0, 1, 2, 3]), 3)
    with pytest.raises(CaramelError, match="cannot be split across 3 ranks"):
        shard(2, 3, 0)
    assert [shard(7, 3, r) for r in range(3)] == [slice(0, 3), slice(3, 5), slice(5, 7)]


@pytest.mark.timeout(120)
def test_sharded_over_two_processes_equals_serial():
    iterations = 8
    results = run_workers(sharded_worker, world_size=2, args=(iterations,), timeout_s=100)
    for solve in ("backtrack", "exact"):
        serial = serial_run(solve, iterations)
        for rank in range(2):
            got = results[rank][solve]
            for mine, ref in zip(got["W"] + got["b"], serial.W + serial.b):
                mine = torch.tensor(mine, dtype=torch.float64)
                assert torch.allclose(mine, ref, rtol=0, atol=1e-10), (solve, rank, float((mine - ref).abs().max()))
            assert got["theta"] == serial.theta and got["tau"] == serial.tau  # the same backtracking decisions
            assert got["measures"]["lagrangian"] == pytest.approx(serial.measures()["lagrangian"], rel=1e-12)
