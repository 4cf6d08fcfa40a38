"""The `gossip` strategy's knobs: topology, algorithm, personalized parameters, metrics.

    caramel.parallelize(model, opt, strategy="gossip:topology=exponential,algorithm=momentum")
    caramel.parallelize(model, opt, "gossip", personalize="head")      # DePRL: the head stays local

`personalize` names module/parameter prefixes joined by `+` (`head+norm_f`): a spec's options
are already separated by commas. `topology` is a built-in name, a JSON file holding a mixing
matrix (a list of rows, one per worker) or, from Python, the matrix itself as a list of rows
(`W.tolist()` of a tensor); a matrix is checked when the world size is known.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from caramel.errors import CaramelError

TOPOLOGIES = ("ring", "torus", "exponential", "one_peer_exponential", "complete")
ALGORITHMS = ("dpsgd", "momentum", "adam")


@dataclass(frozen=True)
class GossipOptions:
    """`topology`: who mixes with whom (`caramel.strategies.gossip.topology`). `algorithm`:
    "dpsgd" (parameters exchanged after the step, each module's mix applied just before its next
    forward), "momentum" (the same, plus the optimizer's first-moment buffers, Balu et al.),
    "adam" (Wang et al.'s overlapped form: the parameters a step's gradient is computed at are
    exchanged during its forward and backward and mixed just before the next update; takes
    Adam or AdamW). `personalize`: parameters under these name prefixes are never sent (DePRL).
    `consensus_every`: every N steps all workers measure their consensus distance (an
    all-reduce of the exchanged parameters; 0 = never). `bucket_cap_mb`: the exchange is cut
    into messages of about this size, in forward order, so the first modules can mix first."""

    topology: str | list = "ring"
    algorithm: str = field(default="dpsgd", metadata={"choices": ALGORITHMS})
    personalize: str = ""
    consensus_every: int = 10
    bucket_cap_mb: float = 4.0

    def __post_init__(self) -> None:
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
        for prefix in self.local_prefixes():
            if not prefix or " " in prefix:
                raise CaramelError(f"personalize must be name prefixes joined by '+' (e.g. head+norm_f), "
                                   f"got {self.personalize!r}")

    def local_prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.personalize.split("+")) if self.personalize.strip() else ()

    def is_local(self, name: str) -> bool:
        """Whether the parameter `name` stays on its worker (matches a prefix at a dot boundary)."""
        return any(name == p or name.startswith(p + ".") for p in self.local_prefixes())
