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


def test_concurrent_issues_all_communication_before_the_compute_and_awaits_it_after(monkeypatch):
    from caramel.bench import baselines
    from caramel.bench.baselines import CommOnly, ComputeOnly, Concurrent

    w = get_model("mlp")()
    compute = ComputeOnly(w.model, torch.optim.SGD(w.model.parameters(), lr=0.1), w.inputs, w.targets, w.loss_fn,
                          torch.device("cpu"))
    comm = CommOnly(w.model, torch.device("cpu"))
    events = []

    class Work:
        def __init__(self, i):
            self.i = i

        def wait(self):
            events.append(("wait", self.i))

    def all_reduce(buf, group=None, async_op=False):
        assert async_op, "the concurrent baseline must not block on a collective before computing"
        events.append(("issue", len(events)))
        return Work(len(events) - 1)

    monkeypatch.setattr(baselines.dist, "all_reduce", all_reduce)
    real_step = compute.step
    monkeypatch.setattr(compute, "step", lambda: (events.append(("compute", None)), real_step()))
    Concurrent(compute, comm).step()
    kinds = [k for k, _ in events]
    n = len(comm.buffers)
    assert kinds == ["issue"] * n + ["compute"] + ["wait"] * n
