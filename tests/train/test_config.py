"""Config: defaults, TOML, flag overrides, and one clear error per bad input."""
from __future__ import annotations

import json

import pytest

from caramel.cli import build_parser, main
from caramel.errors import CaramelError
from caramel.train.config import TrainConfig, from_args, load_file

pytestmark = pytest.mark.timeout(60)


def parse(argv: list[str]) -> TrainConfig:
    return from_args(build_parser(only="train").parse_args(["train", *argv]))


def test_defaults_are_the_documented_first_run():
    cfg = parse([])
    assert (cfg.run.workload, cfg.parallel.workers, cfg.parallel.strategy) == ("char_gpt", 2, "caramel")
    assert cfg.data.remainder == "drop" and cfg.checkpoint.resume == "none"


def test_toml_then_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[run]\nworkload = "digits"\nsteps = 7\n[optim]\nlr = 0.5\nschedule = "constant"\n[data]\nshuffle = false\n')
    cfg = parse(["--config", str(path), "--lr", "0.01", "--batch-size", "3"])
    assert cfg.run.workload == "digits" and cfg.run.steps == 7  # from the file
    assert cfg.optim.lr == 0.01 and cfg.data.batch_size == 3  # flags win
    assert cfg.optim.schedule == "constant" and cfg.data.shuffle is False
    assert cfg.model.d_model == TrainConfig().model.d_model  # untouched default


def test_bool_flags_and_json_round_trip(tmp_path):
    cfg = parse(["--no-shuffle", "--workload", "digits", "--checkpoint-every", "5"])
    assert cfg.data.shuffle is False and cfg.checkpoint.every_steps == 5
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_json()))
    assert load_file(path) == cfg


@pytest.mark.parametrize("toml, message", [
    ("[optim]\nlrr = 1.0\n", "unknown key optim.'lrr'"),
    ("[optimizer]\nlr = 1.0\n", "unknown section [optimizer]"),
    ("[optim]\nlr = \"fast\"\n", "optim.lr must be a number"),
    ("[run]\nsteps = 1.5\n", "run.steps must be an integer"),
    ("[run]\nsteps = 0\n", "run.steps must be >= 1"),
    ("[data]\nremainder = \"wrap\"\n", "data.remainder is 'wrap'; expected one of drop, pad"),
    ("[data]\nval_fraction = 1.0\n", "data.val_fraction must be in (0, 1)"),
    ("[model]\nd_model = 30\nheads = 4\n", "model.heads (4) must divide model.d_model (30)"),
    ("[parallel]\ncluster = \"off\"\nbandwidth = \"1gbit\"\n", "use --cluster on"),
    ("[parallel]\ncluster = \"on\"\nbandwidth = \"fast\"\n", "bandwidth 'fast' is not understood"),
    ("[parallel]\nstrategy = \"ps:servers=1,dedicated=true\"\n", "caramel train does not run dedicated ps servers"),
    ("[run\nsteps = 1\n", "not valid TOML"),
    ("run = 3\n", "[run] must be a table"),
])
def test_bad_toml_names_the_key(tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(CaramelError) as e:
        load_file(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(CaramelError, match="no such file"):
        load_file(tmp_path / "nope.toml")


def test_bad_flag_values_name_the_flag():
    with pytest.raises(CaramelError, match="--lr must be >= 0"):
        parse(["--lr", "-1"])
    with pytest.raises(CaramelError, match="--steps must be an integer"):
        parse(["--steps", "ten"])


def test_cli_reports_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text("[optim]\nlrr = 1.0\n")
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("caramel train: error:") and "optim.'lrr'" in err[0]


def test_script_args_need_a_script(capsys):
    assert main(["train", "--workers", "1", "--", "--epochs", "3"]) == 2
    assert "arguments after `--` are for --script" in capsys.readouterr().err


def test_help_documents_every_option_with_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for flag in ("--lr", "--batch-size", "--workers", "--bandwidth", "--checkpoint-every", "--keep-last", "--resume",
                 "--remainder", "--stop-after-steps", "--script", "--json"):
        assert flag in out
    assert "(samples)" in out and "(steps)" in out and "(seconds)" in out


@pytest.mark.parametrize("text, expected", [
    ("caramel:overlpa=forward", "did you mean 'overlap'"),
    ("dpp", "did you mean 'ddp'"),
    ("caramel:overlap=sideways", "overlap must be one of"),
    ("ddp:bucket_cap_mb=0", "bucket_cap_mb must be a positive"),
])
def test_a_bad_strategy_is_one_clear_error(text, expected):
    with pytest.raises(CaramelError, match=expected):
        parse(["--strategy", text])


def test_strategy_options_parse_by_type():
    cfg = parse(["--strategy", "caramel:overlap=forward,planner=fifo,bucket_cap_mb=5"])
    from caramel.strategies import STRATEGIES
    spec = STRATEGIES.spec(cfg.parallel.strategy)
    assert spec.options.bucket_cap_mb == 5.0 and spec.options.overlap == "forward"
