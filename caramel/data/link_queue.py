"""The store's link as a FIFO queue: the waits the I/O model charges a read, with the arrivals' spread.

The plain loader's workers each read one sample after another: a think time (the store's latency
and the read's own time on the cores) and then a turn on the link, whose service is a sample's
bytes at the rate, fixed. `closed_loop` is the mean value analysis of that loop. Its arrival
theorem (an arrival finds the queue of the loop with one client fewer) is exact for exponential
service; with fixed service how long an arrival waits depends on how irregular the arrivals are:
arrivals as regular as the service (every think time the same) never meet a queue below the
link's limit, Poisson-like ones meet the mean value analysis's. So the wait is scaled as the
Allen-Cunneen (Kingman) approximation scales a G/G/1 queue's wait from the M/G/1 one's:

    W(G/G/1) = W(M/G/1) x (ca2 + cs2) / (1 + cs2),   W(M/G/1) = rho S (1 + cs2) / (2 (1 - rho))

(Pollaczek-Khinchine; cs2 the service's squared coefficient of variation: 0 gives M/D/1, 1 M/M/1;
ca2 the arrivals'). On the link cs2 = 0, so the loop's wait is ca2 times the fixed-service wait
(the reads queued before the arrival and half the one in service); ca2 = 1 is the loop as it was
charged before spreads were measured, ca2 = 0 the loop's asymptotic bound (no queue).

`arrival_scv` takes the arrivals' SCV from the SCV of one read's think time (`think_scv`: the
latency, fixed; the read under load, its measured mean and SCV; and, once every q reads, the
batch's local work, a think time longer one read in q), at most 1. A heuristic, not a derived
queue: in a loop of few clients the arrivals at the link are the clients' returns from thinking,
one read at a time, while the loop's clients are batches of q reads (whose think time's SCV is
about 1/q of a read's). The cap at 1 is a choice: think times more irregular than exponential
ones are charged the loop's own queue, the one before spreads were measured (the BCMP
insensitivity of a think station holds under exponential service, not the link's fixed one, so
it only motivates it); the spread only ever takes queue away.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from caramel.errors import CaramelError


@dataclass(frozen=True)
class LoopState:
    """The closed loop with `clients` workers: batches per second, batches at the link (queued and
    in service) and the time one spends there."""

    clients: int
    throughput_per_s: float
    queued: float
    response_s: float


def _check_scv(name: str, scv: float) -> None:
    if not 0 <= scv < math.inf:
        raise CaramelError(f"{name} (a squared coefficient of variation) must be >= 0 and finite, got {scv}")


def gg1_wait_s(arrival_rate_per_s: float, service_s: float, arrival_scv: float = 1.0,
               service_scv: float = 1.0) -> float:
    """Mean wait before service in an open single-server FIFO queue: Pollaczek-Khinchine for
    Poisson arrivals (`arrival_scv` 1), scaled by (ca2 + cs2) / (1 + cs2) otherwise (Allen-Cunneen).
    Infinite at or past the server's limit."""
    _check_scv("arrival_scv", arrival_scv)
    _check_scv("service_scv", service_scv)
    if not (arrival_rate_per_s >= 0 and service_s > 0) or math.isinf(arrival_rate_per_s):
        raise CaramelError(f"a queue needs an arrival rate >= 0 per s and a service time > 0 s, "
                           f"got {arrival_rate_per_s}, {service_s}")
    rho = arrival_rate_per_s * service_s
    if rho >= 1:
        return math.inf
    mg1_s = rho * service_s * (1 + service_scv) / (2 * (1 - rho))
    return mg1_s * (arrival_scv + service_scv) / (1 + service_scv)


def closed_loop(clients: int, think_s: float, demand_s: float, arrival_scv: float = 1.0) -> LoopState:
    """Mean value analysis of `clients` workers, each thinking `think_s` per batch and then holding
    the FIFO link for `demand_s` (fixed service: a Poisson-like arrival waits for the batches queued
    before it and half the one in service). Where the link's own limit 1 / demand binds, the batches
    not thinking are at the link: clients - X x think (Little's law over the whole loop), the queue
    the next client arrives to, not X times the uncapped response.

    `arrival_scv` scales only the last arrival's wait (module docstring): it meets the queue of the
    loop charged without spreads (clients - 1 of them), and waits `arrival_scv` times that loop's
    wait. Scaling inside the recursion instead would shrink the queue each arrival meets as well,
    and the reductions would multiply: far less wait than ca2 x the old one at high load."""
    if clients < 1 or demand_s <= 0 or think_s < 0:
        raise CaramelError(f"a closed loop needs clients >= 1, demand_s > 0 and think_s >= 0, "
                           f"got {clients}, {demand_s}, {think_s}")
    _check_scv("arrival_scv", arrival_scv)
    state = LoopState(0, 0.0, 0.0, 0.0)
    for n in range(1, clients + 1):
        # the loop as charged without spreads up to clients - 1; the last step scaled by the spread
        scv = arrival_scv if n == clients else 1.0
        busy = state.throughput_per_s * demand_s
        # scv x (queued less busy) + scv x busy / 2: with scv 1 the very floats of 1 + a + b (golden test)
        response_s = demand_s * (1.0 + scv * max(state.queued - busy, 0.0) + scv * busy / 2)
        # the fixed-service residual can overstate what the link serves; it never exceeds 1 / demand
        throughput = min(n / (think_s + response_s), 1.0 / demand_s)
        response_s = n / throughput - think_s  # the response the capped throughput leaves: larger when capped
        state = LoopState(n, throughput, throughput * response_s, response_s)
    return state


def arrival_scv(latency_s: float, read_mean_s: float, read_scv: float, reads_per_batch: int,
                local_s: float) -> float:
    """The arrivals' SCV the loop charges: `think_scv`, at most 1 (module docstring)."""
    return min(think_scv(latency_s, read_mean_s, read_scv, reads_per_batch, local_s), 1.0)


def think_scv(latency_s: float, read_mean_s: float, read_scv: float, reads_per_batch: int,
              local_s: float) -> float:
    """The SCV of one read's think time: latency (fixed) + a read of mean `read_mean_s` and SCV
    `read_scv`, plus the batch's `local_s` once every `reads_per_batch` reads. 1.0 (the loop as
    charged without spreads) when the think time is 0."""
    _check_scv("read_scv", read_scv)
    if reads_per_batch < 1 or not all(0 <= t < math.inf for t in (latency_s, read_mean_s, local_s)):
        raise CaramelError(f"a read's think time needs reads_per_batch >= 1 and times >= 0 s, got "
                           f"{reads_per_batch}, {latency_s}, {read_mean_s}, {local_s}")
    share = 1.0 / reads_per_batch  # the reads whose think time carries the batch's local work
    mean_s = latency_s + read_mean_s + share * local_s
    if mean_s <= 0:
        return 1.0
    variance = read_scv * read_mean_s ** 2 + local_s ** 2 * share * (1 - share)
    return variance / mean_s ** 2
