"""`EmulatedCluster`: a multi-node cluster on one Linux host, for benchmarks on a shaped network.

Layout for a cluster with prefix `crm1a2b3c` and N workers:

    host namespace:  bridge crm1a2b3cbr  <-  veth crm1a2b3ch<i> (tbf: traffic *to* worker i)
    namespace crm1a2b3c-w<i>:  lo up, veth crm1a2b3cn<i> 198.18.x.<i+1>/24 (tbf: traffic *from* worker i)

Each worker's link is shaped in both directions. Latency is added with netem only when the
kernel has it (probed in a scratch namespace); otherwise it is reported as not emulated.
Everything created is first written to a state file (see `state.py`), and removed on `close()`:
normal exit of the `with` block, exceptions, SIGINT, SIGTERM and interpreter exit (atexit).
Without root or iproute2, `fallback="local"` gives plain local workers on loopback instead.

    with EmulatedCluster(ClusterConfig(workers=2, bandwidth_bps="100mbit")) as cluster:
        rc = cluster.run(["python", "train.py"])
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Any, TextIO

from caramel.cluster import netns
from caramel.cluster.config import ClusterConfig, check_rate
from caramel.cluster.launch import NodeProcess, supervise, torchrun_target
from caramel.cluster.state import ClusterState, StateStore
from caramel.errors import CaramelError
from caramel.units import format_rate

BASE_MASTER_PORT = 29500
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class EmulatedCluster:
    """A context manager that builds the cluster on entry and removes exactly what it built on exit."""

    def __init__(self, config: ClusterConfig | None = None, **options: Any):
        if config is None:
            config = ClusterConfig(**options)
        elif options:
            raise CaramelError("pass either a ClusterConfig or keyword options, not both")
        self.config = config
        self.mode: str | None = None  # "netns" or "local", decided by start()
        self.fallback_reason = ""
        self.state: ClusterState | None = None
        self.netem_available: bool | None = None
        self.bandwidth_bps: list[float] = [float(config.bandwidth_bps)] * config.workers
        self.receive_buffer_cap_bytes: int | None = None  # set in every namespace; None: not set (see info())
        self._store = StateStore(config.state_dir)
        self._lock = threading.Lock()
        self._closing = False
        self._closed = False
        self._pending_signal: int | None = None
        self._prev_handlers: dict[int, Any] = {}
        self._runs = 0
        self._cap_warned = False

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> "EmulatedCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> "EmulatedCluster":
        """Create the namespaces, bridge, veths and shaping (or choose the local fallback)."""
        if self.mode is not None:
            raise CaramelError(f"cluster {self.config.prefix} was already started")
        sup = netns.support()
        if not sup.ok:
            if self.config.fallback == "error":
                raise CaramelError(f"cannot build an emulated cluster: {sup.reason}; run as root with iproute2 installed, or use fallback 'local'")
            self.mode = "local"
            self.fallback_reason = sup.reason
            if not self.config.quiet:
                print(f"caramel cluster: {sup.reason}; falling back to {self.config.workers} plain local workers on "
                      "loopback (torchrun --standalone), without bandwidth shaping", file=sys.stderr)
            return self
        self.mode = "netns"
        self._install_signal_handlers()
        atexit.register(self.close)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def _record(self, kind: str, name: str) -> None:
        """Write an object to the state file *before* creating it, so no crash can orphan it."""
        if self._closed or self._closing:
            raise netns.ClusterError(f"cluster {self.config.prefix} was torn down (signal) while it was being built")
        assert self.state is not None
        self.state.resources.append({"kind": kind, "name": name})
        self._store.save(self.state)

    def _setup(self) -> None:
        cfg = self.config
        self.state = self._store.claim(cfg.prefix, cfg.workers, float(cfg.bandwidth_bps),
                                       netns.host_subnets_in_use(), netns.SUBNETS_PER_BENCH_NET)
        if cfg.latency_s > 0:
            self.netem_available = self._probe_netem()
            if not self.netem_available and not cfg.quiet:
                print(f"caramel cluster: netem is not available on this kernel; latency {cfg.latency_s * 1e3:g} ms is "
                      "not emulated (links are shaped for bandwidth only)", file=sys.stderr)
        self._record("link", cfg.bridge)
        netns.sh(["ip", "link", "add", cfg.bridge, "type", "bridge"])
        netns.sh(["ip", "link", "set", cfg.bridge, "up"])
        for i in range(cfg.workers):
            ns, host_dev, ns_dev = cfg.netns(i), cfg.host_veth(i), cfg.worker_veth(i)
            self._record("netns", ns)
            netns.sh(["ip", "netns", "add", ns])
            netns.sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._record("link", host_dev)
            netns.sh(["ip", "link", "add", host_dev, "type", "veth", "peer", "name", ns_dev, "netns", ns])
            netns.sh(["ip", "link", "set", host_dev, "mtu", str(cfg.mtu)])
            netns.sh(["ip", "-n", ns, "link", "set", ns_dev, "mtu", str(cfg.mtu)])
            netns.sh(["ip", "link", "set", host_dev, "master", cfg.bridge])
            netns.sh(["ip", "link", "set", host_dev, "up"])
            netns.sh(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", ns_dev])
            netns.sh(["ip", "-n", ns, "link", "set", ns_dev, "up"])
            self._shape(i, self.bandwidth_bps[i])
            # `ip netns exec` bind-mounts /etc/netns/<ns>/hosts over /etc/hosts: workers can
            # resolve each other by name, and c10d's reverse lookups of peers succeed quietly.
            self._record("etc", ns)
            netns.write_etc_hosts(ns, self._hosts_text(i))
        self._cap_receive_buffers(self._receive_buffer_cap_for(self.bandwidth_bps))

    def _hosts_text(self, worker: int) -> str:
        # Namespaces share the host's hostname (no UTS namespace); inside worker i it resolves to
        # worker i's address, as on a real machine (c10d rendezvous checks whether it is the host).
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost", f"{self.address(worker)}\t{socket.gethostname()}"]
        for i in range(self.config.workers):
            # c10d listens on a dual-stack socket, so peers also appear as v4-mapped IPv6 addresses.
            lines += [f"{self.address(i)}\t{self.config.netns(i)}", f"::ffff:{self.address(i)}\t{self.config.netns(i)}"]
        return "\n".join(lines) + "\n"

    def _probe_netem(self) -> bool:
        scratch = f"{self.config.prefix}-probe"
        self._record("netns", scratch)
        netns.sh(["ip", "netns", "add", scratch])
        try:
            ok = netns.sh(["tc", "-n", scratch, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False).returncode == 0
        finally:
            netns.sh(["ip", "netns", "del", scratch], check=False)
        return ok

    def _shape(self, worker: int, bandwidth_bps: float) -> None:
        cfg = self.config
        burst = cfg.burst_for(bandwidth_bps)
        use_netem = bool(self.netem_available) and cfg.latency_s > 0
        netns.shape(cfg.host_veth(worker), None, bandwidth_bps, burst, cfg.latency_s, use_netem)
        netns.shape(cfg.worker_veth(worker), cfg.netns(worker), bandwidth_bps, burst, cfg.latency_s, use_netem)

    def _receive_buffer_cap_for(self, rates_bps: list[float]) -> int:
        # A flow crosses its sender's and its receiver's shaper: every worker's buffers are sized
        # for the slowest link, so no queue on any path overflows.
        return netns.receive_buffer_cap_bytes(min(rates_bps), self.config.mtu)

    def _cap_receive_buffers(self, cap: int) -> None:
        # Best effort: where the kernel will not take it, the links still work and may drop (one
        # warning, and info() says so).
        if cap == self.receive_buffer_cap_bytes:
            return
        if all(netns.cap_receive_buffer(self.config.netns(i), cap) for i in range(self.config.workers)):
            self.receive_buffer_cap_bytes = cap
            return
        if not self._cap_warned:
            self._cap_warned = True
            if not self.config.quiet:
                print("caramel cluster: cannot cap TCP receive buffers in the namespaces (read-only /proc/sys, or a kernel "
                      "before 4.15); at low rates the shaper may drop packets, and collectives stall on their recovery",
                      file=sys.stderr)
        self.receive_buffer_cap_bytes = None

    def close(self) -> None:
        """Remove everything this cluster created (idempotent; safe from signal handlers and atexit)."""
        with self._lock:
            if self._closed or self._closing:
                return
            self._closing = True
        try:
            if self.mode == "netns" and self.state is not None:
                problems = netns.destroy(self.state.resources)
                if problems:
                    print(f"caramel cluster: could not remove {'; '.join(problems)}; state kept in "
                          f"{self._store.path(self.config.prefix)} for `caramel cluster cleanup`", file=sys.stderr)
                else:
                    self._store.remove(self.config.prefix)
        finally:
            self._closed = True
            self._closing = False
            self._restore_signal_handlers()
            atexit.unregister(self.close)
        if self._pending_signal is not None:
            signum, self._pending_signal = self._pending_signal, None
            self._redeliver(signum, None)

    # ----------------------------------------------------------------- signals
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal only works there; atexit and __exit__ still clean up
        for sig in _HANDLED_SIGNALS:
            self._prev_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in list(self._prev_handlers.items()):
            # Only undo our own handler; if someone installed another since, leave theirs in place.
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._closing:
            self._pending_signal = signum  # finish the teardown in progress, then act on it
            return
        self.close()
        self._redeliver(signum, frame)

    def _redeliver(self, signum: int, frame: Any) -> None:
        prev = self._prev_handlers.get(signum, signal.SIG_DFL)
        if callable(prev):
            prev(signum, frame)  # e.g. Python's default SIGINT handler raises KeyboardInterrupt
        elif prev != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # ----------------------------------------------------------------- queries
    @property
    def workers(self) -> int:
        return self.config.workers

    def address(self, worker: int) -> str:
        """IPv4 address of a worker (127.0.0.1 in the local fallback)."""
        self._check_worker(worker)
        if self.mode == "local":
            return "127.0.0.1"
        assert self.state is not None, "start() the cluster first"
        return netns.subnet_address(self.state.subnet_index, worker + 1)

    @property
    def master_addr(self) -> str:
        return self.address(0)

    def _check_worker(self, worker: int) -> None:
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < self.config.workers:
            raise CaramelError(f"worker must be an integer in 0..{self.config.workers - 1}, got {worker!r}")

    def _check_running(self) -> None:
        if self.mode is None:
            raise CaramelError("the cluster is not started; use `with EmulatedCluster(...) as cluster:` or call start()")
        if self._closed:
            raise CaramelError(f"cluster {self.config.prefix} is already torn down")

    def info(self) -> dict[str, Any]:
        """A JSON-friendly description (names, addresses, rates) for reports."""
        cfg = self.config
        d: dict[str, Any] = {"prefix": cfg.prefix, "mode": self.mode, "workers": cfg.workers,
                             "bandwidth_bps": list(self.bandwidth_bps), "latency_s": cfg.latency_s, "mtu": cfg.mtu,
                             "netem_available": self.netem_available,
                             "receive_buffer_cap_bytes": self.receive_buffer_cap_bytes,
                             "latency_emulated": bool(self.netem_available) and cfg.latency_s > 0}
        if self.mode == "netns":
            d.update(bridge=cfg.bridge, namespaces=[cfg.netns(i) for i in range(cfg.workers)],
                     interfaces=[cfg.worker_veth(i) for i in range(cfg.workers)],
                     addresses=[self.address(i) for i in range(cfg.workers)],
                     state_file=str(self._store.path(cfg.prefix)))
        elif self.mode == "local":
            d.update(fallback_reason=self.fallback_reason, addresses=["127.0.0.1"] * cfg.workers)
        return d

    # ----------------------------------------------------------------- control
    def set_bandwidth(self, worker: int, bandwidth_bps: float | str) -> None:
        """Change worker `worker`'s link rate (both directions) while jobs run."""
        self._check_worker(worker)
        bps = check_rate(bandwidth_bps)
        self._check_running()
        if self.mode == "local":
            raise CaramelError(f"set_bandwidth needs the emulated cluster; this is the local fallback ({self.fallback_reason})")
        rates = list(self.bandwidth_bps)
        rates[worker] = bps
        cap = self._receive_buffer_cap_for(rates)
        # a lower cap goes in before the link slows, a higher one after it speeds up
        lower = cap < (self.receive_buffer_cap_bytes or 0)
        if lower:
            self._cap_receive_buffers(cap)
        self._shape(worker, bps)
        self.bandwidth_bps[worker] = bps
        if not lower:
            self._cap_receive_buffers(cap)

    def env_for(self, worker: int, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment a process on `worker` gets: ours plus `extra`, threads and socket interface pinned."""
        from caramel.cluster.local import worker_env

        env = worker_env(base={**os.environ, **(extra or {})})
        env["CARAMEL_CLUSTER"] = str(self.config.prefix)
        env["CARAMEL_CLUSTER_BANDWIDTH_BPS"] = f"{self.bandwidth_bps[worker]:g}"
        if self.mode == "netns":
            dev = self.config.worker_veth(worker)
            env["GLOO_SOCKET_IFNAME"] = dev
            env["TP_SOCKET_IFNAME"] = dev
            env["NCCL_SOCKET_IFNAME"] = dev
        return env

    def exec(self, worker: int, argv: list[str], env: dict[str, str] | None = None, **popen_kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside worker `worker`'s namespace (plainly, in the local fallback)."""
        self._check_worker(worker)
        self._check_running()
        prefix = ["ip", "netns", "exec", self.config.netns(worker)] if self.mode == "netns" else []
        return subprocess.Popen(prefix + list(argv), env=self.env_for(worker, env), **popen_kwargs)

    def run(self, cmd: list[str], nproc_per_node: int = 1, env: dict[str, str] | None = None,
            timeout_s: float | None = None, out: TextIO | None = None, failure_grace_s: float = 10.0,
            max_restarts: int = 0) -> int:
        """Run `cmd` as one multi-node torchrun job (node i in namespace i); return the worst exit code.

        Ranks are fixed (static rendezvous on worker 0's address: node i holds ranks
        i*nproc_per_node ...), and output is streamed with a `[rank<r>]` prefix. With
        `max_restarts` > 0 the job uses c10d rendezvous instead, so that every node restarts
        together after a failure; ranks are then assigned at each rendezvous and output is
        prefixed `[node<i>]`.
        """
        if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
            raise CaramelError(f"nproc_per_node must be a positive integer, got {nproc_per_node!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise CaramelError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise CaramelError(f"timeout_s must be positive, got {timeout_s!r}")
        target = torchrun_target(list(cmd))
        self._check_running()
        self._runs += 1
        log_dir = tempfile.mkdtemp(prefix="caramel-torchrun-")
        # --tee prefixes each line with its local rank (rewritten to the global rank when ranks
        # are fixed); the per-rank log files go to a directory we delete.
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--log-dir", log_dir, "--max-restarts", str(max_restarts)]
        try:
            if self.mode == "local":
                argv = torchrun + ["--tee", "3", "--standalone", "--nnodes", "1",
                                   "--nproc-per-node", str(self.workers * nproc_per_node)] + target
                nodes = [NodeProcess("local", argv, self.env_for(0, env), rank_base=0 if not max_restarts else None)]
            else:
                port = BASE_MASTER_PORT + self._runs % 1000  # fresh port per run: no TIME_WAIT surprises
                fixed = max_restarts == 0
                tee = ["--tee", "3"] if nproc_per_node > 1 or not fixed else []
                nodes = []
                for i in range(self.workers):
                    if fixed:
                        rdzv = ["--node-rank", str(i), "--master-addr", self.master_addr, "--master-port", str(port)]
                    else:
                        # --local-addr: the agent that ends up rank 0 publishes it as MASTER_ADDR
                        # (the shared hostname would resolve to each reader's own address).
                        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.master_addr}:{port}",
                                "--rdzv-id", f"{self.config.prefix}-{self._runs}", "--local-addr", self.address(i)]
                    argv = (["ip", "netns", "exec", self.config.netns(i)] + torchrun + tee + rdzv +
                            ["--nnodes", str(self.workers), "--nproc-per-node", str(nproc_per_node)] + target)
                    label = f"rank{i}" if fixed and nproc_per_node == 1 else f"node{i}"
                    base = i * nproc_per_node if fixed and nproc_per_node > 1 else None
                    nodes.append(NodeProcess(label, argv, self.env_for(i, env), rank_base=base))
            return supervise(nodes, out=out, timeout_s=timeout_s, failure_grace_s=failure_grace_s)
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)

    def describe(self) -> str:
        """One line for humans."""
        if self.mode == "local":
            return f"{self.workers} local workers on loopback (no shaping: {self.fallback_reason})"
        rates = sorted(set(self.bandwidth_bps))
        rate = format_rate(rates[0]) if len(rates) == 1 else "/".join(format_rate(r) for r in self.bandwidth_bps)
        return f"cluster {self.config.prefix}: {self.workers} workers, {rate} links, master {self.master_addr}"
