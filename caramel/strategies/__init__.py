"""Strategies: the ways Caramel keeps workers' models in step, one registry, one folder each.

    caramel.parallelize(model, optimizer, strategy="caramel", overlap="forward")
    caramel.parallelize(model, optimizer, strategy="ddp:bucket_cap_mb=50")

Each strategy's folder holds its options dataclass, its planner(s), its runtime and its
simulator model side by side. `STRATEGIES.register(StrategyInfo(...))` adds one.
"""
from caramel.strategies.caramel.options import CaramelOptions
from caramel.strategies.ddp.options import DdpOptions
from caramel.strategies.gossip.options import GossipOptions
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.ps.options import PsOptions
from caramel.strategies.registry import Registry, StrategyInfo, StrategySpec

STRATEGIES = Registry()
STRATEGIES.register(StrategyInfo(
    "caramel", options=CaramelOptions,
    parallelize="caramel.strategies.caramel.parallelize:parallelize_caramel",
    simulate="caramel.strategies.caramel.simulate:simulate_caramel",
    summary="all-reduce with window-aware buckets, chunks and order; updates applied in the next forward",
    records_trace=True))
STRATEGIES.register(StrategyInfo(
    "ddp", options=DdpOptions,
    parallelize="caramel.strategies.ddp.runtime:parallelize_ddp",
    simulate="caramel.strategies.ddp.simulate:simulate_ddp",
    summary="torch DistributedDataParallel itself, optionally with prioritized communication threads"))
STRATEGIES.register(StrategyInfo(
    "pipeline", options=PipelineOptions,
    parallelize="caramel.strategies.pipeline.runtime:parallelize_pipeline",
    simulate="caramel.strategies.pipeline.simulate:simulate_pipeline",
    summary="stages across workers (GPipe, 1F1B, interleaved, async PipeDream), PipeDream's partitioner, hybrid"))
STRATEGIES.register(StrategyInfo(
    "ps", options=PsOptions,
    parallelize="caramel.strategies.ps.parallelize:parallelize_ps",
    simulate="caramel.strategies.ps.simulate:simulate_ps",
    summary="parameter servers colocated with the workers, TicTac-ordered pulls, bsp/ssp/asp",
    records_trace=True))
STRATEGIES.register(StrategyInfo(
    "gossip", options=GossipOptions,
    parallelize="caramel.strategies.gossip.parallelize:parallelize_gossip",
    simulate="caramel.strategies.gossip.simulate:simulate_gossip",
    summary="decentralized: parameters mixed with neighbours over a topology, overlapped with the next forward",
    records_trace=True))

__all__ = ["STRATEGIES", "Registry", "StrategyInfo", "StrategySpec"]
