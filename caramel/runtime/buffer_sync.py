"""DDP's buffer semantics (rank 0's buffers, such as BatchNorm statistics, on every rank at the
start of each forward), with the broadcast moved off the critical path.

torch DDP broadcasts rank 0's buffers at the start of every forward that follows a synchronized
training forward. There it costs a round trip and waits for the slowest rank; with Caramel's
forward overlap it would also queue on the link behind the previous step's gradients, which
still stream while the next forward begins (how long that held the forward on the emulated
cluster: docs/results/engine.md, "Buffers sent as the forward ends").

Rank 0's buffers change only in its forwards (a backward or an optimizer step leaves them
alone), so what DDP sends at the start of forward k+1 is what rank 0 held when forward k ended.
`mode="early"` (the default) therefore issues the broadcast when a synchronized training forward
ends, while the link is free of this step's gradients, and the next forward only collects it.

Code that changes buffers between a training forward and the next one (resetting statistics,
loading a state dict, a write through `.data`, a backward that recomputes checkpointed forwards)
is caught by comparing each rank's buffers, byte for byte, with what they held when the forward
ended (version counters miss `.data` writes and BatchNorm's own statistics updates). A rank that
sees its buffers changed takes DDP's path for that forward instead: a broadcast made then.
Programs run the same code on every rank, so every rank takes it. When ranks disagree, a marker
in every payload turns the mismatch into an error naming the cause at the next broadcast, not a
silent shift; a rank left waiting for a peer that never trains again fails at the group's
timeout. Where buffers may change on some ranks only, `mode="forward"` broadcasts at each
forward's start, exactly as DDP, and tolerates it.

`send_at="call"` leaves the early broadcast to the owner, who calls `send_early()` when the link
suits it (the ps strategy: at step(), ahead of its pulls, docs/ps.md); the check at the next
forward is the same, so buffers changed after that call still take DDP's path.

Every buffer travels in one payload of bytes (one collective however many dtypes), each buffer
at an offset aligned for its dtype, laid out from the buffers' current sizes at each broadcast
(quantization observers resize theirs in the first forward), and a last byte saying which kind
of broadcast it is. The payloads of the early broadcast (what this rank held, what it receives,
what it holds at the next forward) are kept from step to step with a view per buffer, so
packing and unpacking are one copy call each (on CPU buffers) while the sizes stay the same.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from caramel.errors import CaramelError
from caramel.runtime.dispatch import RELEASED
from caramel.runtime.engine import Engine

BUFFER_MODES = ("early", "forward")
SEND_AT = ("forward_end", "call")  # when mode="early" sends: as a training forward ends, or at send_early()
EARLY, AT_FORWARD = 1, 2  # the payload's marker byte
ALIGN_BYTES = 16  # any dtype's element size divides it


def buffer_mode(broadcast_buffers: Any) -> str | None:
    """`parallelize(broadcast_buffers=...)` as a mode: "early", "forward", or None (rank-local buffers)."""
    if broadcast_buffers is True:
        return "early"
    if broadcast_buffers is False:
        return None
    if isinstance(broadcast_buffers, str) and broadcast_buffers in BUFFER_MODES:
        return broadcast_buffers
    raise CaramelError(f"broadcast_buffers must be True (rank 0's buffers, sent as each training forward ends), "
                       f"'forward' (sent as each forward starts, DDP's timing), 'early' (the same as True) or "
                       f"False (rank-local buffers), got {broadcast_buffers!r}")


class BufferSync:
    """Rank 0's buffers on every rank before each forward that DDP would sync; see the module docstring."""

    def __init__(self, model: nn.Module, engine: Engine, pg: Any, mode: str = "early",
                 device: torch.device | str = "cpu", send_at: str = "forward_end"):
        assert mode in BUFFER_MODES and send_at in SEND_AT
        self.send_at = send_at
        self.device = torch.device(device)  # where payloads live: the group's device (CUDA for NCCL)
        self.buffers = [b for b in model.buffers()]
        self.engine = engine
        self.pg = pg
        self.mode = mode
        self.rank = pg.rank() if pg is not None else 0
        self.opts = dist.BroadcastOptions()
        self.opts.rootRank = 0
        self.sync_next = True  # DDP syncs before the first forward
        self._pending: tuple[Any, torch.Tensor, torch.Tensor] | None = None  # (work, payload, own bytes then)
        self._depth = 0  # a forward that calls the module again: only the outermost one counts
        self.early_taken = 0  # forwards that took the early broadcast (buffers unchanged since it left)
        # the early broadcast's payloads by role, with their views, for one layout (`_slot`)
        self._slots: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._slots_key: tuple | None = None
        self._slots_on_cpu = False

    # -- hooks
    def post_forward(self, _m, _args, _out) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth:
            return
        self.sync_next = torch.is_grad_enabled() and self.engine.require_sync
        if self.send_at == "forward_end":
            assert self._pending is None, "a forward ended twice without one starting"
            self.send_early()

    def send_early(self) -> None:
        """Issue the early broadcast of what this rank holds now, if the next forward is one DDP
        syncs; one still pending (no forward collected it) is finished and dropped first."""
        if self.mode == "early" and self.sync_next and not self.engine.delegating and self.pg is not None:
            self.drain()
            own = self._pack(EARLY, always=True, slot="own")
            payload = own if self.rank == 0 else self._pack(EARLY, slot="recv")
            work = self.pg.broadcast([payload], self.opts)
            self._pending = (work, payload, own)

    def pre_forward(self, _m, _args) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        try:
            self._collect()
        except BaseException:
            self._depth = 0  # the forward does not run, so its post-hook will not either
            raise

    def _collect(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            work, payload, own = pending
            t0 = self.engine.recorder.now()
            self._wait(work, payload, EARLY)
            now = self._pack(EARLY, always=True, slot="now")
            changed = now.shape != own.shape or not torch.equal(now[:-1], own[:-1])
            self.early_taken += not changed
            if not changed and self.rank != 0:
                self._unpack(payload, slot="recv")
            self.engine.recorder.record("wait", "sync", "broadcast:buffers", t0, self.engine.recorder.now())
            if not changed or self.engine.delegating:
                return
        elif not self.sync_next or self.engine.delegating:  # DDP broadcasts buffers itself
            return
        if self.pg is None:
            raise CaramelError(RELEASED)
        t0 = self.engine.recorder.now()
        payload = self._pack(AT_FORWARD)
        self._wait(self.pg.broadcast([payload], self.opts), payload, AT_FORWARD)
        if self.rank != 0:
            self._unpack(payload)
        self.engine.recorder.record("wait", "sync", "broadcast:buffers", t0, self.engine.recorder.now())

    def drain(self) -> None:
        """Wait for a broadcast still in flight (before the group is released)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending[0].wait()
            except Exception:  # noqa: BLE001 - a dead peer at exit: nothing left to save
                pass

    # -- payload
    def _layout(self) -> tuple[list[tuple[int, int]], int]:
        """(offset, bytes) per buffer at its current size, and the payload's length."""
        out, off = [], 0
        for b in self.buffers:
            off = -(-off // ALIGN_BYTES) * ALIGN_BYTES
            out.append((off, b.numel() * b.element_size()))
            off += b.numel() * b.element_size()
        return out, off + 1

    def _slot(self, role: str) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """The kept payload for `role` at the buffers' current layout and a view of it per buffer,
        made again when a buffer changed size, dtype, device or conjugate bit; None unless every buffer is on the CPU,
        without the conjugate bit (one copy call then moves them all)."""
        key = tuple((b.shape, b.dtype, b.device, b.is_conj()) for b in self.buffers)
        if key != self._slots_key:
            self._slots, self._slots_key = {}, key
            # foreach copies take neither other devices nor conjugate-bit buffers as targets
            self._slots_on_cpu = bool(self.buffers) and self.device.type == "cpu" and all(
                b.device.type == "cpu" and not b.is_conj() for b in self.buffers)
        if not self._slots_on_cpu:
            return None
        if role not in self._slots:
            layout, size = self._layout()
            payload = torch.zeros(size, dtype=torch.uint8)  # the alignment gaps stay zero
            views = [payload[off:off + n].view(b.dtype).view(b.shape) for b, (off, n) in zip(self.buffers, layout)]
            self._slots[role] = (payload, views)
        return self._slots[role]

    def _pack(self, kind: int, always: bool = False, slot: str | None = None) -> torch.Tensor:
        """The payload: this rank's buffers on rank 0 (or `always`), else room to receive them.
        With `slot`, the kept payload of that role (overwritten: the caller is done with it)."""
        kept = self._slot(slot) if slot is not None else None
        if kept is not None:
            payload, views = kept
            if self.rank == 0 or always:
                with torch.no_grad():
                    torch._foreach_copy_(views, self.buffers)
            payload[-1] = kind
            return payload
        layout, size = self._layout()
        payload = torch.zeros(size, dtype=torch.uint8, device=self.device)
        if self.rank == 0 or always:
            for b, (off, n) in zip(self.buffers, layout):
                flat = b.detach().resolve_conj().contiguous().reshape(-1).to(self.device)
                payload[off:off + n].copy_(flat.view(torch.uint8))
        payload[-1] = kind
        return payload

    def _unpack(self, payload: torch.Tensor, slot: str | None = None) -> None:
        kept = self._slot(slot) if slot is not None else None
        with torch.no_grad():
            if kept is not None and kept[0] is payload:  # laid out for the buffers as they are
                torch._foreach_copy_(self.buffers, kept[1])
                return
            layout, size = self._layout()
            assert payload.numel() == size, "buffers changed size between the broadcast and now"
            for b, (off, n) in zip(self.buffers, layout):
                b.copy_(payload[off:off + n].view(b.dtype).view(b.shape))

    def _wait(self, work: Any, payload: torch.Tensor, kind: int) -> None:
        t0 = self.engine.recorder.now()
        try:
            work.wait()
        except Exception as e:  # noqa: BLE001 - re-raised with context
            raise RuntimeError(f"caramel: rank {self.rank}: the buffer broadcast failed: {e}. A peer may have died "
                               f"or hung") from e
        got = int(payload[-1])  # on a GPU wait() only orders streams; reading the kind blocks the host
        # blocked on rank 0 as on a gradient bucket: not this rank's compute (balance= times compute)
        self.engine.count_wait(self.engine.recorder.now() - t0)
        if got != kind:
            what = {EARLY: "as its last training forward ended", AT_FORWARD: "as its forward started"}
            raise CaramelError(
                f"rank {self.rank} expected rank 0's buffers sent {what[kind]}, but rank 0 sent them {what.get(got, '?')}: "
                "buffers were changed between a training forward and the next forward on some ranks but not on "
                "others (broadcast_buffers=True broadcasts as a forward ends; a rank that changed its buffers "
                "since takes DDP's broadcast at the next forward's start instead). Change buffers on every rank "
                "alike, or pass broadcast_buffers='forward' for DDP's timing")
