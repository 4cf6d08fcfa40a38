"""What a person sees: the rank-0 progress bar and the one-screen summary at the end."""
from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

from caramel.strategies.caramel.trial import confirmation_note
from caramel.train.config import TrainConfig


class Progress:
    """tqdm on rank 0 (samples/s, step time, loss, exposed communication); silent elsewhere."""

    def __init__(self, total_steps: int, start_step: int, enabled: bool):
        # not a terminal (a log, or the emulated cluster's line-prefixed output): a line every 10 s
        interactive = sys.stderr.isatty()
        self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr,
                        disable=not enabled, desc="train", mininterval=0.1 if interactive else 10.0,
                        maxinterval=10.0 if interactive else 60.0)

    def update(self, row: dict[str, Any], refresh: bool) -> None:
        self.bar.update(1)
        if refresh:
            post = {"loss": f"{row['loss']:.4f}", "samples/s": f"{row['samples_per_s']:.0f}", "step": f"{1000 * row['step_time_s']:.1f}ms"}
            if row.get("exposed_comm_s") is not None:
                post["comm"] = f"{1000 * row['exposed_comm_s']:.1f}ms"
            self.bar.set_postfix(post, refresh=True)

    def write(self, text: str) -> None:
        if not self.bar.disable:
            self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def simulated_speedup_vs_ddp(cfg: TrainConfig, summary: dict[str, Any], engine: Any = None) -> float | None:
    """Predicted step time of this run with DDP divided by with the plan this run used.

    Both are simulated from the profile the engine measured in this run's first steps, on the
    cluster the plan was made for: DDP as the `fifo` plan with `overlap="backward"`, this run as
    its final plan and overlap mode. None when there is nothing to compare (the ddp strategy, one
    worker, or no profile).
    """
    opt = getattr(engine, "optimizer", None)
    caramel_engine = getattr(opt, "_caramel_engine", None)
    controller = getattr(caramel_engine, "controller", None)
    if controller is None or controller.profile is None or controller.plan_cluster is None or caramel_engine.plan is None:
        return None
    from caramel.strategies.planners import make_plan
    from caramel.sim import simulate

    profile, cluster = controller.profile, controller.plan_cluster
    ddp_plan = make_plan("fifo", profile, cluster, world_size=cluster.world_size)
    t_ddp = simulate(profile, cluster, ddp_plan, overlap="backward", trace=False).step_time_s
    t_ours = simulate(profile, cluster, caramel_engine.plan, overlap=caramel_engine.overlap, trace=False).step_time_s
    return t_ddp / t_ours if t_ours > 0 else None


def _ms(s: float | None) -> str:
    return f"{1000 * s:.1f} ms" if s is not None else "n/a"


def format_summary(s: dict[str, Any]) -> str:
    """The end-of-run summary, one screen."""
    strategy = s["strategy"] + (f" (planner {s['planner']}, overlap {s['overlap']})" if s.get("planner") else "")
    steps = f"{s['end_step']} of {s['total_steps']}" + (f" (resumed at {s['start_step']})" if s["start_step"] else "")
    if not s["finished"]:
        steps += "; stopped early, continue with --resume auto"
    lines = [
        "-" * 72,
        f"caramel train summary: {s['workload']}, {s['world_size']} workers x {s['batch_size_per_worker']} samples/step",
        f"  strategy       {strategy}",
    ]
    trial = s.get("overlap_trial")
    if trial:
        periods = ", ".join(f"{name} {_ms(t)}" for name, t in trial["step_period_s"].items())
        ddp = ", run by torch DDP" if s.get("delegated_to_ddp") else ""
        notes = [confirmation_note(trial)]
        # balance="batch": the local batch sizes the candidates were compared at, or that they
        # were compared over mixed shares, and the passes run again because a candidate had too
        # few steps at the latest shares (a share change, or periods of unknown shares carried
        # from a checkpoint written before the sizes)
        at = f" at shares {'/'.join(map(str, trial['shares']))}" if trial.get("shares") else ""
        if trial.get("sized") and not trial.get("shares"):
            at = " over mixed shares"
        if trial.get("retimed_passes"):
            notes.append(f"{trial['retimed_passes']} pass(es) run again: too few steps at the latest shares")
        note = "; ".join(n for n in notes if n)
        lines.append(f"  overlap trial  kept {trial['chosen']}{ddp} (step period{at}: {periods}{'; ' + note if note else ''})")
    lines += [
        f"  steps          {steps}",
        f"  data           {s['data']}",
    ]
    if s["first_loss"] is not None:
        lines.append(f"  train loss     {s['first_loss']:.4f} at the first step -> {s['final_loss']:.4f} (mean of the last {s['losses_averaged']} steps)")
    if "val_loss" in s:
        lines.append(f"  validation     loss {s['val_loss']:.4f}, accuracy {100 * s['val_accuracy']:.2f}% over {s['val_predictions']} predictions")
    if s["median_step_time_s"]:
        lines.append(f"  throughput     {s['samples_per_s']:.0f} samples/s, median step {_ms(s['median_step_time_s'])}, wall {s['wall_s']:.1f} s")
    lines.append(f"  exposed comm   {_ms(s['exposed_comm_s'])} per step (median time blocked on communication)"
                 if s["exposed_comm_s"] is not None else "  exposed comm   n/a (the engine reports it; DDP does not)")
    if s.get("consensus_distance") is not None:
        lines.append(f"  consensus      {s['consensus_distance']:.3g} (gossip: mean squared distance of the workers' "
                     f"parameters to their average, last measured)")
    sim = s.get("sim_speedup_vs_ddp")
    lines.append(f"  vs DDP (sim)   {sim:.2f}x the speed of DDP on this run's profile and link, per the simulator" if sim
                 else "  vs DDP (sim)   n/a (the ddp strategy, one worker, or no profile)")
    files = [s["metrics"]] + ([s["trace"]] if s.get("trace") else []) + ([s["last_checkpoint"]] if s.get("last_checkpoint") else [])
    lines.append(f"  files          {', '.join(files)}")
    lines.append("-" * 72)
    return "\n".join(lines)
