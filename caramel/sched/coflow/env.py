"""The coflow scheduling environment (gymnasium; needs the `rl` extra).

At every event with two or more released coflows the agent picks which one goes first; the
others follow in the base heuristic's order (weighted SEBF by default), and the candidates it
sees are the first `max_candidates` in that order, so action 0 is the heuristic itself. Events
with fewer than two coflows need no choice and are run through. The reward between two
decisions is minus the integral of the objective's count over that time, in units of the
workload's mean isolated coflow time: for `cct` the number of released, unfinished coflows
(so an episode's return is minus the sum of coflow completion times), for `weighted_jct` the
weights of the arrived, unfinished jobs (minus the weighted sum of job completion times).
The cost before the first choice is added to the first step's reward; a workload that never
needs a choice ends at `reset` (its schedule is the base heuristic's; `run_policy` handles it;
`episode_done` says so), and a step taken anyway (SB3's PPO steps after every reset) ends the
episode at once with that cost as its reward, whatever the action.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from caramel.errors import CaramelError
from caramel.sched.coflow.fabric import FabricSim, Result
from caramel.sched.coflow.heuristics import HEURISTICS
from caramel.sched.coflow.workload import Coflow, TraceOptions, Workload, synthetic_trace

OBJECTIVES = ("cct", "weighted_jct")
NUM_FEATURES = 20


@dataclass(frozen=True)
class EnvOptions:
    objective: str = field(default="cct", metadata={"choices": OBJECTIVES})
    base: str = field(default="weighted_sebf", metadata={"choices": tuple(HEURISTICS)})
    max_candidates: int = 8

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.base not in HEURISTICS:
            raise ValueError(f"base must be one of {', '.join(HEURISTICS)}, got {self.base!r}")
        if self.max_candidates < 2:
            raise ValueError(f"max_candidates must be >= 2, got {self.max_candidates}")


class CoflowEnv(gym.Env):
    """Episodes over seeded synthetic traces (`seeds`, drawn at each reset) or over the workload
    given as `reset(options={"workload": w})`."""

    metadata = {"render_modes": []}

    def __init__(self, trace: TraceOptions, seeds: list[int], options: EnvOptions = EnvOptions()):
        if not seeds:
            raise CaramelError("CoflowEnv needs at least one trace seed")
        self.trace, self.seeds, self.options = trace, list(seeds), options
        k = options.max_candidates
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(k, NUM_FEATURES), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(k)
        self.base_scheduler = HEURISTICS[options.base]
        self._cache: dict[int, Workload] = {}
        self.sim: FabricSim | None = None

    # -- episode --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "workload" in options:
            workload = options["workload"]
        else:
            s = self.seeds[int(self.np_random.integers(len(self.seeds)))]
            if s not in self._cache:
                self._cache[s] = synthetic_trace(self.trace, s)
            workload = self._cache[s]
        self.sim = FabricSim(workload)
        self._setup_scales()
        # FabricSim starts at the first release; jobs that arrived before it were already waiting
        reward = -self._cost(0.0, self.sim.now_s, 0) / self.scale_s + self._run_until_choice()
        self._carry = reward  # cost before the first choice is the first step's (policy-independent)
        return self._observe(), {}

    def step(self, action: int):
        sim = self.sim
        if sim.done:
            # the workload ended at reset (it never needed a choice), yet a vectorized trainer
            # steps after every reset: the action has no effect, the episode ends with the cost
            # run through so far (so its return is still minus the objective)
            reward, self._carry = self._carry, 0.0
            return np.zeros(self.observation_space.shape, np.float32), reward, True, False, {}
        cands = self.candidates()
        a = int(action) if int(action) < len(cands) else 0
        order = [cands[a]] + [c for c in self.base_scheduler(sim) if c != cands[a]]
        reward = self._carry + self._advance(order)
        self._carry = 0.0
        reward += self._run_until_choice()
        done = sim.done
        return (np.zeros(self.observation_space.shape, np.float32) if done else self._observe()), reward, done, False, {}

    @property
    def episode_done(self) -> bool:
        """True when the workload has run to its end (at reset: it never needed a choice)."""
        return self.sim.done

    def result(self) -> Result:
        return Result.of(self.sim)

    # -- dynamics -------------------------------------------------------------------------
    def _advance(self, order: list[int]) -> float:
        """Advance one event; minus the objective's integral over that time, scaled."""
        start, active = self.sim.now_s, len(self.sim.active)
        self.sim.advance(order)
        return -self._cost(start, self.sim.now_s, active) / self.scale_s

    def _cost(self, t0: float, t1: float, active: int) -> float:
        if self.options.objective == "cct":
            return active * (t1 - t0)  # releases happen only at events: the count is constant
        # jobs arrive between events too: each unfinished job counts from max(t0, its arrival)
        sim = self.sim
        return sum(j.weight * max(0.0, t1 - max(t0, j.arrival_s)) for j in sim.workload.jobs
                   if not (sim.finished_s[list(j.coflows)] <= t0).all())

    def _run_until_choice(self) -> float:
        """Advance through events that need no choice; the reward they add."""
        total = 0.0
        while not self.sim.done and len(self.sim.active) < 2:
            total += self._advance(list(self.sim.active))
        return total

    def observe(self, sim: FabricSim) -> np.ndarray:
        """The observation of `sim`'s state (a view of the arrived jobs, say) with the scales of
        its own workload; `sim` becomes the environment's state (for `candidates`). Stepping on
        from it is not meant: the online check drives its own simulation."""
        self.sim = sim
        self._setup_scales()
        return self._observe()

    def _setup_scales(self) -> None:
        """The feature scales: the workload's mean isolated coflow time (every coflow's whole
        bytes, so it reads the same at any state of the workload) and per job its bytes and steps."""
        w = self.sim.workload
        self.scale_s = float(np.mean([_isolated_bottleneck_s(w, c) for c in w.coflows]))
        self._job_bytes = np.array([sum(w.coflows[c].bytes for c in j.coflows) for j in w.jobs])
        self._steps = np.array([1 + max(w.coflows[c].step for c in j.coflows) for j in w.jobs])

    def candidates(self) -> list[int]:
        return self.base_scheduler(self.sim)[:self.options.max_candidates]

    def _observe(self) -> np.ndarray:
        sim, w = self.sim, self.sim.workload
        k = self.options.max_candidates
        obs = np.zeros((k, NUM_FEATURES), np.float32)
        cands = self.candidates()
        byte_scale = w.port_bandwidth_Bps * self.scale_s
        ports = {c: {f.src for f in w.coflows[c].flows} | {f.dst for f in w.coflows[c].flows} for c in sim.active}
        jobs = self._job_features()
        first_key = jobs[w.coflows[cands[0]].job][0] if cands else 1.0
        for i, c in enumerate(cands):
            co = w.coflows[c]
            job = w.jobs[co.job]
            left = float(sim.remaining[c].sum())
            step_left = [x for x in job.coflows if w.coflows[x].step == co.step and np.isnan(sim.finished_s[x])]
            job_left = sum(float(sim.remaining[x].sum()) for x in job.coflows if np.isnan(sim.finished_s[x]))
            share = sum(1 for o in sim.active if o != c and ports[o] & ports[c])
            bott = sim.bottleneck_s(c) / self.scale_s
            obs[i] = [1.0, i / k, np.log1p(bott), left / co.bytes, np.log1p(left / byte_scale), job.weight / 4,
                      np.log1p((sim.now_s - sim.released_s[c]) / self.scale_s), float(len(step_left) == 1),
                      len(step_left) / 10, np.log1p(job_left / byte_scale),
                      (self._steps[co.job] - co.step) / self._steps[co.job], share / k,
                      np.log1p(bott / job.weight), len(sim.active) / k, *self._job_row(jobs[co.job], first_key)]
        return obs

    def _job_features(self) -> dict[int, list[float]]:
        """Per job with an active coflow: its work left at its busiest port over its weight (weighted
        SRJF's key), its critical path left (per unfinished step: the release delay still to come
        and its coflows' bottlenecks), the time since it arrived, its rank by the key, its active
        coflows."""
        sim, w = self.sim, self.sim.workload
        active_jobs: dict[int, int] = {}
        for c in sim.active:
            active_jobs[w.coflows[c].job] = active_jobs.get(w.coflows[c].job, 0) + 1
        out = {}
        for j, n_active in active_jobs.items():
            job = w.jobs[j]
            steps: dict[int, list[int]] = {}
            for c in job.coflows:
                if np.isnan(sim.finished_s[c]):
                    steps.setdefault(w.coflows[c].step, []).append(c)
            path = 0.0
            for cs in steps.values():
                unreleased = [w.coflows[c].delay_s for c in cs if np.isnan(sim.released_s[c])]
                path += max(unreleased, default=0.0) + max(sim.bottleneck_s(c) for c in cs)
            out[j] = [sim.job_bottleneck_s(j) / job.weight, path, sim.now_s - job.arrival_s, 0, n_active]
        for rank, j in enumerate(sorted(out, key=lambda j: out[j][0])):
            out[j][3] = rank
        return out

    def _job_row(self, f: list, first_key: float) -> list[float]:
        k, scale = self.options.max_candidates, self.scale_s
        return [np.log1p(f[0] / scale), np.log1p(f[1] / scale), np.log1p(f[2] / scale), f[3] / k, f[4] / k,
                np.log1p(f[0] / max(first_key, 1e-12))]


def _isolated_bottleneck_s(workload: Workload, coflow: Coflow) -> float:
    """The coflow's whole bytes at its busiest port over the port bandwidth (`FabricSim.bottleneck_s`
    before it has sent anything)."""
    up = np.zeros(workload.num_ports)
    down = np.zeros(workload.num_ports)
    for f in coflow.flows:
        up[f.src] += f.bytes
        down[f.dst] += f.bytes
    return float(max(up.max(), down.max()) / workload.port_bandwidth_Bps)


def run_policy(env: CoflowEnv, workload: Workload, act) -> Result:
    """Run `act(observation) -> action` over the whole workload in `env`; its result."""
    obs, _ = env.reset(options={"workload": workload})
    done = env.sim.done
    while not done:
        obs, _, done, _, _ = env.step(act(obs))
    return env.result()
