"""The end-of-run summary text."""
from caramel.train.report import format_summary


def _summary(**over):
    s = {"strategy": "caramel:planner=fifo", "planner": "fifo", "overlap": "backward", "end_step": 240,
         "total_steps": 240, "start_step": 0, "finished": True, "workload": "char_gpt", "world_size": 2,
         "batch_size_per_worker": 16, "data": "878 steps/epoch", "first_loss": 5.5, "final_loss": 2.4,
         "losses_averaged": 10, "median_step_time_s": 0.078, "samples_per_s": 409.0, "wall_s": 20.3,
         "exposed_comm_s": 0.008, "sim_speedup_vs_ddp": 1.0, "metrics": "runs/train/metrics.jsonl"}
    s.update(over)
    return s


def test_summary_says_which_schedule_the_overlap_trial_kept_and_why():
    trial = {"step_period_s": {"caramel/forward": 0.0801, "caramel/backward": 0.0790, "fifo/backward": 0.0783},
             "chosen": "fifo/backward"}
    text = format_summary(_summary(overlap_trial=trial))
    assert ("  overlap trial  kept fifo/backward (step period: caramel/forward 80.1 ms, "
            "caramel/backward 79.0 ms, fifo/backward 78.3 ms)") in text
    assert "strategy       caramel:planner=fifo (planner fifo, overlap backward)" in text
    ddp = format_summary(_summary(overlap_trial=trial, delegated_to_ddp=True))
    assert "  overlap trial  kept fifo/backward, run by torch DDP (step period: " in ddp
    confirmed = {**trial, "chosen": "caramel/forward", "confirmation": {
        "candidate": "caramel/forward", "confirmed": True,
        "step_period_s": {"caramel/forward": 0.0712, "caramel/backward": 0.0790}}}
    assert ("kept caramel/forward (step period: caramel/forward 80.1 ms, caramel/backward 79.0 ms, "
            "fifo/backward 78.3 ms; caramel/forward confirmed on fresh steps: 71.2 against 79.0 ms)"
            in format_summary(_summary(overlap_trial=confirmed)))
    shared = {**trial, "shares": [170, 86], "retimed_passes": 1}  # balance="batch"
    assert ("kept fifo/backward (step period at shares 170/86: caramel/forward 80.1 ms, caramel/backward 79.0 ms, "
            "fifo/backward 78.3 ms; 1 pass(es) run again: too few steps at the latest shares)"
            in format_summary(_summary(overlap_trial=shared)))
    # a balancer's sizes, yet some candidate had no step at the latest shares: all compared
    mixed = {**trial, "shares": None, "sized": True}
    assert "kept fifo/backward (step period over mixed shares: caramel/forward 80.1 ms" in format_summary(
        _summary(overlap_trial=mixed))
    # the confirmation's blocks ran twice and a change still left one of the two without steps there
    conf = {**confirmed, "shares": [170, 86], "sized": True, "confirmation": {
        **confirmed["confirmation"], "shares": None, "retimed": True,
        "samples": {"caramel/forward": 4, "caramel/backward": 5}}}
    assert ("caramel/forward confirmed on fresh steps: 71.2 against 79.0 ms (run twice, too few steps at the "
            "latest shares; on mixed shares, samples caramel/forward 4, caramel/backward 5))"
            in format_summary(_summary(overlap_trial=conf)))


def test_summary_without_a_finished_trial_has_no_schedule_line():
    assert "overlap trial" not in format_summary(_summary(overlap_trial=None))
    assert "overlap trial" not in format_summary(_summary())
