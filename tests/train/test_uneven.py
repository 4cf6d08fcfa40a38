"""Uneven workers in `caramel train`: the slow-worker flag's checks, and batches by share
refused where they cannot be kept exact (one process; the 2-worker run is in test_runs.py)."""
import pytest

from caramel.errors import CaramelError
from caramel.profile.slowdown import parse_slow_worker
from caramel.train.config import TrainConfig, validate
from caramel.train.data import ShardedSampler
from caramel.train.uneven import BatchSource

pytestmark = pytest.mark.timeout(60)


def test_slow_worker_takes_rank_and_factor_and_names_the_key_when_bad():
    assert parse_slow_worker("1:2") == (1, 2.0) and parse_slow_worker("0=1.5") == (0, 1.5)
    for bad in ("1", "a:2", "1:0.5", "-1:2", "1:inf"):
        cfg = TrainConfig()
        cfg.parallel.slow_worker = bad
        with pytest.raises(CaramelError, match=r"cfg: parallel.slow_worker .*expected RANK:FACTOR"):
            validate(cfg, "cfg")


def test_batches_by_share_refuse_a_padded_epoch():
    drop = ShardedSampler(1000, 2, 0, 32)
    with pytest.raises(CaramelError, match="use --remainder drop"):
        BatchSource(ShardedSampler(1000, 2, 0, 32, remainder="pad"), None, "batch", 64, 1000, 0)
    equal = BatchSource(drop, None, "off", 64, 1000, 0)  # without balance: the sharded slices
    assert equal.indices(3).tolist() == drop.indices(3).tolist() and equal.summary() == {}
