"""The comm-only baseline buckets gradients exactly as DDP does."""
import torch
import torch.distributed as dist

from caramel.bench.baselines import MiB, ddp_bucket_bytes, trainable_params
from caramel.models.zoo import get_model


def _torch_bucket_bytes(sizes_numel, cap_mb=25):
    tensors = [torch.zeros(n) for n in sizes_numel]
    buckets, _ = dist._compute_bucket_assignment_by_size(list(reversed(tensors)), [MiB, int(cap_mb * MiB)])
    rev = list(reversed(tensors))
    return [sum(rev[i].numel() * 4 for i in b) for b in buckets]


def test_bucket_sizes_match_torch():
    for sizes in ([100, 300000, 10, 7000000, 50000, 1000], [10] * 50, [8_000_000] * 3, [1]):
        assert ddp_bucket_bytes([n * 4 for n in sizes]) == _torch_bucket_bytes(sizes)
    assert ddp_bucket_bytes([4 * 2_000_000] * 6, bucket_cap_mb=10) == _torch_bucket_bytes([2_000_000] * 6, cap_mb=10)


def test_bucket_bytes_cover_every_gradient_once():
    w = get_model("tiny_gpt")()
    params = trainable_params(w.model)  # the tied embedding counts once
    assert len(params) == len({id(p) for p in w.model.parameters()})
    total = sum(p.numel() * 4 for p in params)
    assert sum(ddp_bucket_bytes([p.numel() * 4 for p in params])) == total
