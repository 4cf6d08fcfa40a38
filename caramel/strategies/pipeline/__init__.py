"""The `pipeline` strategy: a model split into stages across workers (GPipe, 1F1B, interleaved
1F1B on `torch.distributed.pipelining`), asynchronous PipeDream with weight stashing, PipeDream's
partitioner and hybrid data x pipeline parallelism."""
