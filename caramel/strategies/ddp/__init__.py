"""The `ddp` strategy: torch's DistributedDataParallel itself, the reference every other strategy meets."""
