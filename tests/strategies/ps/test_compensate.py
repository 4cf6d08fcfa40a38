"""DC-ASGD's delay compensation (`ps:staleness=compensate`) against a hand computation."""
from __future__ import annotations

import math

import pytest
import torch

from caramel.errors import CaramelError
from caramel.strategies.ps.compensate import DC_EPS, DC_MOMENTUM, DelayCompensation, compensated
from caramel.strategies.options import build_options, parse_spec, to_spec
from caramel.strategies.ps.options import DEFAULT_DC_LAMBDA, PsOptions


def test_the_compensated_gradient_matches_a_hand_computation():
    # two workers, one element each: pushed parts are gradient / 2
    g0, g1 = 0.4, -0.2  # full-scale gradients
    d1 = 0.05  # worker 1 computed at w_used = w_now - 0.05; worker 0 is fresh
    out = [torch.tensor([g0 / 2]), torch.tensor([g1 / 2])]
    ms = compensated(out, [None, torch.tensor([d1])], None, 2.0, 2)
    want_ms = (g0 * g0 + g1 * g1) / 2  # the first gradient starts the running mean
    lam = 2.0 / math.sqrt(want_ms + DC_EPS)
    assert ms.item() == pytest.approx(want_ms, rel=1e-6)
    assert out[0].item() == pytest.approx(g0 / 2, rel=1e-7)
    assert out[1].item() == pytest.approx((g1 + lam * g1 * g1 * d1) / 2, rel=1e-6)
    # the running mean square goes on from the previous one
    ms2 = compensated([torch.tensor([g0 / 2]), torch.tensor([g1 / 2])], [None, None], ms.clone(), 2.0, 2)
    assert ms2.item() == pytest.approx(DC_MOMENTUM * want_ms + (1 - DC_MOMENTUM) * (g0 * g0 + g1 * g1) / 2, rel=1e-6)


def test_half_precision_gradients_are_corrected_in_float32():
    """A zero gradient and a tiny running mean make lambda ~ lambda0 * W / sqrt(DC_EPS), beyond
    float16's range: the correction stays finite and equals the float32 one (to the dtype's precision)."""
    values, drift = [0.0, 1e-3, 0.5], [0.01, 0.01, 0.01]
    for dtype in (torch.float16, torch.bfloat16):
        exact = [torch.tensor(values, dtype=dtype).float() for _ in range(2)]  # the inputs as dtype holds them
        want_ms = compensated(exact, [None, torch.tensor(drift, dtype=dtype).float()], None, 200.0, 2)
        parts = [torch.tensor(values, dtype=dtype) for _ in range(2)]
        ms = compensated(parts, [None, torch.tensor(drift, dtype=dtype)], None, 200.0, 2)
        assert ms.dtype == torch.float32 and torch.equal(ms, want_ms), dtype
        assert parts[1].dtype == dtype and torch.isfinite(parts[1]).all(), (dtype, parts[1])
        torch.testing.assert_close(parts[1], exact[1].to(dtype))  # dtype's tolerance: the sum is rounded twice
        assert parts[1][0] == 0 and parts[1][2] > 1  # a zero gradient stays zero; the correction is there
        ms = compensated(parts, [None, None], ms, 200.0, 2)  # the running mean goes on in float32
        assert ms.dtype == torch.float32


def test_the_server_keeps_the_versions_the_bound_allows_and_corrects_in_place():
    dc = DelayCompensation(lambda0=1.0, keep_versions=2)
    w = torch.tensor([1.0, 2.0])
    for version, value in enumerate(([0.5, 1.0], [0.7, 1.5], [0.9, 1.8])):
        dc.record(version, {0: torch.tensor(value)})
    assert sorted(dc.history) == [1, 2]  # version 0 is further back than any gradient may be
    flat_own, flat_other = torch.tensor([0.1, 0.2]), torch.tensor([0.3, -0.1])
    dc.bucket([0], [[flat_own], [flat_other]], [[0], [2]], [w], 3, {0: True}, 2)
    full_other = torch.tensor([0.6, -0.2])
    ms = (torch.tensor([0.2, 0.4]) ** 2 + full_other ** 2) / 2
    want = (full_other + full_other ** 2 * (w - torch.tensor([0.7, 1.5])) / torch.sqrt(ms + DC_EPS)) / 2
    torch.testing.assert_close(flat_other, want)
    torch.testing.assert_close(flat_own, torch.tensor([0.1, 0.2]))
    assert (dc.corrected, dc.missing) == (1, 0)
    dc.bucket([0], [[flat_own], [flat_other]], [[0], [3]], [w], 3, {0: True}, 2)  # version 0 was dropped
    assert dc.missing == 1
    # asp's bound is 32 versions; when this update's pushes were at most one behind, only the
    # versions from that one on can still be asked for
    dc = DelayCompensation(lambda0=1.0, keep_versions=32)
    for version in range(6):
        dc.record(version, {0: torch.tensor([float(version)])}, oldest_used=version - 1)
    assert sorted(dc.history) == [4, 5]


def test_compensate_is_refused_where_it_has_no_meaning():
    for consistency in ("bsp", "ssp:0"):
        with pytest.raises(CaramelError, match=f"consistency={consistency} never has"):
            PsOptions(consistency=consistency, staleness="compensate")
    with pytest.raises(CaramelError, match="dedicated=true"):
        PsOptions(consistency="ssp:2", staleness="compensate", servers=1, dedicated=True)
    with pytest.raises(CaramelError, match="hierarchical=true"):
        PsOptions(consistency="ssp:2", staleness="compensate", hierarchical=True)
    for value in (5.0, DEFAULT_DC_LAMBDA):  # the default given explicitly is not silently ignored either
        with pytest.raises(CaramelError, match="ps: dc_lambda=.* applies to staleness=compensate only"):
            PsOptions(consistency="ssp:2", staleness="pace", dc_lambda=value)
    with pytest.raises(CaramelError, match="applies to staleness=compensate only"):
        build_options(PsOptions, parse_spec(f"ps:consistency=ssp:2,staleness=pace,dc_lambda={DEFAULT_DC_LAMBDA:g}")[1])
    spec = "ps:consistency=ssp:2,staleness=compensate"
    assert to_spec("ps", build_options(PsOptions, parse_spec(spec + ",dc_lambda=2")[1])) == \
        "ps:consistency=ssp:2,dc_lambda=2,staleness=compensate"
    assert to_spec("ps", build_options(PsOptions, parse_spec(spec)[1])) == spec
    assert PsOptions(consistency="ssp:2", staleness="compensate").dc_lambda0() == DEFAULT_DC_LAMBDA
    assert PsOptions(consistency="ssp:2", staleness="compensate", dc_lambda=200).dc_lambda0() == 200.0
    with pytest.raises(CaramelError, match="dc_lambda must be a finite number"):
        PsOptions(consistency="ssp:2", staleness="compensate", dc_lambda=float("nan"))
