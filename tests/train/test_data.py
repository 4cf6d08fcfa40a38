"""Sharding: disjoint shards, equal step counts, drop/pad, and clear errors for tiny datasets."""
from __future__ import annotations

import pytest
import torch

from caramel.errors import CaramelError
from caramel.train.data import ShardedSampler, TokenDataset, char_datasets, stdlib_text, val_shard

pytestmark = pytest.mark.timeout(60)


def epoch_indices(n: int, world: int, batch: int, remainder: str, epoch: int = 0, seed: int = 0) -> list[list[torch.Tensor]]:
    samplers = [ShardedSampler(n, world, r, batch, seed=seed, remainder=remainder) for r in range(world)]
    spe = samplers[0].steps_per_epoch
    assert all(s.steps_per_epoch == spe for s in samplers)  # every rank runs the same number of steps
    return [[s.indices(epoch * spe + k) for k in range(spe)] for s in samplers]


@pytest.mark.parametrize("n, world, batch", [(100, 3, 7), (21, 2, 10), (64, 4, 4), (5, 5, 1)])
def test_drop_gives_disjoint_equal_shards(n, world, batch):
    per_rank = epoch_indices(n, world, batch, "drop")
    flat = torch.cat([torch.cat(steps) for steps in per_rank])
    assert all(len(i) == batch for steps in per_rank for i in steps)
    assert len(set(flat.tolist())) == len(flat)  # no sample twice in an epoch
    assert len(flat) == (n // (world * batch)) * world * batch


@pytest.mark.parametrize("n, world, batch", [(100, 3, 7), (21, 2, 10), (3, 2, 4)])
def test_pad_covers_every_sample_with_full_batches(n, world, batch):
    per_rank = epoch_indices(n, world, batch, "pad")
    flat = torch.cat([torch.cat(steps) for steps in per_rank])
    assert all(len(i) == batch for steps in per_rank for i in steps)
    assert set(flat.tolist()) == set(range(n))
    sampler = ShardedSampler(n, world, 0, batch, remainder="pad")
    assert len(flat) - n == sampler.padded_per_epoch
    assert "padded" in sampler.describe()


def test_epochs_reshuffle_deterministically():
    a = ShardedSampler(50, 2, 1, 5, seed=3)
    b = ShardedSampler(50, 2, 1, 5, seed=3)
    spe = a.steps_per_epoch
    assert torch.equal(a.indices(spe + 2), b.indices(spe + 2))  # same seed, same position: same batch
    assert not torch.equal(a.order(0), a.order(1))  # a new order each epoch
    assert a.position(spe + 2) == (1, 2)


def test_global_batch_does_not_depend_on_the_split():
    two = torch.cat([ShardedSampler(60, 2, r, 6, seed=1).indices(3) for r in range(2)])
    three = torch.cat([ShardedSampler(60, 3, r, 4, seed=1).indices(3) for r in range(3)])
    assert torch.equal(two, three)


def test_world_larger_than_dataset_is_a_clear_error():
    with pytest.raises(CaramelError, match="training set has 3 samples but there are 4 workers"):
        ShardedSampler(3, 4, 0, 1, remainder="pad")


def test_dataset_smaller_than_a_global_batch_with_drop():
    with pytest.raises(CaramelError, match="fewer than one global batch .* use --remainder pad"):
        ShardedSampler(10, 2, 0, 8, remainder="drop")


def test_val_shards_cover_everything_once():
    parts = [val_shard(11, 3, r) for r in range(3)]
    assert sorted(torch.cat(parts).tolist()) == list(range(11))


def test_stdlib_text_is_deterministic_and_sized():
    a, b = stdlib_text(50_000), stdlib_text(50_000)
    assert a == b and len(a) == 50_000


def test_token_windows_are_shifted_by_one():
    ds = TokenDataset(torch.arange(50), seq_len=8)
    x, y = ds.batch(torch.tensor([0, 3]))
    assert torch.equal(x[1], torch.arange(24, 32)) and torch.equal(y[1], torch.arange(25, 33))
    assert len(ds) == 6


def test_char_dataset_too_small_is_a_clear_error():
    with pytest.raises(CaramelError, match="raise --text-bytes or lower --seq-len"):
        char_datasets(text_bytes=1000, seq_len=500, val_fraction=0.1)
