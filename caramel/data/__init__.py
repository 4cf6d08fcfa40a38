"""Training data: read from a store (local files, http), cached on each worker, sampled locally;
and the sampler whose per-rank shares of the global batch change with the workers' speed.

`format` writes and reads the sharded sample format; `store` reads it through fsspec URLs;
`cache` keeps the shards a worker read on its local disk within a byte budget, `tiers` a memory
tier in front of it per loader worker (and counts which tier served each sample); `transport`
sends small batches from the workers by pipe rather than shared memory; `sampler`
orders each rank's samples so cached shards are read first while every sample is still read
once per epoch; `loader` puts them on torchdata's `StatefulDataLoader`; `io_model` predicts
the data-bound step time the simulator reports; `serve` is a small throttled http server for
tests and benchmarks; `share_sampler` cuts each global batch into per-rank shares
(`balance="batch"`).
"""
