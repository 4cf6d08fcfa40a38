"""DDRL: the features fitted across two gloo processes equal the single-process ones, a small
run learns the digits, and bad input gets a clear error."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from caramel.ddrl import DdrlExtractor, DdrlNet, DdrlOptions
from caramel.ddrl.stats import mean_var, moments, spherical_kmeans
from caramel.errors import CaramelError
from caramel.testing import run_workers
from tests.ddrl.ddrl_workers import OPTIONS, digits, fit_worker


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def test_merged_statistics_equal_the_statistics_of_all_the_data():
    x = torch.randn(50, 4, dtype=torch.float64)
    halves = [x[:20], x[20:]]
    # a reducer that sums the other half's partial sums in: the merge two ranks would make
    for i, part in enumerate(halves):
        other = halves[1 - i]
        mean, cov, n = moments(part, lambda t, other=other: t + torch.cat([torch.tensor([float(len(other))], dtype=t.dtype),
                                                                           other.sum(0), (other.T @ other).reshape(-1)]))
        assert n == 50
        assert torch.allclose(mean, x.mean(0)) and torch.allclose(cov, torch.cov(x.T, correction=0))
    mean, var = mean_var(halves[0], lambda t: t + torch.cat([torch.tensor([30.0], dtype=t.dtype), halves[1].sum(0),
                                                                (halves[1] ** 2).sum(0)]))
    assert torch.allclose(mean, x.mean(0)) and torch.allclose(var, x.var(0, correction=0))
    d = spherical_kmeans(x, 3, 5, seed=0, total=lambda t: t)
    assert torch.allclose(d.norm(dim=1), torch.ones(3, dtype=torch.float64))


@pytest.mark.timeout(120)
def test_fit_across_two_processes_equals_the_single_process_fit():
    images, _ = digits(240)
    results = run_workers(fit_worker, world_size=2, args=(images.tolist(),), timeout_s=100)
    serial = DdrlExtractor.fit(images, OPTIONS).state_dict()
    assert [r["info"]["ddrl_fit_images_per_rank"] for r in results] == [120, 120]
    for rank in range(2):
        got = results[rank]["buffers"]
        assert set(got) == set(serial)
        for key, ref in serial.items():
            mine = torch.tensor(got[key], dtype=ref.dtype)
            assert torch.allclose(mine, ref, rtol=1e-5, atol=1e-5), (rank, key, float((mine - ref).abs().max()))


def test_a_small_run_learns_the_digits():
    images, labels = digits(900)
    train_x, train_y, test_x, test_y = images[:700], labels[:700], images[700:], labels[700:]
    torch.manual_seed(0)
    net = DdrlNet(DdrlExtractor.fit(train_x, OPTIONS), hidden=32, layers=1, dropout=0.0)
    # only the head is trained, and the fixed extractor is no buffer that strategies would broadcast
    assert [name for name, _ in net.named_parameters()] == ["head.0.weight", "head.0.bias", "head.3.weight", "head.3.bias"]
    assert list(net.buffers()) == []
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        for idx in torch.randperm(len(train_x), generator=g).split(32):
            loss = F.cross_entropy(net(train_x[idx]), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        accuracy = float((net(test_x).argmax(1) == test_y).float().mean())
    assert accuracy > 0.9, accuracy  # chance is 0.1; 16 + 24 centroids and 700 images give 0.915 (the full workload: 0.986)


def test_bad_input_gets_a_clear_error():
    with pytest.raises(CaramelError, match="one entry per layer"):
        DdrlOptions(patches=(3,), centroids=(8, 8))
    with pytest.raises(CaramelError, match="kmeans_iterations must be >= 1"):
        DdrlOptions(kmeans_iterations=0)
    with pytest.raises(CaramelError, match=r"expected images as \(batch, channels, height, width\)"):
        DdrlExtractor.fit(torch.zeros(10, 64))
    with pytest.raises(CaramelError, match="5x5 patches do not fit its 4x4 input maps"):
        DdrlExtractor.fit(torch.rand(20, 1, 8, 8), DdrlOptions(patches=(3, 5), centroids=(4, 4), kmeans_iterations=1))


def test_caramel_train_builds_the_workload():
    """What `caramel train --workload ddrl` builds on one process (no group: the fit is local)."""
    from caramel.train.config import TrainConfig, apply_dict
    from caramel.train.workloads import build_workload

    cfg = apply_dict(TrainConfig(), {"run": {"workload": "ddrl"}, "data": {"val_fraction": 0.2},
                                     "model": {"d_model": 16, "layers": 1}}, "test")
    wl = build_workload(cfg)
    assert wl.name == "ddrl" and len(wl.val_set) == 359
    assert wl.info["ddrl_features"] == 768 and wl.info["ddrl_fit_images_per_rank"] == len(wl.train_set)
    assert wl.info["ddrl_fit_s"] > 0
    x, _ = wl.val_set.batch(torch.arange(4))
    assert wl.model(x).shape == (4, 10)
