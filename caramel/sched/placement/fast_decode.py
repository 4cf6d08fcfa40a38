"""The placement policy decoded without torch: the trained network's weights exported to numpy
once, its forward pass as a few float32 array operations per step.

`decode.decode` (the reference, kept as is) runs the network through stable-baselines3 at every
step: tensor conversion, the encoder, the head, a torch `Categorical`, each op dispatched by
torch on tensors of 4 rows; most of its time per step is that dispatch, not arithmetic
(docs/results/rl-scheduling-history.md, "Decoding: where the time went").
`NumpyPolicy` holds the same weights as numpy arrays and computes the same function (embedding
MLP, two-head self-attention with the padding mask, mix layer, row scores plus the prior's lean,
masked rows, softmax) in float32. It is the same network, not a copy trained apart, but its
float32 sums run in a different order than torch's kernels, so the probabilities agree to about
1e-7, not bit for bit (tested within 1e-6): a decision could differ only where two rows' scores
tie to that precision. `decode_fast` steps `BatchPlacement` as `decode` does, takes the same
argmax for rollout 0 and draws the others with the same seeded torch generator from the numpy
probabilities, so for a seed it makes the same placements as `decode` (tested on small and large
instances, and checked on every held-out instance by the experiment, `--check-reference`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from caramel.errors import CaramelError
from caramel.sched.placement.batch import BatchPlacement
from caramel.sched.placement.decode import Decoded, Decoding, best_of
from caramel.sched.placement.problem import Instance
from caramel.sched.rl import MASKED_LOGIT


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32, copy=True)


@dataclass(frozen=True)
class NumpyPolicy:
    """The actor of a trained `caramel.sched.rl.CandidatePolicy` as numpy arrays (float32).
    Linear weights are stored transposed, (in, out), so each layer is `x @ w + b`."""

    embed1_w: np.ndarray
    embed1_b: np.ndarray
    embed2_w: np.ndarray
    embed2_b: np.ndarray
    qkv_w: np.ndarray  # (d, 3d): the attention's packed q, k, v projection
    qkv_b: np.ndarray
    out_w: np.ndarray
    out_b: np.ndarray
    mix_w: np.ndarray  # (2d, d): [row, attended context] -> row
    mix_b: np.ndarray
    score_w: np.ndarray  # (d,)
    score_b: np.float32
    lean: np.ndarray  # (K,): prior * (1 - row / K)
    heads: int

    @classmethod
    def from_policy(cls, policy) -> "NumpyPolicy":
        """Export once (a trained policy's weights do not change while it decodes)."""
        enc, head = policy.features_extractor, policy.action_net
        attend = enc.attend
        if not attend._qkv_same_embed_dim or attend.in_proj_bias is None or attend.dropout != 0.0:
            raise CaramelError("NumpyPolicy expects the CandidateEncoder's attention: packed q/k/v with bias, "
                               "no dropout")
        with torch.no_grad():
            lean = (head.prior * head.lean).to(torch.float32)  # the same float32 product torch adds
            return cls(_f32(enc.embed[0].weight.T), _f32(enc.embed[0].bias), _f32(enc.embed[2].weight.T),
                       _f32(enc.embed[2].bias), _f32(attend.in_proj_weight.T), _f32(attend.in_proj_bias),
                       _f32(attend.out_proj.weight.T), _f32(attend.out_proj.bias), _f32(enc.mix[0].weight.T),
                       _f32(enc.mix[0].bias), _f32(head.score.weight[0]), np.float32(head.score.bias.item()),
                       _f32(lean), int(attend.num_heads))

    def probabilities(self, observations: np.ndarray) -> np.ndarray:
        """(N, K) probabilities of the rows of (N, K, F) observations; masked rows exactly 0."""
        x = np.asarray(observations, dtype=np.float32)
        n, k, _ = x.shape
        d = self.embed2_b.shape[0]
        hd = d // self.heads
        valid = x[..., 0] > 0.5
        pad = ~valid
        pad[pad.all(axis=1)] = False  # no candidate at all: attend anyway, as the encoder does
        # the per-row layers as one (N*K, .) matrix product each (batched 3-D products cost more)
        h = np.tanh(np.tanh(x.reshape(n * k, -1) @ self.embed1_w + self.embed1_b) @ self.embed2_w + self.embed2_b)
        qkv = (h @ self.qkv_w + self.qkv_b).reshape(n, k, 3, self.heads, hd).transpose(2, 0, 3, 1, 4)
        q, kk, v = qkv[0], qkv[1], qkv[2]  # (N, H, K, hd)
        att = (q * np.float32(1.0 / np.sqrt(hd))) @ kk.transpose(0, 1, 3, 2)  # (N, H, K, K)
        att = np.where(pad[:, None, None, :], np.float32(-np.inf), att)
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        ctx = (att @ v).transpose(0, 2, 1, 3).reshape(n * k, d) @ self.out_w + self.out_b
        h = np.tanh(np.concatenate([h, ctx], axis=-1) @ self.mix_w + self.mix_b)
        logits = (h @ self.score_w).reshape(n, k) + self.score_b + self.lean
        logits = np.where(valid, logits, np.float32(MASKED_LOGIT))
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


def decode_fast(inst: Instance, policy: NumpyPolicy, decoding: Decoding, seed: int = 0) -> Decoded:
    """`decode.decode` with the network's forward pass in numpy (`NumpyPolicy.from_policy`)."""
    if not isinstance(decoding, Decoding):
        raise CaramelError(f"decoding must be a Decoding (parse_decoding('sample:16')), got {decoding!r}")
    if not isinstance(policy, NumpyPolicy):
        raise CaramelError(f"policy must be a NumpyPolicy (NumpyPolicy.from_policy(model.policy)), got {policy!r}")
    gen = torch.Generator().manual_seed(int(seed))
    rollouts = BatchPlacement(inst, decoding.samples)
    while not rollouts.done:
        probs = policy.probabilities(rollouts.observe())
        actions = np.argmax(probs, axis=1)  # the first most probable row, as torch's argmax
        if decoding.samples > 1:
            # the reference's draw, from the same generator: the same rows for the same probabilities
            actions[1:] = torch.multinomial(torch.from_numpy(probs[1:]), 1, generator=gen).squeeze(1).numpy()
        rollouts.step(actions)
    return best_of(inst, rollouts)
