"""Where the workers come from: torchrun's environment, local workers, or the emulated cluster.

- Under torchrun (RANK and WORLD_SIZE set), this process is a worker and trains.
- `--workers N` (N > 1, or restarts requested) starts `torchrun --standalone` as a subprocess,
  which runs `caramel train --config OUT_DIR/config.json` on every worker.
- `--cluster` runs that same command through `caramel.cluster.EmulatedCluster.run`, one
  torchrun per network namespace (`launch_cluster`, the only place that knows the cluster API).
- One worker and no restarts: train in this process, as a 1-process group.
"""
from __future__ import annotations

import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from caramel.cluster.local import worker_env
from caramel.errors import CaramelError
from caramel.jsonio import write_json
from caramel.train.config import TrainConfig


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def worker_command(cfg: TrainConfig, script_args: list[str]) -> list[str]:
    """Write the effective config for the workers and return the command each of them runs."""
    path = Path(cfg.run.out_dir) / "config.json"
    write_json(path, cfg.to_json())
    cmd = [sys.executable, "-m", "caramel.cli", "train", "--config", str(path.resolve())]
    return cmd + (["--", *script_args] if script_args else [])


def run_worker(cfg: TrainConfig, script_args: list[str]) -> dict | None:
    """This process is a worker: run the user's script, or the built-in loop (returns its summary)."""
    if cfg.run.script:
        script = Path(cfg.run.script)
        if not script.is_file():
            raise CaramelError(f"--script {script}: no such file (expected a Python training script)")
        sys.argv = [str(script), *script_args]
        runpy.run_path(str(script), run_name="__main__")
        return None
    from caramel.train.loop import train  # torch.distributed and the workloads load only in workers
    return train(cfg)


def launch_local(cfg: TrainConfig, script_args: list[str]) -> int:
    """Start `cfg.parallel.workers` local workers with `torchrun --standalone`; return its exit code.

    Nothing outlives the launcher when it is stopped by Ctrl-C, an error or SIGTERM: while it
    waits a SIGTERM handler (the previous one restored after) raises SystemExit(143), torchrun's
    process group is stopped (`_stop`), the workers it started in sessions of their own are
    killed if torchrun left them, and its log directory is removed. SIGKILL cannot be handled:
    then torchrun and its workers are orphaned and `caramel-torchrun-*` stays in the temp dir."""
    cmd = worker_command(cfg, script_args)
    # torchrun's per-attempt files (its error reports) go to a directory we delete: without
    # --log-dir it makes one in the system temp dir and leaves it there
    log_dir = tempfile.mkdtemp(prefix="caramel-torchrun-")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--log-dir", log_dir,
                "--nproc-per-node", str(cfg.parallel.workers), "--max-restarts", str(cfg.parallel.max_restarts)]
    argv = torchrun + cmd[1:]  # torchrun runs `-m caramel.cli ...` with the same interpreter
    print(f"caramel train: starting {cfg.parallel.workers} local workers: {' '.join(argv)}", file=sys.stderr, flush=True)
    state = {"started": False, "terminated": False}

    def on_sigterm(signum, _frame):
        # raise once, and only once torchrun is started (so its stop runs); later ones wait for the stop
        first, state["terminated"] = not state["terminated"], True
        if first and state["started"]:
            raise SystemExit(128 + signum)

    in_main = threading.current_thread() is threading.main_thread()  # signal handlers live in the main thread
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    try:
        proc = subprocess.Popen(argv, env=worker_env(), start_new_session=True)
        state["started"] = True
        try:
            if state["terminated"]:  # a SIGTERM while torchrun was starting
                raise SystemExit(128 + signal.SIGTERM)
            return proc.wait()
        except BaseException:
            # Ctrl-C, SIGTERM or an error here: torchrun forwards SIGTERM to its workers; make sure nothing outlives us.
            workers = _children(proc.pid)
            _stop(proc)
            _kill_left(workers)
            raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(log_dir, ignore_errors=True)


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def _children(pid: int) -> list[tuple[int, str]]:
    """The processes whose parent is `pid`, with their start time (`/proc`; [] elsewhere):
    torchrun's workers, each in a session of its own that stopping torchrun's group misses."""
    out = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append((int(entry.parent.name), fields[19]))  # ppid; starttime tells a reused pid apart
    return out


def _kill_left(workers: list[tuple[int, str]]) -> None:
    """SIGKILL the sessions of the workers torchrun left running (the same process: same start time)."""
    for pid, started in workers:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19] == started:
                os.killpg(pid, signal.SIGKILL)
        except (OSError, IndexError):
            continue


def launch_cluster(cfg: TrainConfig, script_args: list[str]) -> int:
    """Run the workers on the emulated cluster (one torchrun per namespace, shaped links)."""
    try:
        from caramel.cluster.config import ClusterConfig
        from caramel.cluster.emulated import EmulatedCluster
    except ImportError as e:
        raise CaramelError(f"--cluster: the emulated cluster is not available in this build ({e})") from None
    options = {"workers": cfg.parallel.workers}
    if cfg.parallel.bandwidth:
        options["bandwidth_bps"] = cfg.parallel.bandwidth
    cmd = worker_command(cfg, script_args)
    if cfg.parallel.max_restarts:
        raise CaramelError("--max-restarts is not supported with --cluster (the cluster launches one torchrun per host)")
    with EmulatedCluster(ClusterConfig(**options)) as cluster:
        print(f"caramel train: {cluster.describe()}", file=sys.stderr, flush=True)
        return cluster.run(cmd)


AUTO_CLUSTER_BANDWIDTH = "1gbit"


def use_cluster(cfg: TrainConfig) -> bool:
    """--cluster on/off as given; auto: the emulated cluster (shaped at 1gbit unless --bandwidth
    says otherwise) when this host can make one (root, ip and tc present), with more than one
    worker and no --max-restarts; plain local workers otherwise."""
    mode = cfg.parallel.cluster
    if mode != "auto":
        return mode == "on"
    import os
    import shutil
    able = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
    if able and cfg.parallel.workers > 1 and cfg.parallel.max_restarts == 0:
        if not cfg.parallel.bandwidth:
            cfg.parallel.bandwidth = AUTO_CLUSTER_BANDWIDTH
        return True
    return False


def precheck(cfg: TrainConfig) -> None:
    """Checks worth doing once, before any worker starts, so that mistakes get one clean error line."""
    if cfg.run.script and not Path(cfg.run.script).is_file():
        raise CaramelError(f"--script {cfg.run.script}: no such file (expected a Python training script)")
    from caramel.strategies import STRATEGIES
    spec = STRATEGIES.spec(cfg.parallel.strategy)
    if spec.info.name == "pipeline" and spec.options.auto_replicas:
        raise CaramelError(f"--strategy {cfg.parallel.strategy}: caramel train does not choose replica counts "
                           f"(replicas=auto); give the counts (replicas=2, or one per stage like 2+1)")
    if spec.info.name == "pipeline" and spec.options.schedule != "interleaved" and not cfg.run.script:
        need = spec.options.workers()
        if cfg.parallel.workers != need:
            what = (f"replicas={spec.options.replicas} (their sum)" if spec.options.unequal_replicas
                    else f"stages={spec.options.stages} x replicas={spec.options.replicas}")
            raise CaramelError(f"--strategy {cfg.parallel.strategy}: {what} needs --workers {need}, "
                               f"got --workers {cfg.parallel.workers}")
    if cfg.data.url:
        from caramel.train.store_data import check_store
        check_store(cfg)  # an unreachable store or one of other samples: one line, before any worker starts
    if cfg.checkpoint.resume not in ("none", "auto"):
        from caramel.train import checkpoint
        checkpoint.load(cfg.checkpoint.resume)


def launch(cfg: TrainConfig, script_args: list[str]) -> tuple[int, dict | None]:
    """Train here (under torchrun, or one local worker) or start workers; (exit code, summary if trained here)."""
    if under_torchrun():
        return 0, run_worker(cfg, script_args)
    precheck(cfg)
    if use_cluster(cfg):
        return launch_cluster(cfg, script_args), None
    if cfg.parallel.workers > 1 or cfg.parallel.max_restarts > 0:
        return launch_local(cfg, script_args), None
    return 0, run_worker(cfg, script_args)
