"""The `gossip` strategy's knobs: topology, algorithm, personalized parameters, metrics.

    caramel.parallelize(model, opt, strategy="gossip:topology=exponential,algorithm=momentum")
    caramel.parallelize(model, opt, "gossip", personalize="head")      # DePRL: the head stays local

`personalize` names module/parameter prefixes joined by `+` (`head+norm_f`): a spec's options
are already separated by commas. `topology` is a built-in name, a JSON file holding a mixing
matrix (a list of rows, one per worker) or, from Python, the matrix itself: a 2-D tensor or numpy
array, or a list of rows; it is kept as a list of rows and checked (square for the world size,
non-negative, doubly stochastic, connected) when the world size is known.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from caramel.errors import CaramelError
from caramel.strategies.gossip.moments import CROSS_TERMS, SECOND_MOMENTS
from caramel.strategies.gossip.volume import MIXES_MOMENTS, TRACKS

TOPOLOGIES = ("ring", "torus", "exponential", "one_peer_exponential", "complete")
ALGORITHMS = ("dpsgd", "momentum", "overlap", "overlap_momentum", "adam", "tracking", "tracking_momentum")
# the overlapped form (Lian et al.'s D-PSGD; Wang et al.'s for Adam): the mix waits for the next update
MIX_AT_UPDATE = ("overlap", "overlap_momentum", "adam")
# where each worker's Adam steps with its own gradient, so the debiased second moment applies
DEBIASES = ("dpsgd", "overlap", "adam")


@dataclass(frozen=True)
class GossipOptions:
    """`topology`: who mixes with whom (`caramel.strategies.gossip.topology`). `algorithm`:
    "dpsgd" (parameters exchanged after the step, each module's mix applied just before its next
    forward), "momentum" (the same, plus the optimizer's first-moment buffers, Balu et al.),
    "overlap" (the overlapped form, Lian et al.'s D-PSGD: the parameters a step's gradient is
    computed at are exchanged during its forward and backward and mixed just before the next
    update, x(k+1) = W x(k) - lr d(k); any torch.optim optimizer), "adam" (the same, checked
    to be Adam or AdamW: Wang et al.'s decentralized Adam), "overlap_momentum" (overlap, with the
    optimizer's moment buffers sent with the parameters and mixed by the same weights at the
    next update: SGD's momentum, Adam's exp_avg and exp_avg_sq; three times the parameters'
    bytes under Adam), "tracking" (gradient tracking,
    `tracking.py`: each worker's optimizer steps with a mixed estimate of the workers' average
    gradient; any torch.optim optimizer; twice dpsgd's bytes), "tracking_momentum" (tracking,
    plus the moment buffers mixed as "momentum" mixes them). `personalize`: parameters under
    these name prefixes are never sent (DePRL).
    `consensus_every`: every N steps all workers measure their consensus distance (an
    all-reduce of the exchanged parameters; 0 = never). `bucket_cap_mb`: the exchange is cut
    into messages of about this size, in forward order, so the first modules can mix first.
    `head_steps`: DePRL's tau: with `personalize`, each cycle is `head_steps` optimizer steps
    that update only the personalized parameters (the body frozen, nothing sent) and then one
    that updates only the body and gossips it; 0 (the default): head and body step together.
    `overlap_trackers` (tracking): each tracker message leaves from the gradient hooks as soon as
    its parameters' gradients are final in backward, and step() waits for it only before the
    update (`tracking.py`); false: every tracker is formed and sent at step() (the reference
    path, which also allows editing the gradients between backward and step(), e.g. clipping).
    `tracker_bucket_cap_mb`: the size of one tracker message when overlapped (smaller lets the
    last modules' trackers leave earlier in backward; default 1). Both are errors under an
    algorithm without trackers. `second_moment` (Adam, AdamW): "own" (the optimizer's own second
    moment of this worker's gradient) or "debiased" (`moments.py`: an estimate, from each
    worker's own gradients, of the second moment of the workers' average gradient, DDP's; no
    bytes added; with algorithm=dpsgd, overlap and adam). `cross_term` (with debiased): where the
    estimate of the squared mean gradient comes from: "first_moment" (this step's gradient times
    Adam's first moment of the steps before) or "halves" (the two halves of this step's batch, one
    backward each: unbiased at the same step; `caramel train` splits the batch, a user's loop
    calls backward twice per step)."""

    topology: str | list | torch.Tensor | np.ndarray = "ring"
    algorithm: str = field(default="dpsgd", metadata={"choices": ALGORITHMS})
    personalize: str = ""
    consensus_every: int = 10
    bucket_cap_mb: float = 4.0
    head_steps: int = 0
    overlap_trackers: bool | None = None  # None: true under the tracking algorithms
    tracker_bucket_cap_mb: float | None = None  # None: 1 MB under the tracking algorithms
    second_moment: str = field(default="own", metadata={"choices": SECOND_MOMENTS})
    cross_term: str = field(default="first_moment", metadata={"choices": CROSS_TERMS})

    def __post_init__(self) -> None:
        if isinstance(self.topology, (torch.Tensor, np.ndarray)):
            # kept as a list of rows: options compare, print and travel (JSON, the spec name) as plain data
            object.__setattr__(self, "topology", matrix_rows(self.topology))
        if isinstance(self.topology, list):
            if not self.topology or not all(isinstance(row, list) for row in self.topology):
                raise CaramelError(f"topology given as a matrix must be a list of rows (lists of weights), "
                                   f"got {self.topology!r}")
        elif self.topology not in TOPOLOGIES and not self.topology.endswith(".json"):
            raise CaramelError(f"topology must be one of {', '.join(TOPOLOGIES)} or a mixing-matrix file NAME.json, "
                               f"got {self.topology!r}")
        if self.consensus_every < 0:
            raise CaramelError(f"consensus_every must be >= 0 steps (0: never measure), got {self.consensus_every}")
        if not self.bucket_cap_mb > 0:
            raise CaramelError(f"bucket_cap_mb must be > 0, got {self.bucket_cap_mb}")
        if self.tracker_bucket_cap_mb is not None and not self.tracker_bucket_cap_mb > 0:
            raise CaramelError(f"tracker_bucket_cap_mb must be > 0, got {self.tracker_bucket_cap_mb}")
        if self.overlap_trackers is not None and not isinstance(self.overlap_trackers, bool):
            raise CaramelError(f"overlap_trackers must be true or false, got {self.overlap_trackers!r}")
        if isinstance(self.head_steps, bool) or not isinstance(self.head_steps, int) or self.head_steps < 0:
            raise CaramelError(f"head_steps must be an integer >= 0 (DePRL's tau; 0: head and body step together), "
                               f"got {self.head_steps!r}")
        if self.head_steps and not self.local_prefixes():
            raise CaramelError(f"head_steps={self.head_steps} steps a personalized head: name it with personalize= "
                               "(e.g. personalize=head)")
        if self.algorithm not in ALGORITHMS:
            raise CaramelError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.second_moment not in SECOND_MOMENTS:
            raise CaramelError(f"second_moment must be one of {', '.join(SECOND_MOMENTS)}, got {self.second_moment!r}")
        if self.cross_term not in CROSS_TERMS:
            raise CaramelError(f"cross_term must be one of {', '.join(CROSS_TERMS)}, got {self.cross_term!r}")
        if self.cross_term != "first_moment" and not self.debiases:
            raise CaramelError(f"cross_term={self.cross_term} sets the cross term of the debiased second moment; "
                               f"it needs second_moment=debiased (got second_moment={self.second_moment})")
        if self.debiases and self.algorithm not in DEBIASES:
            raise CaramelError(f"second_moment=debiased is built for algorithm={', '.join(DEBIASES)}, where each worker's "
                               f"Adam steps with its own gradient; algorithm={self.algorithm} "
                               + ("steps with a tracker, whose second moment is not its own gradient's"
                                  if self.tracks else "mixes exp_avg_sq, which this sets"))
        if self.debiases and self.head_steps:
            raise CaramelError("second_moment=debiased sets the second moment at every step; head_steps leaves the "
                               "body out of the head-only steps (use one or the other)")
        for key in ("overlap_trackers", "tracker_bucket_cap_mb"):
            if getattr(self, key) is not None and not self.tracks:
                raise CaramelError(f"{key} sets the trackers' exchange of algorithm=tracking and tracking_momentum; "
                                   f"algorithm={self.algorithm} has no trackers (remove {key})")
        if self.head_steps and self.tracks:
            raise CaramelError(f"head_steps is built for algorithm=dpsgd and momentum; algorithm={self.algorithm} corrects "
                               "its tracker with every step's body gradient, which a head-only step sets aside")
        if self.head_steps and self.mixes_at_update:
            raise CaramelError(f"head_steps is built for algorithm=dpsgd and momentum; algorithm={self.algorithm} mixes "
                               "at the next update, which a head-only step would move")
        for prefix in self.local_prefixes():
            if not prefix or " " in prefix:
                raise CaramelError(f"personalize must be name prefixes joined by '+' (e.g. head+norm_f), "
                                   f"got {self.personalize!r}")

    @property
    def tracks(self) -> bool:
        """Whether each worker's optimizer steps with a gradient tracker (`tracking.py`)."""
        return self.algorithm in TRACKS

    @property
    def debiases(self) -> bool:
        """Whether each worker's Adam steps with the debiased second moment (`moments.py`)."""
        return self.second_moment == "debiased"

    @property
    def halves(self) -> bool:
        """Whether each step's gradient comes in two half-batch backward passes (`cross_term=halves`)."""
        return self.cross_term == "halves"

    @property
    def mixes_at_update(self) -> bool:
        """Whether a step's mix is applied just before the next update (not in the next forward):
        the exchange then overlaps the next forward and backward."""
        return self.algorithm in MIX_AT_UPDATE

    @property
    def overlaps_trackers(self) -> bool:
        """Whether the trackers leave from the gradient hooks (`overlap_trackers`, default true)."""
        return self.tracks and self.overlap_trackers is not False

    @property
    def tracker_cap_mb(self) -> float:
        """One overlapped tracker message's size (`tracker_bucket_cap_mb`, default 1 MB)."""
        return 1.0 if self.tracker_bucket_cap_mb is None else self.tracker_bucket_cap_mb

    @property
    def mixes_moments(self) -> bool:
        """Whether the optimizer's moment buffers are gossiped with the parameters."""
        return self.algorithm in MIXES_MOMENTS

    def local_prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.personalize.split("+")) if self.personalize.strip() else ()

    def is_local(self, name: str) -> bool:
        """Whether the parameter `name` stays on its worker (matches a prefix at a dot boundary)."""
        return any(name == p or name.startswith(p + ".") for p in self.local_prefixes())


def matrix_rows(W: torch.Tensor | np.ndarray) -> list:
    """A 2-D tensor or array of weights as a list of rows of floats (a clear error otherwise)."""
    what = "tensor" if isinstance(W, torch.Tensor) else "array"
    if W.ndim != 2:
        raise CaramelError(f"topology given as a {what} must be a 2-D mixing matrix (one row per worker), "
                           f"got shape {tuple(W.shape)}")
    if isinstance(W, torch.Tensor):
        if W.is_complex() or not (W.is_floating_point() or W.dtype in (torch.int32, torch.int64, torch.uint8)):
            raise CaramelError(f"topology given as a tensor must hold real weights, got dtype {W.dtype}")
        return W.detach().to("cpu", torch.float64).tolist()
    if not np.issubdtype(W.dtype, np.floating) and not np.issubdtype(W.dtype, np.integer):
        raise CaramelError(f"topology given as an array must hold real weights, got dtype {W.dtype}")
    return W.astype(np.float64).tolist()
