"""Coflow scheduling of many training jobs on one non-blocking switch (docs/rl-scheduling.md).

A job's communication is a DAG of coflows: each step's buckets (one all-reduce across the job's
workers each) wait on the previous step. `workload` builds the DAGs from Caramel plans,
`fabric` simulates them under a priority order, `heuristics` gives FIFO, SCF, SEBF and weighted
SEBF. The gymnasium environment (`env`), the PPO policy (`policy`) and its decoders (`decode`;
`online` for those that decide on the arrived jobs only) need the `rl` extra and are imported
from their modules, never from here.
"""
from caramel.sched.coflow.fabric import Result, simulate
from caramel.sched.coflow.heuristics import HEURISTICS
from caramel.sched.coflow.workload import Coflow, Flow, Job, TraceOptions, Workload, job_from_plan, synthetic_trace

__all__ = ["Coflow", "Flow", "Job", "TraceOptions", "Workload", "job_from_plan", "synthetic_trace",
           "Result", "simulate", "HEURISTICS"]
