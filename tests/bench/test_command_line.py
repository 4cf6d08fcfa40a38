"""The reproducing command a bench report records: a non-default --timeout is part of it (a
configuration cut by its limit reads differently; review of branch G: the 190 s limit was lost)."""


def test_the_recorded_command_keeps_a_non_default_timeout():
    import argparse

    from caramel.bench import cli as bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    assert "--timeout" not in bench_cli.command_line(parser.parse_args(["--workers", "4"]))
    line = bench_cli.command_line(parser.parse_args(["--workers", "4", "--timeout", "190"]))
    assert line.endswith("--timeout 190") and "--workers 4" in line
