"""The simulator: predict step time and a timeline from a profile, a cluster spec and a plan.

    from caramel.sim import simulate, lower_bound
    result = simulate(profile, cluster, plan, overlap="forward", iterations=4)
    result.step_time_s, result.exposed_comm_s, result.trace  # Trace(source="predicted")

See docs/simulator.md for the model, its assumptions and its validation.
"""
from caramel.sim.bounds import LowerBound, lower_bound
from caramel.sim.collectives import COLLECTIVE_MODELS, CommModel, closed_form_s, message_level_s
from caramel.sim.network import Flow, Network, max_min_rates, simulate_flows
from caramel.sim.simulate import SimResult, simulate

__all__ = [
    "simulate", "SimResult", "lower_bound", "LowerBound", "CommModel", "COLLECTIVE_MODELS",
    "closed_form_s", "message_level_s", "Flow", "Network", "max_min_rates", "simulate_flows",
]
