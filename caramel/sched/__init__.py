"""Scheduling beyond one training job, in simulation: many jobs' coflows on a shared fabric
(`caramel.sched.coflow`) and layer placement across edge nodes and the cloud
(`caramel.sched.placement`). Each has exact or classic baselines and an optional policy trained
by reinforcement learning (the `rl` extra: gymnasium and stable-baselines3).
"""
