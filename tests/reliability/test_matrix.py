"""The matrix runner and its Markdown, on hand-made results (no processes)."""
import pytest

from caramel.errors import CaramelError
from experiments.faults.matrix import render_markdown, select
from experiments.faults.result import FAULTS, FaultResult, MatrixConfig, error_line


def test_every_fault_class_is_registered():
    cats = {c for c, _, _ in FAULTS.values()}
    assert cats == {"process", "disagreement", "storage", "restart", "network"}
    assert "sigkill-worker" in select(None, include_slow=False) and "torchrun-restart" not in select(None, False)


def test_unknown_fault_names_are_a_caramel_error():
    with pytest.raises(CaramelError, match="no-such-fault"):
        select(["no-such-fault"], True)


def test_markdown_has_one_row_per_result_and_the_command():
    rs = [FaultResult("sigkill-worker", "process", "SIGKILL | rank 1", "x", True, 2.5, [1, -9], "m", "no", "none", True),
          FaultResult("plan-differs", "disagreement", "plans", "y", False, None, [None, 1], "", "n/a", "none", False)]
    text = render_markdown(rs, "python experiments/fault_matrix.py", MatrixConfig())
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == 2 and "2.50 s" in rows[0] and "SIGKILL \\| rank 1" in rows[0] and "**NO**" in rows[1]
    assert "`python experiments/fault_matrix.py`" in text and "1 of 2 passed" in text


def test_error_line_strips_torch_rank_prefix():
    err = "Traceback...\n[rank0]:   File x\n[rank0]: RuntimeError: caramel: rank 0: all-reduce of bucket 0 failed\n"
    assert error_line(err) == "RuntimeError: caramel: rank 0: all-reduce of bucket 0 failed"
