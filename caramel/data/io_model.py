"""How long a step waits for its data: an analytical model of loading from a shared store.

Each of `ranks` ranks needs `batch_size` samples of `sample_bytes` per step. A share `hit_rate`
is read locally; the rest comes from the store in requests of `request_bytes` (a whole shard
when shards are cached, one sample for range reads), each waiting `store_latency_s` and costing
`request_overhead_s` of the store's CPU (measured; one store serves every rank, so like the
link of `store_bandwidth_bps` it is shared). `loader_workers` (k) processes per rank fetch in
parallel, so waits and local work divide among them; the link and the store do not. Shard
fetches (and a batch with nothing remote) are charged

    wait_s   = requests * (latency + worker_request_s) / k   (each worker waits for its requests)
    link_s   = max(ranks * remote_bytes * 8 / bandwidth, ranks * requests * overhead)
    remote_s = max(wait_s, link_s) + min(wait_s, link_s) / c,   c = k * ranks requests in flight
    local_s  = (batch * local_s_per_sample + disk reads * disk_s_per_read + batch_overhead_s)
               / min(k, cores per rank)
    data_s   = remote_s + local_s

A worker reads its batch's samples one after another (torch's DataLoader: one batch per worker),
so besides the latency each read's own time on this machine's cores (`worker_request_s`: the
client's and the server's work and their waits for a core, measured under the training load by
the data bench right before each round, or given to `caramel simulate --data-read-under-load`;
0 when not measured) stretches that worker's sequence; it divides among the workers, as the
latency does, since other workers' reads proceed meanwhile.
With one request in flight (c = 1) a request's wait and its transfer add up; with c in flight
the link moves one request's bytes while the others wait, so the shorter phase hides behind the
longer one but for 1/c of it.

Range reads (`request_bytes` None) are charged as the closed loop they are: the ranks' N = k x
ranks workers each read their batch's q samples one after another, each read a think time Z =
latency + `worker_request_s` (the read's own time on the cores) and then a turn on the store, a
FIFO link that serves a request in D = max(sample bytes x 8 / bandwidth, request_overhead_s)
(fixed: no exponential service); after its q reads a worker does the batch's local work (the
local_s work of the cores' share of its rank: x k / min(k, cores)). Mean value analysis gives the
loop's throughput X(n) for n = 1..N workers, with each arrival waiting for the requests queued
before it and half the one in service (the residual of a fixed service time):

    R(n) = q D (1 + Q(n-1) - U(n-1) + U(n-1) / 2),  X(n) = n / (Z_batch + R(n)),
    Q(n) = X(n) R(n),  U(n) = X(n) q D,  Z_batch = q (latency + worker_request_s) + local work
    data_s = ranks / X(N)    (X never above 1 / (q D): the link's own limit)

Where that limit binds, R(n) is what the capped throughput leaves, n / X(n) - Z_batch, so the queue
carried to the next worker is every batch not thinking, n - X(n) Z_batch (`closed_loop`).

The wait in R(n) (all but the first q D) is that of arrivals as irregular as Poisson ones; given
the reads' SCV (`worker_request_scv`, with `worker_request_s` their mean: the data bench passes
them only when asked, as fresh runs did not support it as the default, docs/data.md, "The knee's
queue") it is scaled by the arrivals' SCV ca2, a read's think time's (latency + read, the batch's
local work once in q reads; at most 1): R(n) = q D (1 + ca2 (Q - U + U / 2)), Q and U those of the
loop without spreads at n - 1, the Allen-Cunneen scaling of a fixed-service queue's wait, used as
a heuristic (`caramel.data.link_queue`): reads as regular as the service meet no queue below the
link's limit, ca2 = 1 is the charge without spreads (None: unmeasured, as before).

One worker (N = 1) is its serial sum, q (latency + read + D) + local work; many workers saturate
the link, ranks x q x D. Between the two, near N* = (Z_batch + q D) / (q D), the loop neither
fills the link nor leaves it idle: there the 200 Mbit/s, batch 16 bench (32 reads per step, 1
ms latency) is bound by the workers' read sequences and the 100 Mbit/s, batch 8 one (16 reads, 2
ms) by the link, which the max + min / c charge could not both fit (docs/data.md, "The plain
loader's closed loop"). Shard fetches keep the charge above: their think time would need the
worker's work per fetch (checksum, the cache's write), which is not measured.

A shard fetched for only some of its samples (a cache that evicts
it before the rest are read) costs `fetch_amplification` bytes per byte of the missed samples.

The hits come from two tiers: `memory_hit_rate` of the samples from the loader worker's memory
(decode only, `local_s_per_sample`) and the rest of `hit_rate` from the disk cache, where one
read of a whole shard (`disk_s_per_read`: read plus checksum, measured) serves
`samples_per_disk_read` samples. `batch_overhead_s` is each batch's fixed cost (collate, the
trip from the worker to the training process), measured for the transport used.

The epoch's start also restarts the loader's warm workers (a new iterator: each told to begin,
the sampler's order made): `epoch_start_s`, measured as a warm loader's first steps over data in
memory beside the load (the data bench's calibration), less the k batches' memory-tier work the
edge charges already (decode and trip, not a mode's disk reads, which the calibration did not
time), adds to the edge once per epoch (0 unmeasured).

A sampler that reads what is cached first (the locality-aware one) does not spread the misses
over the epoch: its first steps fetch nothing and its last `remote_steps_share` (1 - the byte
hit rate) fetch all the epoch's remote bytes, so the mean step is that share of steps at
data_s(remote bytes / share) and the rest at data_s(0), each against the compute side. A link
that is the bottleneck only in the misses' steps still sets those: the mean of the steps' maxima,
not the maximum of the means.

With workers prefetching the step takes max((compute_s + batch_overhead_s) x contention, data_s)
(the training process receives each batch itself, which no prefetching hides); without
(`loader_workers=0`) the two add. `contention` (>= 1, measured: 1 with cores to spare) is how
much longer that compute side takes while the loader workers prefetch on the same cores than
its parts measured alone (the data bench measures it right before each mode it scores,
`caramel.bench.data_contention`). Data is the bottleneck when data_s exceeds the compute side.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from caramel.data.link_queue import LoopState, arrival_scv, closed_loop, think_scv
from caramel.errors import CaramelError

__all__ = ["DataLoadModel", "LoopState", "closed_loop"]


@dataclass(frozen=True)
class DataLoadModel:
    """The inputs of the model; every name carries its unit."""

    sample_bytes: float
    batch_size: int
    ranks: int
    store_bandwidth_bps: float
    store_latency_s: float = 0.0
    hit_rate: float = 0.0
    request_bytes: float | None = None  # None: one sample per request (range reads)
    loader_workers: int = 2
    local_s_per_sample: float = 0.0
    cores_per_rank: float = 1.0
    request_overhead_s: float = 0.0  # CPU per request, measured on an unshaped link; the store's, shared by all ranks
    memory_hit_rate: float = 0.0  # of all samples, served from the memory tier (part of hit_rate)
    disk_s_per_read: float = 0.0  # one shard read from the disk cache, checksum included
    batch_overhead_s: float = 0.0  # per batch in a worker: collate and the trip to the training process
    samples_per_disk_read: float = 1.0  # samples served by one shard read from the disk cache
    fetch_amplification: float = 1.0  # bytes fetched per byte of the missed samples (a shard fetched for a few of them)
    contention: float = 1.0  # compute side's slowdown beside prefetching workers on shared cores, measured; 1: none
    remote_steps_share: float = 1.0  # of an epoch's steps, those that fetch its remote bytes (1: every step alike)
    worker_request_s: float = 0.0  # each read's time on the cores in its worker's sequence, under load; 0: unmeasured
    epoch_steps: int | None = None  # steps per epoch of a loader that starts each epoch empty; None: no epoch edge
    epoch_start_s: float = 0.0  # a warm loader's epoch start beside the load, data in memory, measured; 0: unmeasured
    worker_request_scv: float | None = None  # the reads' SCV under load (worker_request_s their mean); None: unmeasured

    def __post_init__(self) -> None:
        if not 0.0 <= self.hit_rate <= 1.0:
            raise CaramelError(f"hit_rate must be within [0, 1], got {self.hit_rate}")
        if not 0.0 <= self.memory_hit_rate <= self.hit_rate + 1e-12:
            raise CaramelError(f"memory_hit_rate must be within [0, hit_rate={self.hit_rate}], got {self.memory_hit_rate}")
        if not self.contention >= 1:
            raise CaramelError(f"contention must be >= 1 (1: no slowdown beside the loader workers), got {self.contention}")
        if not 0.0 < self.remote_steps_share <= 1.0:
            raise CaramelError(f"remote_steps_share must be within (0, 1], got {self.remote_steps_share}")
        if self.fetch_amplification < 1:
            raise CaramelError(f"fetch_amplification must be >= 1, got {self.fetch_amplification}")
        if not (0 <= self.disk_s_per_read < math.inf and 0 <= self.batch_overhead_s < math.inf
                and self.samples_per_disk_read >= 1):
            raise CaramelError(f"disk_s_per_read and batch_overhead_s must be >= 0 and samples_per_disk_read >= 1, "
                               f"got {self.disk_s_per_read}, {self.batch_overhead_s}, {self.samples_per_disk_read}")
        if self.sample_bytes <= 0 or self.batch_size < 1 or self.ranks < 1 or self.store_bandwidth_bps <= 0:
            raise CaramelError("sample_bytes, batch_size, ranks and store_bandwidth_bps must be positive, got "
                               f"{self.sample_bytes}, {self.batch_size}, {self.ranks}, {self.store_bandwidth_bps}")
        if not all(0 <= t < math.inf for t in (self.store_latency_s, self.local_s_per_sample, self.worker_request_s)) \
                or self.loader_workers < 0:
            raise CaramelError("store_latency_s, loader_workers, local_s_per_sample and worker_request_s must be >= 0, got "
                               f"{self.store_latency_s}, {self.loader_workers}, {self.local_s_per_sample}, "
                               f"{self.worker_request_s}")
        if self.worker_request_scv is not None and not 0 <= self.worker_request_scv < math.inf:
            raise CaramelError(f"worker_request_scv must be >= 0 (None: the reads' spread unmeasured), "
                               f"got {self.worker_request_scv}")
        if not 0 <= self.epoch_start_s < math.inf:
            raise CaramelError(f"epoch_start_s must be >= 0 seconds (0: unmeasured), got {self.epoch_start_s}")
        if self.epoch_steps is not None and (isinstance(self.epoch_steps, bool) or not isinstance(self.epoch_steps, int)
                                             or self.epoch_steps < 1):
            raise CaramelError(f"epoch_steps must be a whole number of steps >= 1 (None: no epoch edge), got {self.epoch_steps!r}")
        if self.request_bytes is not None and self.request_bytes <= 0:
            raise CaramelError(f"request_bytes must be positive, got {self.request_bytes}")
        if self.request_bytes is not None and self.worker_request_s:
            # measured on range reads only; the bench charges shard fetches nothing (data_report.py)
            raise CaramelError("worker_request_s times one sample's range read; shard fetches (request_bytes "
                               f"{self.request_bytes}) are not charged it, got {self.worker_request_s}")

    def remote_bytes_per_step(self) -> float:
        """Bytes one rank fetches from the store per step."""
        return (1.0 - self.hit_rate) * self.batch_size * self.sample_bytes * self.fetch_amplification

    def data_time_s(self) -> float:
        """Seconds of loading one rank's batch, spread over its loader workers (the epoch's remote
        bytes spread over all its steps)."""
        return self._data_s(self.remote_bytes_per_step())

    def _data_s(self, remote: float) -> float:
        """Seconds of loading one rank's batch of which `remote` bytes come from the store."""
        if self.request_bytes is None and remote > 0:
            return self._range_reads_s(remote)
        k = max(self.loader_workers, 1)
        per_request = self.request_bytes or self.sample_bytes
        requests = remote / per_request if remote > 0 else 0.0
        wait_s = requests * (self.store_latency_s + self.worker_request_s) / k
        link_s = max(self.ranks * remote * 8.0 / self.store_bandwidth_bps, self.ranks * requests * self.request_overhead_s)
        remote_s = max(wait_s, link_s) + min(wait_s, link_s) / (k * self.ranks)
        return remote_s + self._local_work_s() / self._local_cores()

    def _local_work_s(self) -> float:
        """One batch's work on the rank's cores: decode, disk reads of shards not in memory, the trip."""
        disk_reads = max(self.hit_rate - self.memory_hit_rate, 0.0) * self.batch_size / self.samples_per_disk_read
        return self.batch_size * self.local_s_per_sample + disk_reads * self.disk_s_per_read + self.batch_overhead_s

    def _local_cores(self) -> float:
        return max(min(max(self.loader_workers, 1), self.cores_per_rank), 1.0)

    def _range_reads_s(self, remote: float) -> float:
        """The step's loading period of the ranks' workers reading `remote` bytes each per batch
        by range reads: mean value analysis of the closed loop (module docstring)."""
        k = max(self.loader_workers, 1)
        reads = math.ceil(remote / self.sample_bytes - 1e-9)
        service_s = max(remote * 8.0 / (reads * self.store_bandwidth_bps), self.request_overhead_s)
        demand_s = reads * service_s  # one batch's time on the store's link
        think_s = reads * (self.store_latency_s + self.worker_request_s) + self._worker_local_s()
        scv = self._read_think_scv(remote, capped=True)
        return self.ranks / closed_loop(self.ranks * k, think_s, demand_s, 1.0 if scv is None else scv).throughput_per_s

    def _worker_local_s(self) -> float:
        """One worker's batch of local work: the rank's cores shared by its k workers."""
        return self._local_work_s() * max(self.loader_workers, 1) / self._local_cores()

    def _read_think_scv(self, remote: float, capped: bool) -> float | None:
        """`link_queue.arrival_scv` (`capped`) or `think_scv` of range reads of `remote` bytes a
        batch; None where no spread is charged (unmeasured, shard fetches, nothing remote)."""
        if self.worker_request_scv is None or self.request_bytes is not None or remote <= 0:
            return None
        reads = math.ceil(remote / self.sample_bytes - 1e-9)
        return (arrival_scv if capped else think_scv)(self.store_latency_s, self.worker_request_s,
                                                      self.worker_request_scv, reads, self._worker_local_s())

    def link_arrival_scv(self, capped: bool = True) -> float | None:
        """The arrivals' SCV the link's queue is charged on the steps that read from the store (or,
        `capped` False, the reads' think time's before the cap at 1): the very number the period
        uses, for reports. None where the queue is charged as without spreads."""
        remote = self.remote_bytes_per_step()
        if self.remote_steps_share < 1.0:
            remote /= self.remote_steps_share  # as step_time_s: the misses' steps fetch the epoch's bytes
        return self._read_think_scv(remote, capped)

    def step_time_s(self, compute_s: float) -> float:
        """The mean step time with this data path: prefetched when there are workers, serial
        otherwise; with `remote_steps_share` s < 1, the mean of s of the steps fetching all the
        epoch's remote bytes and 1 - s fetching none; plus the epoch's edge over `epoch_steps`."""
        remote = self.remote_bytes_per_step()
        if self.remote_steps_share >= 1.0 or remote <= 0:
            last_data_s = first_data_s = self.data_time_s()
            step_s = self._step_s(compute_s, last_data_s)
        else:
            s = self.remote_steps_share
            last_data_s = self._data_s(remote / s)  # the misses' steps end the epoch
            first_data_s = self._data_s(0.0)  # the hits' steps start it
            step_s = s * self._step_s(compute_s, last_data_s) + (1 - s) * self._step_s(compute_s, first_data_s)
        return step_s + self.epoch_edge_s(compute_s, last_data_s, first_data_s) / (self.epoch_steps or 1)

    def epoch_edge_s(self, compute_s: float, data_s: float | None = None, first_data_s: float | None = None) -> float:
        """Seconds an epoch that starts its loader empty adds once (0 without `epoch_steps` or
        workers), k x: the compute side when its last steps (data period `data_s`) are data-bound,
        their last k batches' compute sides following one another; else the data period of its
        first steps (`first_data_s`, the same by default), the first batch waiting for a whole
        worker's batch. With the data period the same at both ends: k x min(data, compute side).
        Plus the restart's own part (`restart_s`): a measured `epoch_start_s` beyond the k batches
        from memory that this charges for it already."""
        if not self.epoch_steps or self.loader_workers <= 0:
            return 0.0
        data_s = self.data_time_s() if data_s is None else data_s
        first_data_s = data_s if first_data_s is None else first_data_s
        compute_side_s = self.compute_side_s(compute_s)
        return self.loader_workers * (compute_side_s if data_s > compute_side_s else first_data_s) + self.restart_s()

    def restart_s(self) -> float:
        """What restarting the workers adds to an epoch's start besides its first batches: the
        measured start of a warm loader over data in memory (`epoch_start_s`, the calibration's
        restart) less the k batches from memory it waited for, which `epoch_edge_s` charges
        itself. Only the memory tier's work is taken away (decode and the batch's trip, no disk
        read), as that is what the calibration timed; a mode's disk reads stay in the edge's
        first batches. The plain loader's calibration serves samples decoded in advance, so for
        it the decode taken away was not timed (k batches' decode: 0.3 ms an epoch in the data
        bench's runs). 0 when unmeasured."""
        from_memory_s = (self.batch_size * self.local_s_per_sample + self.batch_overhead_s) / self._local_cores()
        return max(self.epoch_start_s - self.loader_workers * from_memory_s, 0.0)

    def _step_s(self, compute_s: float, data_s: float) -> float:
        return max(self.compute_side_s(compute_s), data_s) if self.loader_workers > 0 else compute_s + data_s

    def compute_side_s(self, compute_s: float) -> float:
        """The prefetched step's side that no worker hides: compute, all-reduce and the batch's
        receipt, stretched by the measured contention for the cores."""
        return (compute_s + self.batch_overhead_s) * self.contention

    def bottleneck(self, compute_s: float) -> str:
        return "data" if self.data_time_s() > self.compute_side_s(compute_s) else "compute+comm"

    def describe(self) -> dict[str, Any]:
        return dict(asdict(self), data_time_s=self.data_time_s(), remote_bytes_per_step=self.remote_bytes_per_step())
