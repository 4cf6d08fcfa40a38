"""Gradient codecs at run time: a bucket's collective sent compressed, decoded on wait.

The dispatcher asks `Compressor.issue` for each plan item; the codec the plan names for the
bucket (`caramel.plan.compression`) encodes, starts the collective(s), and returns a work whose
`wait()` decodes the result into the bucket's buffer, so the engine's waits and updates are the
same as without compression. The bucket's buffer holds gradients pre-divided by the world
size, so every codec sums what the ranks send.

Error feedback (topk, powersgd): what a rank's codec left out of this step's message is added
to its next gradient. That state, and PowerSGD's warm-started Q factors, are kept per parameter
(so a new plan keeps them) and travel in the optimizer's `state_dict()` (the
`caramel_compression` entry), so a checkpoint resumes exactly.

PowerSGD's second round (Q) is started inside `wait()`: its work reports itself complete only
once decoded, so the engine never takes it early on one rank, and every rank waits for buckets
in the same order (the forward's) and so starts the Q rounds in the same order.
"""
from __future__ import annotations

import time
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

from caramel.plan.compression import CodecSpec, parse_codec, powersgd_fits, topk_count, wire_bytes
from caramel.runtime.buckets import FlatBucket

STATE_KEY = "caramel_compression"


class _Decoded:
    """A work whose `wait()` waits for its collectives, then decodes once."""

    def __init__(self, works: list[Any], decode, early: bool = True):
        # early: complete once the collectives are (decoding then only copies); PowerSGD's is
        # complete only once waited for, since its wait starts a collective (module docstring)
        self.works, self._decode, self._done, self._early = works, decode, False, early

    def wait(self) -> bool:
        if not self._done:
            for w in self.works:
                w.wait()
            self._decode()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or (self._early and all(w.is_completed() for w in self.works))

    def get_future(self):
        return self.works[-1].get_future()


class Compressor:
    """Codec state of one engine: error feedback and Q factors per parameter index."""

    def __init__(self, params: list[torch.nn.Parameter], names: list[str], world_size: int):
        self.params, self.names, self.world_size = params, names, world_size
        self.residual: dict[int, torch.Tensor] = {}  # flat, pre-divided like the bucket
        self.q: dict[int, torch.Tensor] = {}  # PowerSGD's Q (m x r), warm start
        self._flat_res: dict[int, tuple[FlatBucket, torch.Tensor]] = {}  # bucket id -> its residual buffer
        self._specs: dict[str, CodecSpec] = {}

    def spec(self, name: str) -> CodecSpec:
        if name not in self._specs:
            self._specs[name] = parse_codec(name)
        return self._specs[name]

    # ------------------------------------------------------------ issue

    def issue(self, comm: Any, fb: FlatBucket, chunk: int, codec: str) -> tuple[Any, float]:
        """Start chunk `chunk` of `fb` with `codec`: (its work or None, its all-reduce-equivalent bytes)."""
        spec = self.spec(codec)
        elem = fb.flat.element_size()
        if spec.kind == "none":
            part = fb.chunks[chunk]
            return comm.allreduce([part]), part.numel() * elem
        if spec.kind in ("fp16", "bf16"):
            part = fb.chunks[chunk]
            low = part.to(torch.float16 if spec.kind == "fp16" else torch.bfloat16)
            work = comm.allreduce([low])
            return _Decoded([work], lambda: part.copy_(low)), low.numel() * 2
        if chunk != 0:
            return None, 0.0  # whole-bucket codecs send everything at the first chunk's turn
        sent = wire_bytes(spec, fb.numel, elem, self.world_size, [list(p.shape) for p in fb.params])
        if spec.kind == "topk":
            return self._topk(comm, fb, spec), sent
        return self._powersgd(comm, fb, spec), sent

    def _bucket_residual(self, fb: FlatBucket) -> torch.Tensor:
        """One flat residual for the bucket, its per-parameter parts views of it (made once per plan)."""
        held = self._flat_res.get(fb.id)
        if held is not None and held[0] is fb:
            return held[1]
        flat = torch.zeros(fb.numel, dtype=fb.flat.dtype, device=fb.flat.device)
        for j, idx in enumerate(fb.indices):
            view = flat[fb.offsets[j]:fb.offsets[j] + fb.params[j].numel()]
            old = self.residual.get(idx)
            if old is not None:
                view.copy_(old.reshape(-1))
            self.residual[idx] = view
        self._flat_res[fb.id] = (fb, flat)
        return flat

    def _topk(self, comm: Any, fb: FlatBucket, spec: CodecSpec) -> _Decoded:
        res = self._bucket_residual(fb)
        acc = fb.flat[:fb.numel].add(res)
        k = topk_count(spec, fb.numel)
        idx = torch.topk(acc.abs(), k, sorted=False).indices
        vals = torch.cat([acc[idx], fb.flags])  # the usage flags travel dense, beside the values
        res.copy_(acc)
        res[idx] = 0.0  # what was sent leaves the residual; the rest waits for the next step
        n = self.world_size
        all_idx = [torch.empty_like(idx) for _ in range(n)]
        all_vals = [torch.empty_like(vals) for _ in range(n)]
        works = [comm.allgather([all_idx], [idx]), comm.allgather([all_vals], [vals])]

        def decode() -> None:
            grad = fb.flat[:fb.numel]
            grad.zero_()
            fb.flags.zero_()
            for i, v in zip(all_idx, all_vals):
                grad.index_add_(0, i, v[:k])
                fb.flags.add_(v[k:])
        return _Decoded(works, decode)

    def _powersgd(self, comm: Any, fb: FlatBucket, spec: CodecSpec) -> _Decoded:
        r = spec.rank
        self._bucket_residual(fb)  # every residual of the bucket a view of one buffer, filled from the last plan's
        mats, dense_views = [], []
        for j, p in enumerate(fb.params):
            view = fb.views[j]
            if powersgd_fits(list(p.shape), r):
                idx = fb.indices[j]
                m = view.reshape(p.shape[0], -1)
                local = m + self.residual[idx].view_as(m)  # this rank's gradient with what it owes
                q = self.q.get(idx)
                if q is None:
                    # the same start on every rank: a generator seeded by the parameter's index
                    gen = torch.Generator(device="cpu").manual_seed(1_000_003 * (idx + 1))
                    q = torch.randn(m.shape[1], r, generator=gen, dtype=m.dtype).to(m.device)
                    self.q[idx] = q
                mats.append((idx, m, local, q))
            else:
                dense_views.append(view.reshape(-1))
        dense_views.append(fb.flags)
        ps = [local @ q for _, _, local, q in mats]
        first = torch.cat([t.reshape(-1) for t in ps] + dense_views)
        work = comm.allreduce([first])

        def decode() -> None:
            off = 0
            p_hats = []
            for (_, m, _, _), p in zip(mats, ps):
                p_hat = first[off:off + p.numel()].view_as(p).clone()
                off += p.numel()
                _orthogonalize(p_hat.unsqueeze(0))
                p_hats.append(p_hat)
            for v in dense_views:
                v.copy_(first[off:off + v.numel()])
                off += v.numel()
            if not mats:
                return
            qs = [local.t() @ p_hat for (_, _, local, _), p_hat in zip(mats, p_hats)]
            second = torch.cat([q.reshape(-1) for q in qs])
            comm.allreduce([second]).wait()
            off = 0
            for (idx, m, local, _), p_hat, q in zip(mats, p_hats, qs):
                q_sum = second[off:off + q.numel()].view_as(q)
                off += q.numel()
                approx = p_hat @ q_sum.t()
                self.residual[idx].view_as(m).copy_(local - approx)
                m.copy_(approx)
                self.q[idx] = q_sum.clone()
        return _Decoded([work], decode, early=False)

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Error feedback and Q factors by parameter name (empty when no lossy codec ran)."""
        if not self.residual and not self.q:
            return {}
        return {"residual": {self.names[i]: t.detach().clone() for i, t in self.residual.items()},
                "q": {self.names[i]: t.detach().clone() for i, t in self.q.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        index = {n: i for i, n in enumerate(self.names)}
        self.residual, self.q, self._flat_res = {}, {}, {}
        for key, into in (("residual", self.residual), ("q", self.q)):
            for name, t in (state or {}).get(key, {}).items():
                if name in index:
                    into[index[name]] = t.detach().clone().to(self.params[index[name]].device)


def time_codec(codec: str, numel: int, repeats: int = 5) -> float:
    """Seconds per byte of fp32 gradient to encode and decode with `codec` on this machine, with
    no communication (a one-rank group): the figure `DEFAULT_CODEC_S_PER_BYTE` holds."""
    from caramel.plan.plan import Bucket
    from caramel.runtime.dispatch import LocalGroup
    side = max(2, int(numel ** 0.5))
    p = torch.nn.Parameter(torch.randn(side, side))
    fb = FlatBucket(Bucket(0, [0], "float32", p.numel(), p.numel() * 4), [p], 1)
    comp = Compressor([p], ["w"], 1)
    fb.flat[:fb.numel].copy_(torch.randn(fb.numel))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for c in range(fb.spec.num_chunks):
            work, _ = comp.issue(LocalGroup(), fb, c, codec)
            if work is not None:
                work.wait()
        best = min(best, time.perf_counter() - t0)
    return best / (fb.numel * 4)
