"""The comm-only baseline buckets gradients exactly as DDP does."""
import pytest
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


@pytest.mark.parametrize("comm_s, compute_s", [(0.05, 0.1), (0.2, 0.05)])
def test_concurrent_issues_all_communication_first_awaits_it_last_and_times_the_overlap(monkeypatch, comm_s, compute_s):
    import time

    from caramel.bench import baselines
    from caramel.bench.baselines import CommOnly, ComputeOnly, Concurrent

    w = get_model("mlp")()
    compute = ComputeOnly(w.model, torch.optim.SGD(w.model.parameters(), lr=0.1), w.inputs, w.targets, w.loss_fn,
                          torch.device("cpu"))
    comm = CommOnly(w.model, torch.device("cpu"))
    events, futures = [], []

    # The fake collectives end when the test says, not on a timer, so a loaded host's late
    # wake-ups cannot move an end across the compute's: a short collective ends comm_s into the
    # compute; a long one only once the step waits for it, after the compute has ended.
    def finish_all():
        for fut, buf in futures:
            if not fut.done():
                fut.set_result([buf])

    class Work:
        def __init__(self, buf):
            self.fut = torch.futures.Future()
            futures.append((self.fut, buf))

        def get_future(self):
            return self.fut

    def all_reduce(buf, group=None, async_op=False):
        assert async_op, "the concurrent baseline must not block on a collective before computing"
        events.append("issue")
        return Work(buf)

    def compute_step():
        events.append("compute")
        if comm_s < compute_s:
            time.sleep(comm_s)
            finish_all()
            time.sleep(compute_s - comm_s)
        else:
            time.sleep(compute_s)

    wait_all = torch.futures.wait_all

    def finish_then_wait(futs):
        assert not any(f.done() for f, _ in futures) or comm_s < compute_s
        finish_all()
        return wait_all(futs)

    monkeypatch.setattr(baselines.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(compute, "run", compute_step)  # the concurrent baseline's compute
    monkeypatch.setattr(torch.futures, "wait_all", finish_then_wait)
    concurrent = Concurrent(compute, comm)
    concurrent.step()
    assert events == ["issue"] * len(comm.buffers) + ["compute"]
    assert all(f.done() for f, _ in futures)  # awaited before the step returns
    ((took_s, overlap_s, started),) = concurrent.spans
    assert took_s >= compute_s
    if comm_s > compute_s:  # in flight through the whole compute; only the first started during it
        assert overlap_s == took_s and started == 1
    else:  # every collective (all ending comm_s in) started before the compute ended
        assert comm_s <= overlap_s <= took_s and started == len(comm.buffers)
