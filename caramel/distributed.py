"""Process-group set-up: `init_distributed()` and the private communication groups the engine uses.

Reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). With
none of it, it makes a one-process group, so the same script runs unchanged without torchrun.
Timeouts are short by default (minutes, not gloo's 30), so a dead or hung peer fails the job
with an error instead of a silent wait.
"""
from __future__ import annotations

import datetime
import importlib
import os
import random
import socket
from dataclasses import dataclass

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from caramel.errors import CaramelError

if TYPE_CHECKING:
    from caramel.runtime.comm_priority import CommPriority

DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def resolve_timeout_s(timeout_s: float | None = None) -> float:
    """The collective timeout: the argument, else CARAMEL_TIMEOUT_S, else 300 s."""
    if timeout_s is None:
        env = os.environ.get("CARAMEL_TIMEOUT_S")
        if env is None:
            return DEFAULT_TIMEOUT_S
        try:
            timeout_s = float(env)
        except ValueError:
            raise CaramelError(f"CARAMEL_TIMEOUT_S={env!r} is not a number of seconds") from None
    if not timeout_s > 0:
        raise CaramelError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago, chosen below the kernel's ephemeral
    range (as torchrun's 29500 is): a port from `bind(0)` is one the kernel may hand out again
    as the source port of another process's connection before our store binds it."""
    low = _ephemeral_low()
    rng = random.Random()  # seeded from the OS: two processes picking at once rarely agree
    if low > 12000:
        for _ in range(64):
            port = rng.randrange(10000, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out as a connection's source port (Linux; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _info() -> DistInfo:
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = dist.get_backend()
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return DistInfo(rank, world, local_rank, device, backend)


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise CaramelError(f"{name}={os.environ[name]!r} is not an integer") from None


def host_store(timeout_s: float = DEFAULT_TIMEOUT_S) -> dist.TCPStore:
    """A rendezvous store hosted by this (launching) process on a loopback port the kernel
    picks, as torchrun's agent hosts one: workers started with MASTER_PORT=store.port and
    TORCHELASTIC_USE_AGENT_STORE=True join it as clients. A port chosen free and bound later by
    rank 0 can be taken in between by another job on the host (EADDRINUSE); this one is bound
    before any worker starts. The server stops with the returned object's last reference."""
    return dist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def _store(rank: int, timeout: datetime.timedelta) -> dist.Store:
    """The rendezvous store, under a key prefix per torchrun attempt.

    torchrun's agent hosts one store for all restarts; keys a crashed attempt left there must not
    be read by the next attempt (they name dead peers' addresses). Without the agent, rank 0
    hosts the store, as env:// would.
    """
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None,
                              is_master=(rank == 0 and not agent), timeout=timeout, wait_for_workers=False)
    except ValueError:
        raise CaramelError(f"MASTER_PORT={os.environ['MASTER_PORT']!r} is not a port number") from None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"caramel/attempt{attempt}/", store)


def _check_world_size(store: dist.Store, rank: int, world: int, timeout_s: float) -> None:
    """Every rank publishes its WORLD_SIZE; rank 0 reads all, the others read rank 0's. A
    difference is an error naming both values, instead of a rendezvous that never completes."""
    store.set(f"world/{rank}", str(world))
    others = range(1, world) if rank == 0 else [0]
    for r in others:
        try:
            store.wait([f"world/{r}"], datetime.timedelta(seconds=timeout_s))
        except Exception:  # noqa: BLE001 - a timeout, reported with what it means
            raise RuntimeError(f"caramel: rank {rank}: rank {r} did not join within {timeout_s:g} s "
                               f"(WORLD_SIZE={world}); is every worker started, with the same MASTER_ADDR/PORT?") from None
        theirs = int(store.get(f"world/{r}"))
        if theirs != world:
            from caramel.errors import MismatchError
            raise MismatchError(f"rank {r} says WORLD_SIZE={theirs}, rank {rank} says WORLD_SIZE={world}; "
                                "every worker must be started with the same world size")


def init_distributed(backend: str | None = None, timeout_s: float | None = None) -> DistInfo:
    """Initialize the default process group from torchrun's environment (idempotent).

    `backend` defaults to NCCL when CUDA is available, gloo otherwise. `timeout_s` (or the
    environment variable CARAMEL_TIMEOUT_S) bounds every collective; the default is 300 s.
    Without torchrun's variables a one-process group on loopback is created.
    """
    if dist.is_initialized():
        return _info()
    _import_group_defaults()
    timeout = datetime.timedelta(seconds=resolve_timeout_s(timeout_s))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend not in ("gloo", "nccl", "mpi"):
        raise CaramelError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise CaramelError(f"RANK and WORLD_SIZE are set but {', '.join(missing)} is not; launch with torchrun or set them")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
        if not 0 <= rank < world:
            raise CaramelError(f"RANK={rank} is not in [0, WORLD_SIZE={world})")
        store = _store(rank, timeout)
        _check_world_size(store, rank, world, timeout.total_seconds())
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    return _info()


def _import_group_defaults() -> None:
    """Import, while no group exists, the torch module whose default arguments are the default
    group (`group=group.WORLD` in torch.distributed.nn.functional).

    The first optimizer step imports torch._dynamo, which imports that module; imported after
    the group is made, its defaults hold the group for the life of the process, so that
    destroy_process_group() leaves its gloo threads and connections running until the
    interpreter's teardown, where a rank can abort ('terminate called without an active
    exception') while its peer exits. Imported first, the defaults are None."""
    importlib.import_module("torch.distributed.nn.functional")


def group_alive(group) -> bool:
    """Whether `group` can still carry collectives: the default group is up and knows it (a
    strategy's release() after the user destroyed the process group must not send)."""
    if not dist.is_initialized():
        return False
    try:
        dist.get_rank(group)
        return True
    except (ValueError, RuntimeError):
        return False


def gloo_group(prefix: str, group: dist.ProcessGroup | None = None, threads: int = 1,
               timeout_s: float | None = None, priority: "CommPriority | None" = None
               ) -> dist.ProcessGroup | "dist.ProcessGroupGloo":
    """A private gloo backend over `group`'s ranks with `threads` worker threads.

    With one thread, collectives run strictly in the order they are issued: the engine relies
    on this so that its issue order is also the order bytes go on the wire. Every rank of
    `group` must call this with the same `prefix`, in the same order. With `priority`, the
    backend's threads get it (`caramel.runtime.comm_priority.CommPriority.start`).
    """
    from torch.distributed import ProcessGroupGloo
    from torch.distributed.distributed_c10d import _get_default_store

    group = group or dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    # torchrun's agent keeps its store across restarts: keys of a crashed attempt must not be
    # read by the next one, so the attempt number is part of every key
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"caramel/attempt{attempt}/{prefix}/", _get_default_store())
    opts = ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=resolve_timeout_s(timeout_s))
    opts._threads = threads
    iface = os.environ.get("GLOO_SOCKET_IFNAME")

    def build() -> "dist.ProcessGroupGloo":
        # the devices start the loop threads, the backend its worker threads: both under `priority`
        if iface:
            opts._devices = [ProcessGroupGloo.create_device(interface=i) for i in iface.split(",")]
        else:
            opts._devices = [ProcessGroupGloo.create_default_device()]
        return ProcessGroupGloo(store, rank, size, opts)

    return build() if priority is None else priority.start(build)


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a tensor for a collective on `group` must live: the current CUDA device on an NCCL
    group (NCCL moves CUDA tensors only), else the CPU (gloo, or a group with both backends)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_coalesced(tensors: list[torch.Tensor], src: int, group: dist.ProcessGroup | None = None) -> None:
    """`src`'s values of `tensors` (a module's buffers) on every rank of `group`, one broadcast per
    dtype and device, as DDP's coalesced buffer broadcast does: one per tensor would cost
    BatchNorm's three buffers per layer a collective each. `src` is a global rank."""
    kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        kinds.setdefault((t.dtype, t.device), []).append(t)
    receiving = dist.get_rank() != src
    with torch.no_grad():
        for same in kinds.values():
            flat = torch._utils._flatten_dense_tensors([t.detach() for t in same])
            dist.broadcast(flat, src=src, group=group)
            if receiving:
                for t, view in zip(same, torch._utils._unflatten_dense_tensors(flat, same)):
                    t.copy_(view)


def params_device(params: list[torch.Tensor]) -> torch.device:
    """The one device the parameters live on: the engine's buckets, rows and collectives follow it."""
    devices = {p.device for p in params}
    if len(devices) != 1:
        raise CaramelError("the model's parameters live on several devices ("
                           + ", ".join(sorted(str(d) for d in devices)) + "); data-parallel training needs each "
                           "rank's replica on one device: move the model with model.to(device) first")
    return devices.pop()


def comm_group_for(device: torch.device | str, parent: dist.ProcessGroup | None, name: str,
                   priority: "CommPriority | None" = None, timeout_s: float | None = None) -> dist.ProcessGroup:
    """The private group an engine's collectives on tensors of `device` run on, over `parent`'s ranks.

    CPU tensors: a one-thread gloo group (`gloo_group`), whose threads get `priority`. CUDA
    tensors: a new NCCL group over the same ranks (`dist.new_group(ranks, backend="nccl")`): one
    communicator, whose collectives run on one CUDA stream in issue order, as the one-thread gloo
    group runs them on the CPU. Not the parent group itself: the user's own collectives and the
    controller's checks run there, and on one communicator they would slip in between the plan's
    items; a released engine also destroys its own group, never the user's. `priority` does not
    apply to NCCL (its progress is on the GPU). Every rank of `parent` calls this with the same
    `name`, in the same order.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return gloo_group(name, parent, threads=1, timeout_s=timeout_s, priority=priority)
    if device.type != "cuda":
        raise CaramelError(f"parameters on {device.type} devices are not supported: the engine moves CPU tensors "
                           "over gloo and CUDA tensors over NCCL")
    if not dist.is_nccl_available():
        backend = dist.get_backend(parent)
        raise CaramelError(f"the model's parameters are on {device}, but this PyTorch build has no NCCL "
                           f"(the process group's backend is {backend!r}); gloo would copy every CUDA tensor "
                           "through the host. Install a CUDA build of PyTorch with NCCL, or train on the CPU")
    parent = parent or dist.group.WORLD
    ranks = dist.get_process_group_ranks(parent)
    timeout = datetime.timedelta(seconds=resolve_timeout_s(timeout_s))
    # a subgroup's ranks make it among themselves; the job's whole group is made by every rank
    return dist.new_group(ranks, backend="nccl", timeout=timeout, group_desc=name,
                          use_local_synchronization=parent is not dist.group.WORLD)
