"""ps_sim_hier_steps takes no options: --help answers without simulating, an unknown option is
refused, and no options prints one row per case."""
import pytest

from experiments.ps_sim_hier_steps import CASES, main


def test_help_answers_and_unknown_options_are_refused(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "nccl_s" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["--steps", "3"])
    assert refused.value.code == 2 and "unrecognized arguments: --steps 3" in capsys.readouterr().err


def test_no_options_prints_a_row_per_case(capsys):
    main([])
    lines = capsys.readouterr().out.splitlines()
    assert "nccl_s" in lines[0] and len(lines) == 1 + len(CASES)
