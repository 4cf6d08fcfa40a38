"""The buffer broadcast's payload and options (no processes: the packing alone)."""
import pytest
import torch
from torch import nn

import caramel
from caramel.runtime.buffer_sync import BufferSync, buffer_mode


class _Engine:
    require_sync, delegating = True, False


def _module(seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    m = nn.Module()
    m.register_buffer("f32", torch.randn(3, 5, generator=g))
    m.register_buffer("step", torch.tensor(seed * 7, dtype=torch.int64))  # 0-dim, 8 bytes, after 60
    m.register_buffer("mask", torch.rand(7, generator=g) > 0.5)
    m.register_buffer("f16", torch.randn(5, generator=g).half())
    m.register_buffer("f64", torch.randn(2, 2, generator=g, dtype=torch.float64).t())  # not contiguous
    return m


def test_payload_round_trip_of_mixed_dtypes():
    src, dst = _module(1), _module(2)
    sender, receiver = BufferSync(src, _Engine(), None), BufferSync(dst, _Engine(), None)
    receiver.rank = 1
    payload = sender._pack(kind=1)
    assert payload.dtype == torch.uint8 and int(payload[-1]) == 1
    assert all(off % b.element_size() == 0 for b, (off, _) in zip(src.buffers(), sender._layout()[0]))
    receiver._unpack(payload)
    for a, b in zip(src.buffers(), dst.buffers()):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_kept_payloads_match_fresh_ones_and_follow_resizes():
    # the early broadcast's payloads are kept between steps, a view per buffer: the same bytes
    # as a payload made from scratch, reused while the sizes stay, made again when one changes
    src, dst = _module(1), _module(2)
    sender, receiver = BufferSync(src, _Engine(), None), BufferSync(dst, _Engine(), None)
    receiver.rank = 1
    kept = sender._pack(kind=1, always=True, slot="own")
    assert torch.equal(kept, sender._pack(kind=1))
    assert sender._pack(kind=1, always=True, slot="own") is kept
    recv = receiver._pack(kind=1, slot="recv")
    recv.copy_(kept)  # what the broadcast does
    receiver._unpack(recv, slot="recv")
    assert all(torch.equal(a, b) for a, b in zip(src.buffers(), dst.buffers()))
    src.f32.resize_(4, 6).normal_()  # in place, as quantization observers do
    grown = sender._pack(kind=1, always=True, slot="own")
    assert grown is not kept and grown.numel() > kept.numel()
    assert torch.equal(grown, sender._pack(kind=1))


def test_broadcast_buffers_values():
    assert buffer_mode(True) == "early" and buffer_mode("early") == "early"
    assert buffer_mode("forward") == "forward" and buffer_mode(False) is None
    for bad in ("sometimes", 1, None):
        with pytest.raises(caramel.CaramelError, match="broadcast_buffers must be"):
            buffer_mode(bad)


def test_parallelize_rejects_a_bad_broadcast_buffers_before_anything_starts():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(caramel.CaramelError, match="broadcast_buffers must be .* got 'yes'"):
        caramel.parallelize(model, opt, broadcast_buffers="yes")
    assert not torch.distributed.is_initialized()


class _Done:
    def wait(self):
        return True


class _FakeGroup:
    """Rank 0 of a group whose broadcasts complete at once; records the kind of each."""

    def __init__(self):
        self.kinds: list[int] = []

    def rank(self):
        return 0

    def broadcast(self, tensors, _opts):
        self.kinds.append(int(tensors[0][-1]))
        return _Done()


class _Recorder:
    def now(self):
        return 0.0

    def record(self, *args, **kwargs):
        pass


class _HookedEngine(_Engine):
    recorder = _Recorder()

    def count_wait(self, seconds):  # the engine adds a broadcast's wait to the step's
        pass


def _hooked(model: nn.Module, mode: str = "early", send_at: str = "forward_end") -> tuple[BufferSync, _FakeGroup]:
    group = _FakeGroup()
    sync = BufferSync(model, _HookedEngine(), group, mode=mode, send_at=send_at)
    model.register_forward_pre_hook(sync.pre_forward, prepend=True)
    model.register_forward_hook(sync.post_forward, always_call=True)
    return sync, group


EARLY_KIND, AT_FORWARD_KIND = 1, 2


def test_strided_and_conjugate_buffers_round_trip():
    src, dst = nn.Module(), nn.Module()
    for m, seed in ((src, 3), (dst, 4)):
        g = torch.Generator().manual_seed(seed)
        m.register_buffer("strided", torch.randn(8, generator=g)[::2])
        m.register_buffer("conj", torch.randn(3, generator=g, dtype=torch.complex64).conj())
    sender, receiver = BufferSync(src, _Engine(), None), BufferSync(dst, _Engine(), None)
    receiver.rank = 1
    receiver._unpack(sender._pack(kind=1))
    assert all(torch.equal(a, b) for a, b in zip(src.buffers(), dst.buffers()))
    # the kept payloads too (a conjugate-bit target takes the per-buffer path)
    src.strided.mul_(2)
    recv = receiver._pack(kind=1, slot="recv")
    recv.copy_(sender._pack(kind=1, always=True, slot="own"))
    receiver._unpack(recv, slot="recv")
    assert all(torch.equal(a, b) for a, b in zip(src.buffers(), dst.buffers()))


def test_a_forward_that_calls_the_module_again_broadcasts_once():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x, inner=False):
            return self.bn(x) if inner else self.bn(x) + self(x, inner=True)

    model = Twice()
    _, group = _hooked(model)
    for _ in range(3):
        model(torch.randn(4, 3))
    # the first forward syncs at its start; each one sends as it ends
    assert group.kinds == [AT_FORWARD_KIND, EARLY_KIND, EARLY_KIND, EARLY_KIND]


def test_a_write_through_data_between_steps_takes_the_broadcast_at_the_forward_start():
    # `.data` writes do not bump version counters; the byte comparison sees them
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    _, group = _hooked(model)
    model(torch.randn(4, 3))
    model(torch.randn(4, 3))
    assert group.kinds == [AT_FORWARD_KIND, EARLY_KIND, EARLY_KIND]
    model[1].running_mean.data.fill_(3.0)
    model(torch.randn(4, 3))
    assert group.kinds == [AT_FORWARD_KIND, EARLY_KIND, EARLY_KIND, AT_FORWARD_KIND, EARLY_KIND]


def test_buffers_that_grow_in_the_first_forward_are_sent_at_their_new_size():
    # quantization observers start with empty statistics and size them in the first forward
    class Observer(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("min_val", torch.tensor([]))

        def forward(self, x):
            self.min_val.resize_(x.shape[1])
            self.min_val.copy_(x.min(0).values)
            return x

    model = Observer()
    sync, group = _hooked(model)
    model(torch.randn(4, 5))
    model(torch.randn(4, 5))
    assert group.kinds == [AT_FORWARD_KIND, EARLY_KIND, EARLY_KIND]
    assert sync._layout()[1] == 5 * 4 + 1


def test_time_blocked_on_the_broadcast_counts_as_the_steps_wait():
    """balance= times a rank's compute as its step less its waits: a rank blocked on rank 0's
    buffers is waiting, not computing."""
    class Clock:
        t = 0.0

        def now(self):
            return self.t

    class SlowWork:
        def wait(self):
            clock.t += 0.25  # rank 0 sends its buffers a quarter second later

    class Engine(_Engine):
        recorder = clock = Clock()
        waits: list[float] = []

        def count_wait(self, seconds):
            self.waits.append(seconds)

    engine = Engine()
    clock = engine.clock
    sync = BufferSync(_module(0), engine, None)
    sync.rank = 1
    payload = sync._pack(kind=EARLY_KIND)
    sync._wait(SlowWork(), payload, EARLY_KIND)
    assert engine.waits == [0.25]


def test_send_at_call_sends_when_called_and_checks_at_the_forward():
    # the ps strategy sends at step(); a forward only collects, or broadcasts when buffers changed
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    sync, group = _hooked(model, send_at="call")
    model(torch.randn(4, 3))
    assert group.kinds == [AT_FORWARD_KIND]  # the first forward; none sent as it ended
    sync.send_early()
    sync.send_early()  # a second call finishes and drops the first: one pending at most
    model(torch.randn(4, 3))
    assert group.kinds == [AT_FORWARD_KIND, EARLY_KIND, EARLY_KIND] and sync.early_taken == 1
    sync.send_early()
    model[1].reset_running_stats()
    model(torch.randn(4, 3))
    assert group.kinds[-2:] == [EARLY_KIND, AT_FORWARD_KIND] and sync.early_taken == 1
    with torch.no_grad():
        model(torch.randn(4, 3))  # synced at its start (a training forward came before) ...
    n = len(group.kinds)
    sync.send_early()  # ... but DDP syncs none after a no-grad forward: nothing to send
    assert group.kinds[-1] == AT_FORWARD_KIND and len(group.kinds) == n
