"""Edge-cloud layer placement (docs/rl-scheduling.md): the problem and its cost (`problem`),
seeded instances (`instances`), the exact integer program and brute force (`ilp`), greedy
heuristics (`heuristics`). The gymnasium environment (`env`) needs the `rl` extra and is
imported from its module, never from here.
"""
from caramel.sched.placement.heuristics import HEURISTICS, PlacementState
from caramel.sched.placement.ilp import Solution, brute_force, solve_ilp
from caramel.sched.placement.instances import InstanceOptions, random_instance
from caramel.sched.placement.problem import Instance, Task

__all__ = ["HEURISTICS", "PlacementState", "Solution", "brute_force", "solve_ilp", "InstanceOptions",
           "random_instance", "Instance", "Task"]
