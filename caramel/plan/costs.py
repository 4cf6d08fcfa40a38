"""Cost rules shared by the runtime, the planner and the simulator.

A collective issued while the link still drains the previous one spends its fixed cost behind
that transfer; the engine's bandwidth inference, the planner's estimates and the simulator's
replay must agree on that rule, so it lives here, below all three.
"""
from __future__ import annotations


def hidden_transfer_s(issue_s: float, link_free_s: float, prev_transfer_s: float) -> float | None:
    """How much of the previous collective's transfer a collective issued at `issue_s` can spend
    its fixed cost behind: what is left of it when the link frees at `link_free_s`, at most the
    whole transfer; None when the link is already idle (the simulator, the planner and the
    engine's bandwidth inference share this rule)."""
    return min(prev_transfer_s, link_free_s - issue_s) if issue_s < link_free_s else None


def fixed_cost_s(latency_s: float, queued_latency_s: float, after_transfer_s: float | None) -> float:
    """A collective's fixed cost: `latency_s` on an idle link (`after_transfer_s` None), else that
    less the transfer it hides behind, at least `queued_latency_s` (`CommModel`, `ClusterSpec`)."""
    if after_transfer_s is None:
        return latency_s
    return max(queued_latency_s, latency_s - after_transfer_s)
