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
    assert all(off % b.element_size() == 0 for b, (off, _) in zip(src.buffers(), sender._layout))
    receiver._unpack(payload)
    for a, b in zip(src.buffers(), dst.buffers()):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


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
