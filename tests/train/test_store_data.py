"""`caramel train --data`'s batches, in process: the global order gives the in-memory run's very
batches; the locality order reads each rank's home once per epoch; the loader's state resumes
mid-epoch and at an epoch's end, through a weights_only checkpoint round trip, onto a fresh cache
(to the end of the resumed epoch) or the surviving one (every epoch);
and a bad store or option is one clear error."""
from __future__ import annotations

import io

import pytest
import torch

from caramel.data.format import write_dataset, write_random_dataset
from caramel.errors import CaramelError
from caramel.train.config import TrainConfig, apply_dict
from caramel.train.data import ShardedSampler
from caramel.train.store_data import StoreBatches, check_store, store_samples, write_workload_store
from caramel.train.workers import precheck

torch.set_num_threads(1)
N = 100  # samples of the numbered store: 2 ranks x batch 8 -> 6 steps per epoch, 4 samples left out


def config(tmp_path, url: str, **data) -> TrainConfig:
    values = {"url": url, "batch_size": 8, "loader_workers": 1, "cache_dir": str(tmp_path / "cache"), **data}
    return apply_dict(TrainConfig(), {"run": {"workload": "digits", "out_dir": str(tmp_path / "out")}, "data": values}, "test")


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    """A digits-shaped store whose image i is filled with i, so a batch says which samples it holds."""
    root = tmp_path_factory.mktemp("numbered")
    write_dataset(root, ((torch.full((1, 8, 8), float(i)), torch.tensor(i % 10)) for i in range(N)), samples_per_shard=7)
    return root


def ids(batch) -> list[int]:
    return batch[0][:, 0, 0, 0].long().tolist()


def batches(cfg: TrainConfig, rank: int, world: int, steps: int, state=None, start: int = 0):
    sharded = ShardedSampler(store_samples(cfg), world, rank, cfg.data.batch_size, cfg.run.seed)
    source = StoreBatches(cfg, sharded, rank, world)
    if state is not None:
        source.load_state_dict(state)
    try:
        out = [source.batch(s) for s in range(start, start + steps)]
        return out, source.state_dict()
    finally:
        source.close()


def test_global_order_gives_the_in_memory_batches(tmp_path):
    from caramel.train.data import digits_datasets

    store = tmp_path / "digits"
    cfg = config(tmp_path, f"file://{store}", data_order="global", batch_size=64)
    assert write_workload_store(store, cfg, samples_per_shard=16).num_samples == 1617
    train, _ = digits_datasets(cfg.data.val_fraction)
    sharded = ShardedSampler(len(train), 2, 1, 64, cfg.run.seed)
    got, _ = batches(cfg, 1, 2, sharded.steps_per_epoch + 3)  # crosses into the second epoch
    for step, (x, y) in enumerate(got):
        mx, my = train.batch(sharded.indices(step))
        assert torch.equal(x, mx) and torch.equal(y, my) and x.dtype == mx.dtype, step


def test_locality_order_reads_every_home_sample_once_per_epoch(numbered, tmp_path):
    cfg = config(tmp_path, str(numbered))
    epochs = {0: [], 1: []}
    for rank in range(2):
        got, _ = batches(cfg, rank, 2, 12)
        for step, b in enumerate(got):
            assert len(b[0]) == 8
            epochs[step // 6] += [(rank, i) for i in ids(b)]
    for seen in epochs.values():
        flat = [i for _, i in seen]
        assert len(flat) == len(set(flat)) == 2 * 6 * 8  # no sample twice in an epoch, across ranks
        assert all(rank * 50 <= i < (rank + 1) * 50 for rank, i in seen)  # each rank's home: its half
    assert [i for _, i in epochs[0]] != [i for _, i in epochs[1]]  # reshuffled per epoch


@pytest.mark.parametrize("order, cache", [("locality", "fresh"), ("locality", "same"), ("global", "fresh")])
@pytest.mark.parametrize("stop", [9, 6])  # mid-epoch, and exactly at the end of the first epoch
def test_resume_through_a_checkpoint_gives_the_same_batches(numbered, tmp_path, order, cache, stop):
    """Seed 2: a locality resume onto a fresh cache differs from the uninterrupted run at steps
    12-13 (the epoch after the resumed one orders by what the fresh cache holds), so the fresh
    case compares only to the resumed epoch's end, and the same-cache case is not equal by luck."""
    def cfg(cache_dir: str):
        return config(tmp_path, str(numbered), data_order=order, cache_dir=str(tmp_path / cache_dir))

    def seeded(c):
        c.run.seed = 2
        return c
    whole, _ = batches(seeded(cfg("whole-cache")), 1, 2, 14)
    head, state = batches(seeded(cfg("cache")), 1, 2, stop)
    buf = io.BytesIO()
    torch.save({"data_loader": [state]}, buf)  # as the checkpoint holds it, loaded as caramel train loads it
    state = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)["data_loader"][0]
    resumed = seeded(cfg("cache" if cache == "same" else "other-cache"))
    tail, _ = batches(resumed, 1, 2, 14 - stop, state=state, start=stop)
    # guaranteed: every step with the global order or the surviving cache (its budget holds the
    # home); with the locality order onto a fresh cache only to the end of the resumed epoch
    upto = 12 if order == "locality" and cache == "fresh" else 14
    assert [ids(b) for b in head + tail][:upto] == [ids(b) for b in whole][:upto]


def test_a_store_of_other_samples_is_one_clear_error(tmp_path):
    write_random_dataset(tmp_path / "rand", 32, 100, 8)
    with pytest.raises(CaramelError, match=r"samples are \(uint8\[100\], int64\[\]\), but workload digits takes "
                                           r"\(input, target\) = \(float32\[1, 8, 8\], int64\[\]\).*data make"):
        check_store(config(tmp_path, str(tmp_path / "rand")))
    cfg = config(tmp_path, str(tmp_path / "gpt"))
    cfg.run.workload, cfg.data.seq_len, cfg.data.text_bytes = "char_gpt", 16, 20_000
    write_workload_store(tmp_path / "gpt", cfg, 64)
    cfg.data.seq_len = 32
    with pytest.raises(CaramelError, match=r"int64\[16\].*char_gpt takes .*int64\[32\]"):
        check_store(cfg)


def test_a_store_of_another_split_is_named_before_any_worker_starts(tmp_path):
    """A store made with --val-fraction 0.05 (1707 samples) holds samples that --val-fraction 0.1
    validates on, and indices past its 1617 training samples: refused by the precheck."""
    made = config(tmp_path, str(tmp_path / "digits"), val_fraction=0.05)
    assert write_workload_store(tmp_path / "digits", made, samples_per_shard=64).num_samples == 1707
    assert check_store(made) == 1707
    with pytest.raises(CaramelError, match=r"holds 1707 samples, but workload digits's training split "
                                           r"\(--val-fraction 0.1\) has 1617.*--val-fraction 0.1"):
        precheck(config(tmp_path, str(tmp_path / "digits")))
    gpt = config(tmp_path, str(tmp_path / "gpt"))
    gpt.run.workload, gpt.data.seq_len, gpt.data.text_bytes = "char_gpt", 16, 20_000
    n = write_workload_store(tmp_path / "gpt", gpt, 256).num_samples
    gpt.data.text_bytes = 30_000
    with pytest.raises(CaramelError, match=rf"holds {n} samples, but workload char_gpt's training split "
                                           r"\(--val-fraction 0.1 --text-bytes 30000 --seq-len 16\) has \d+"):
        precheck(gpt)


def test_a_bad_url_is_named_before_any_worker_starts(tmp_path, capsys):
    with pytest.raises(CaramelError, match=r"data store .*nowhere.*index.json is not there"):
        precheck(config(tmp_path, str(tmp_path / "nowhere")))
    with pytest.raises(CaramelError, match=r"data store 'http://127.0.0.1:9/ds'.*cannot read index.json"):
        precheck(config(tmp_path, "http://127.0.0.1:9/ds"))
    from caramel.cli import main  # the command: exit code 2 and the one line, no traceback
    assert main(["train", "--workload", "digits", "--cluster", "off", "--out-dir", str(tmp_path / "run"),
                 "--data", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "index.json is not there" in err and "Traceback" not in err


@pytest.mark.parametrize("override, message", [
    ({"run": {"workload": "ddrl"}}, "workload ddrl cannot train from a store"),
    ({"data": {"remainder": "pad", "url": "ds"}}, "use --remainder drop or --data-order global"),
    ({"parallel": {"strategy": "pipeline:stages=2"}}, "does not feed strategy pipeline"),
    ({"parallel": {"strategy": "caramel:balance=batch"}}, "does not feed balance='batch'"),
    ({"run": {"script": "x.py"}}, "a --script reads its own data"),
    ({"data": {"shuffle": False, "url": "ds"}}, r"shuffle false: --data-order locality always shuffles.*--data-order global"),
])
def test_options_data_cannot_go_with_are_refused(tmp_path, override, message):
    with pytest.raises(CaramelError, match=message):
        apply_dict(TrainConfig(), {"run": {"workload": "digits"}, "data": {"url": "ds"}, **override}, "test")


@pytest.mark.parametrize("values, named", [
    ({"cache_dir": "/tmp/c"}, "--cache-dir /tmp/c"),
    ({"cache_budget_mib": 8, "loader_workers": 0}, "--cache-budget-mib 8, --loader-workers 0"),
    ({"data_order": "global"}, "--data-order global"),
])
def test_options_only_data_reads_are_refused_without_it(values, named):
    with pytest.raises(CaramelError, match=f"test: {named}: only used with --data URL"):
        apply_dict(TrainConfig(), {"run": {"workload": "digits"}, "data": values}, "test")
    apply_dict(TrainConfig(), {"run": {"workload": "digits"}, "data": {**values, "url": "ds"}}, "test")  # with it: fine
    apply_dict(TrainConfig(), {"data": {"loader_workers": 2, "data_order": "locality"}}, "test")  # the defaults: fine


def test_a_config_file_may_set_what_a_data_flag_completes(tmp_path):
    """The fields are checked together after the flags: a file's loader options for --data on the command line."""
    from caramel.cli import build_parser
    from caramel.train.config import from_args

    def parse(*argv: str) -> TrainConfig:
        return from_args(build_parser(only="train").parse_args(["train", "--config", str(path), *argv]))
    path = tmp_path / "run.toml"
    path.write_text('[data]\nloader_workers = 1\ndata_order = "global"\n')
    cfg = parse("--data", "ds", "--workload", "digits")
    assert (cfg.data.url, cfg.data.loader_workers, cfg.data.data_order) == ("ds", 1, "global")
    with pytest.raises(CaramelError, match=r"config .*run.toml with the command line: --loader-workers 1, "
                                           r"--data-order global: only used with --data"):
        parse("--workload", "digits")


def test_the_summary_line_names_the_order_read(numbered, tmp_path):
    for order, says in [("locality", "6 steps/epoch, locality order (each rank reads its home of 50 samples, cached "
                                     "shards first; 4 samples/epoch unused)"),
                        ("global", "6 steps/epoch, remainder dropped (4 samples/epoch unused); global order from the store")]:
        cfg = config(tmp_path, str(numbered), data_order=order)
        source = StoreBatches(cfg, ShardedSampler(N, 2, 0, 8, 0), 0, 2)
        try:
            assert source.describe() == says
        finally:
            source.close()
