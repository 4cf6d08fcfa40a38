"""`ClusterConfig`: what an emulated cluster should look like, checked before anything is created.

Every field is validated in `ClusterConfig.validate()` so that bad input (a rate like `fast`,
0 workers, a malformed prefix) raises a `CaramelError` naming the field before the host is
touched. Rates may be given as numbers (bits per second) or in tc syntax (`1gbit`).
"""
from __future__ import annotations

import math
import numbers
import os
import re
import secrets
from dataclasses import dataclass

from caramel.errors import CaramelError
from caramel.units import parse_duration_arg_s, parse_rate_bps

# Interface names are limited to 15 characters (IFNAMSIZ - 1); prefix (9) + "br"/"h123" fits.
PREFIX_RE = re.compile(r"crm[0-9a-f]{6}")
MAX_WORKERS = 250  # one /24 per cluster, .1 .. .250
FALLBACKS = ("local", "error")
JUMBO_MTU = 9000  # the jumbo frames cloud VPCs offer; auto never goes below it
MIN_MTU, MAX_MTU = 576, 65535  # IPv4's minimum datagram; the largest MTU a veth takes
BURST_S = 0.001  # the token bucket holds 1 ms of traffic (see ClusterConfig.burst_for)
DEFAULT_STATE_DIRS = ("/run/caramel", "/tmp/caramel")
MAX_LATENCY_S = 10.0  # above this a latency is a typo (a unit lost), not a link


def auto_mtu(bandwidth_bps: float) -> int:
    """The MTU `mtu="auto"` picks for links of `bandwidth_bps`: the largest frame that fits the
    token bucket's 1 ms of traffic, from 9000 bytes (at or below ~72 Mbit/s) up to 65535 (at or
    above ~524 Mbit/s).

    The emulation's per-packet kernel work (tbf, two veths and the bridge) runs on the cores the
    workers compute on, where a real host hands its NIC 64 KB TSO packets and spends nothing on
    shaping; larger frames cut that work (docs/cluster.md, "MTU"). A frame larger than 1 ms of
    traffic would force a larger bucket, through which small messages cross faster than the
    link, so the frame stops growing there.
    """
    assert bandwidth_bps > 0
    return int(min(MAX_MTU, max(JUMBO_MTU, bandwidth_bps / 8 * BURST_S - 14)))


def parse_mtu(mtu: int | str, bandwidth_bps: float) -> int:
    """`mtu` in bytes: an integer (or its digits) from 576 to 65535, or `"auto"` (`auto_mtu`)."""
    if isinstance(mtu, str) and mtu.strip() == "auto":
        return auto_mtu(bandwidth_bps)
    if isinstance(mtu, str) and mtu.strip().isdigit():
        mtu = int(mtu)
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not MIN_MTU <= mtu <= MAX_MTU:
        raise CaramelError(f"mtu must be 'auto' or an integer number of bytes from {MIN_MTU} to {MAX_MTU}, got {mtu!r}")
    return mtu


def parse_latency_s(latency: float | str) -> float:
    """`ClusterConfig.latency_s` in seconds: a number of seconds, or text with its unit (`2ms`,
    `50us`, `0.001s`; `parse_duration_arg_s`), so that `"2"` meant as milliseconds is refused
    rather than read as 2 s, as on the command line. Zero, negative, non-finite and over
    MAX_LATENCY_S: 0, refused, refused, refused."""
    if isinstance(latency, str):
        value = parse_duration_arg_s(latency, "latency_s")
    elif isinstance(latency, numbers.Real) and not isinstance(latency, bool):
        value = float(latency)
        if not math.isfinite(value) or value < 0:
            raise CaramelError(f"latency_s must be a finite number of seconds >= 0, got {latency!r}")
    else:
        raise CaramelError(f"latency_s must be a number of seconds or a duration with its unit such as '2ms', "
                           f"got {type(latency).__name__} {latency!r}")
    if value > MAX_LATENCY_S:
        raise CaramelError(f"latency_s {latency!r} is {value:g} s, not a plausible link latency; "
                           f"expected at most {MAX_LATENCY_S:g} s, e.g. 1ms or 50us")
    return value + 0.0  # -0.0 reads as 0.0


def new_prefix() -> str:
    """A fresh cluster name prefix `crm<6 hex>`; random so two clusters on one host never collide."""
    return "crm" + secrets.token_hex(3)


def default_state_dir() -> str:
    """Where per-cluster state files live: $CARAMEL_CLUSTER_STATE_DIR, else /run/caramel, else /tmp/caramel."""
    env = os.environ.get("CARAMEL_CLUSTER_STATE_DIR")
    if env:
        return env
    for d in DEFAULT_STATE_DIRS:
        parent = os.path.dirname(d)
        if (os.path.isdir(d) and os.access(d, os.W_OK)) or (not os.path.exists(d) and os.access(parent, os.W_OK)):
            return d
    return DEFAULT_STATE_DIRS[-1]


@dataclass
class ClusterConfig:
    """An emulated cluster: `workers` network namespaces on a bridge, each link shaped to `bandwidth_bps`.

    - `bandwidth_bps`: per-worker link rate in bits/s, in each direction (number or `"1gbit"`).
    - `latency_s`: one-way added delay, a number of seconds or text with its unit (`"2ms"`; a bare
      `"2"` is refused, `parse_latency_s`); emulated with netem only when the kernel has it,
      otherwise reported as not emulated (the real veth latency is tens of microseconds).
    - `prefix`: `crm<6 hex>`; random when None.
    - `fallback`: `"local"` runs plain local workers on loopback (torchrun --standalone) when
      namespaces cannot be made (not root, no iproute2); `"error"` raises instead.
    - `state_dir`: where the state file that records what this cluster created is kept.
    - `burst_bytes`: token-bucket burst; None picks max(one frame, 8 KiB, 1 ms of traffic at the rate).
    - `mtu`: link MTU in bytes, or `"auto"` (the default): `auto_mtu(bandwidth_bps)`, the largest
      frame within the bucket's 1 ms of traffic, 9000 to 65535 bytes. The kernel's per-packet
      work for every emulated link runs on the host's own cores, where a real cluster spends it
      on other machines and NICs, so small frames slow the compute beside a transfer
      (docs/results/cluster.md, "MTU"). A cluster that `set_bandwidth` will slow later
      should take the MTU of its slowest rate (`mtu=auto_mtu(slowest_bps)`), or its bucket grows
      past 1 ms there.
    """

    workers: int
    bandwidth_bps: float | str = "1gbit"
    latency_s: float | str = 0.0
    prefix: str | None = None
    fallback: str = "local"
    state_dir: str | None = None
    burst_bytes: int | None = None
    mtu: int | str = "auto"
    quiet: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Normalize and check every field; raise CaramelError naming the first bad one."""
        if isinstance(self.workers, bool) or not isinstance(self.workers, int):
            try:
                as_int = int(str(self.workers))
            except ValueError:
                raise CaramelError(f"workers must be a positive integer, got {self.workers!r}") from None
            self.workers = as_int
        if not 1 <= self.workers <= MAX_WORKERS:
            raise CaramelError(f"workers must be between 1 and {MAX_WORKERS}, got {self.workers}")
        self.bandwidth_bps = parse_rate_bps(self.bandwidth_bps)
        if self.bandwidth_bps < 8e3:
            raise CaramelError(f"bandwidth {self.bandwidth_bps:g} bit/s is too low to shape with tc; expected at least 8kbit")
        self.latency_s = parse_latency_s(self.latency_s)
        if self.prefix is None:
            self.prefix = new_prefix()
        elif not isinstance(self.prefix, str) or not PREFIX_RE.fullmatch(self.prefix):
            raise CaramelError(f"cluster prefix {self.prefix!r} is not valid; expected 'crm' and 6 lowercase hex digits, e.g. crm1a2b3c")
        if self.fallback not in FALLBACKS:
            raise CaramelError(f"fallback {self.fallback!r} is not known; expected one of {', '.join(FALLBACKS)}")
        if self.state_dir is None:
            self.state_dir = default_state_dir()
        self.mtu = parse_mtu(self.mtu, self.bandwidth_bps)
        if self.burst_bytes is not None:
            if isinstance(self.burst_bytes, bool) or not isinstance(self.burst_bytes, int) or self.burst_bytes < self.packet_bytes:
                raise CaramelError(f"burst_bytes must be an integer of at least {self.packet_bytes} (one packet at mtu "
                                   f"{self.mtu}), got {self.burst_bytes!r}")

    # Derived names. The bridge and host-side veths live in the host namespace; the worker-side
    # veth is created directly inside the worker's namespace and never appears on the host.
    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def netns(self, worker: int) -> str:
        return f"{self.prefix}-w{worker}"

    def host_veth(self, worker: int) -> str:
        return f"{self.prefix}h{worker}"

    def worker_veth(self, worker: int) -> str:
        return f"{self.prefix}n{worker}"

    @property
    def packet_bytes(self) -> int:
        """One full-size frame on the wire: the MTU plus the Ethernet header."""
        return self.mtu + 14

    def burst_for(self, bandwidth_bps: float) -> int:
        """tbf bucket size: 1 ms of traffic, at least one full-size frame and 8 KiB.

        The bucket lets a message up to its size pass at line rate, so a big bucket makes small
        messages look faster than the link (a 64 KiB bucket is 6.5 ms at 80 Mbit/s); tbf splits
        larger GSO packets into MTU-sized ones itself, which is why the MTU sets the CPU cost.
        """
        if self.burst_bytes is not None:
            return self.burst_bytes
        # not more: a message that fits in the bucket crosses at line rate, which the probe's
        # fit (and a simulator calibrated by it) would read as a faster link
        return int(max(self.packet_bytes, 8 * 1024, bandwidth_bps / 8 * BURST_S))


def check_rate(bandwidth_bps: float | str, what: str = "bandwidth") -> float:
    """Parse a rate for set_bandwidth() with the same rules as ClusterConfig."""
    bps = parse_rate_bps(bandwidth_bps)
    if not math.isfinite(bps) or bps < 8e3:
        raise CaramelError(f"{what} {bandwidth_bps!r} is too low to shape with tc; expected at least 8kbit")
    return bps
