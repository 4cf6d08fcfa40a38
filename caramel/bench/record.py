"""A bench report's row: one configuration x strategy, and what a row alone gives (its ceiling, its label)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from caramel.bench.labels import config_label, heterogeneity_suffix, layout_suffix
from caramel.bench.matrix import REGIMES
from caramel.bench.step_metrics import estimated_ceiling_s

# the label helpers moved to the torch-free `caramel.bench.labels`; importers of this module keep them
__all__ = ["Record", "ceiling_s", "ceiling_speedup", "config_label", "heterogeneity_suffix", "layout_suffix"]


@dataclass
class Record:
    """One configuration x strategy: the row of every report."""

    model: str
    workers: int
    bandwidth: str | None
    """the link rate the job ran at (derived from target_ratio, or pinned); None: unshaped loopback"""
    strategy: str
    step_time_median_s: float | None
    step_time_p90_s: float | None
    step_time_mean_s: float | None
    compute_s: float
    comm_s: float
    exposed_comm_s: float | None
    reference: str | None
    """the stronger DDP variant of this configuration (lower median), that `speedup` is against"""
    reference_step_s: float | None
    speedup: float | None
    """T_reference / T, same job, interleaved"""
    efficiency: float | None
    comm_compute_ratio: float
    """measured: the comm-only over the compute-only baseline of the same job"""
    regime: str
    """measured: compute-bound, balanced or comm-bound"""
    intended_regime: str
    """the point's regime, from its target ratio (custom for a pinned rate)"""
    batch_size: int | None
    model_options: dict[str, Any]
    network: str
    steps: int
    grad_bytes: int | None
    target_ratio: float | None = None
    """the comm/compute the point is defined by (None: a pinned rate or loopback)"""
    rate_source: str | None = None
    """derived (from target_ratio at run start), pinned (given), or None (loopback)"""
    calibrated_compute_s: float | None = None
    """the compute step measured at run start that the rate was derived from"""
    lower_bound_s: float | None = None
    concurrent_s: float | None = None
    """the concurrent baseline's median: perfect overlap as this host runs it"""
    share_captured: float | None = None
    """(T_reference - T) / (T_reference - ceiling); None without a ceiling, or when the reference is at it"""
    speedup_ci95: tuple[float, float] | None = None
    """95% interval of speedup from the per-round paired ratios (None: fewer than 3 rounds, or the reference row)"""
    round_medians_s: list[float] | None = None
    """per round, the row's job step (its median; its mean under step_basis "mean"): any two rows of a
    configuration pair by round (`caramel.stats.paired_rounds_interval`)"""
    step_basis: str = "median"
    """what T is, that speedup, share, E and the prediction error take: "median" of the steps, or
    "mean" (total block time / steps) for a runner whose block times its drain on the last step
    (ps asp, `caramel.bench.blocks`), whose median is the compute step by construction"""
    engine_wait_per_step_s: float | None = None
    """caramel strategies: the engine's own time blocked on communication per step (rank 0, all steps)"""
    load_average: float | None = None
    """the host's 1-minute load average when the configuration's rounds ended"""
    overlap_trial: dict[str, Any] | None = None
    """caramel with overlap="auto": the trial's step period per candidate schedule (slowest rank) and the one chosen"""
    delegated_to_ddp: bool = False
    """caramel: the trial kept DDP's schedule and torch DDP ran it from then on (the engine's timeline stops there)"""
    plan: dict[str, Any] | None = None
    """caramel: the plan the engine ran last (`Engine.stats_dict()["plan"]`)"""
    comm_priority: dict[str, Any] | None = None
    """the CPU priority its communication threads ran at (`CommPriority.to_dict()`); None: the job's own group"""
    baseline_priority: dict[str, Any] | None = None
    """the priority the comm-only and concurrent baselines' communication threads ran at"""
    timeline: dict[str, float] | None = None
    """with --trace: mean per-step compute_s, comm_s, hidden_comm_s, exposed_comm_s, wait_s from the timeline"""
    skipped: str | None = None
    samples_per_s: float | None = None
    """the global batch (local batch x workers, the same for every strategy) over the median step"""
    share_counts: list[int] | None = None
    """caramel with balance="batch": the per-rank shares of the global batch in force at the end"""
    dropout_fractions: list[float] | None = None
    """caramel with balance="dropout": each rank's fraction of units dropped at the end"""
    dropout_changes: list[dict[str, Any]] | None = None
    """caramel with balance="dropout": every change of the fractions, at the balancer's step (warm-up included)"""
    slow_worker: dict[str, Any] | None = None
    """--slow-worker: the slowed rank, its factor and the calibrated delay (`caramel.bench.straggler`)"""
    slow_link: list | None = None
    """--slow-link: `[rank, factor]` (`caramel.bench.hetero`; caramel.bench/3)"""
    jitter: list | None = None
    """--jitter: `[rank, fraction, seed]` (`caramel.bench.hetero`; caramel.bench/3)"""
    predicted_step_s: float | None = None
    """the strategy's simulator model on the profile and achieved link rate (`caramel.bench.prediction`)"""
    prediction_error: float | None = None
    """predicted / measured median - 1"""
    prediction_exact: bool | None = None
    """whether the strategy trains DDP's parameters (only those are recommended)"""
    prediction_note: str | None = None
    """why there is no prediction"""
    prediction_cluster: str | None = None
    """which of `prediction_inputs`' clusters the prediction ran on ("base", "jitter"; caramel.bench/3)"""
    prediction_ignores: list[str] | None = None
    """the configuration's heterogeneity (slow_link, jitter, slow_worker) the strategy's simulator
    does not take: the prediction is marked, not counted toward the accuracy
    (`caramel.bench.hetero_prediction`)"""
    prediction_inputs: dict[str, Any] | None = None
    """what a replay of the job's predictions needs beyond the profile (in the file's meta
    `prediction_inputs`, keyed by `config_label`, with the profile): each rank's compute-only
    median, the heterogeneity and the ClusterSpecs the predictions ran on (`clusters`, and
    `clusters_rate_only` for `predicted_rate_only_s`, caramel.bench/3)"""
    predicted_rate_only_s: float | None = None
    """the same model from the link rate alone: no probed fixed costs per collective (the spec's
    defaults), no CPU contention"""
    link_fit: dict[str, Any] | None = None
    """the fixed costs per collective the job's probe fitted (`caramel.bench.prediction.link_costs`)"""
    compute_slowdown: float | None = None
    """how much slower compute ran beside the collectives in the concurrent baseline, slowest rank
    (`caramel.bench.contention`); the predictions' ClusterSpec carries it"""
    ps: dict[str, Any] | None = None
    """ps: TicTac's measured E and S (medians over the same steps; runs before
    `beyond_U_over_L_median` kept the last step's S), (m - U) / L, the most staleness a step saw,
    the shards' byte imbalance (max/mean) and the plan's predicted E of its order
    (`PsRun.stats_dict()`, rank 0); `caramel.strategies.ps.tictac.e_reading` says when E means something"""
    tuning: dict[str, Any] | None = None
    """a strategy with a tuned option (`ddp:bucket_cap_mb=tuned`): its screening in the job, every
    value's median, the one chosen and the runner-up's gap (`caramel.bench.screening.Screening`)"""
    wire_bytes_per_sample: float | None = None
    """bytes all workers transmitted per training sample, measured on their interfaces (`caramel.bench.wire`;
    None on shared loopback)"""
    pipeline: dict[str, Any] | None = None
    """pipeline: the cut it ran (`boundaries`), its microbatches, the measured bubble (mean and per
    stage or, with unequal replicas, per rank), each rank's measured compute per step
    (`busy_s_per_stage`, median) and the partitioner's stage times (`predicted_busy_s_per_stage`:
    at the speeds it planned at, for replicas="auto" the replicas' all-reduce included), from
    `PipelineRunner.stats()` (rank 0); `predicted_plan`, the prediction's layout and its
    simulated compute per position (`busy_s_per_lane`; `timed_busy_s_per_lane`, as the
    runtime's stage timer counts it: `PipelineSim.timed_s`)"""
    nproc_per_node: int = 1
    """ranks per emulated host (`BenchConfig.nproc_per_node`): `workers` ranks on workers / this hosts"""

    @property
    def step_s(self) -> float | None:
        """T: the step the row's derived figures take (`step_basis`)."""
        return self.step_time_mean_s if self.step_basis == "mean" else self.step_time_median_s

    @property
    def kind(self) -> str:
        return self.strategy.partition(":")[0]

    @property
    def point_regime(self) -> str:
        """The regime the summary counts the row in: the point's own, else the measured one."""
        return self.intended_regime if self.intended_regime in REGIMES else self.regime


def ceiling_s(r: Record) -> float | None:
    """The estimated best step any schedule could reach on this host (`caramel.bench.step_metrics`), or None
    without the concurrent baseline and the bound."""
    return estimated_ceiling_s(r.lower_bound_s, r.concurrent_s, r.compute_s, r.comm_s)


def ceiling_speedup(r: Record) -> float | None:
    """The reference's step over the estimated ceiling: the most a schedule could be expected to gain here."""
    c = ceiling_s(r)
    if c is None or r.reference_step_s is None:
        return None
    return r.reference_step_s / c
