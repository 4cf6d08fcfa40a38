"""The data bench end to end, small: two gloo ranks on a store, the plain DataLoader +
DistributedSampler vs the locality-aware loader; the server's byte counts and the loader
workers' own counts say what each mode fetched."""
import importlib

import pytest

from caramel.bench.data_bench import DataBenchConfig, run_data_bench
from caramel.data.format import write_random_dataset
from caramel.data.serve import serve_directory

SAMPLES = 64


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    write_random_dataset(root, SAMPLES, 2048, 8)
    return root


def _config(**kw):
    return DataBenchConfig(**dict(dict(ranks=2, batch_size=4, loader_workers=0, epochs=2, rounds=1, compute_s=0.0,
                                       store_rate_bps=200e6, store_latency_s=0.0, cache_share=1.0,
                                       modes=("remote", "locality"), timeout_s=60), **kw))


@pytest.mark.timeout(120)
def test_a_served_directory_locality_reads_nothing_remote_after_the_first_epoch(store_dir):
    report = run_data_bench(_config(), str(store_dir))
    rows = {r["mode"]: r for r in report["rows"]}
    data = report["data_bytes"]
    assert report["remote_bytes_from"] == "server" and report["num_samples"] == SAMPLES
    # the plain loader: every sample of the epoch by a range read, every epoch, all of them misses
    assert rows["remote"]["remote_bytes_per_epoch_steady"] == data
    assert rows["remote"]["requests_per_epoch_steady"] == SAMPLES
    assert rows["remote"]["tiers_per_epoch_steady"]["misses"] == SAMPLES
    assert rows["remote"]["tiers_per_epoch_steady"]["store_bytes"] == data  # the workers' count is the server's
    # locality: epoch 1 fetches each rank's home shards once, epoch 2 nothing
    assert rows["locality"]["remote_bytes_per_epoch_first"] >= data
    assert rows["locality"]["remote_bytes_per_epoch_steady"] == 0 and rows["locality"]["hit_rate_steady"] == 1.0
    # no loader workers: nothing to calibrate beside, no contention term; locality read no byte remote: no phases
    assert report["measured_costs"]["loaded"] is None and report["contention"] == 1.0
    assert all(r["predicted_step_s_one_calibration"] == r["predicted_step_s_before"] for r in rows.values())
    # each mode was calibrated right before its round: its steps alone only (no workers to run beside)
    for r in rows.values():
        assert [c["round"] for c in r["calibrations"]] == [0] and r["calibrations"][0]["loaded"] is None
        assert r["contention"] == 1.0 and r["compute_comm_s"] == report["compute_comm_floor_s"] > 0
    alone = [report["measured_costs"]["compute_comm_s"]] + [r["calibrations"][0]["alone_s"] for r in rows.values()]
    assert report["compute_comm_floor_s"] == min(alone)  # the quickest window of steps alone in the run
    # no loaded pass, no window for the request probe: no read time under load, the term off
    for r in rows.values():
        assert "request_s_under_load" not in r["calibrations"][0] and r["request_s_under_load"] is None
        assert r["calibrations"][0]["other_ranks"] == [{"rank": 1, "loaded": None}]  # rank 1 had no loaded pass either


@pytest.mark.timeout(120)
def test_a_served_directory_times_its_reads_inside_rank_0s_unscored_loaded_pass(store_dir):
    """With a loader worker, rank 0 opens a window over its calibration's first pass after the
    warm-up: the probe's reads (from an unshaped server of its own, not in the scored server's
    counts) lie inside it, and the plain loader's rows are charged their median."""
    report = run_data_bench(_config(loader_workers=1, modes=("remote",), compute_s=0.01, calibration_steps=12),
                            str(store_dir))
    (row,) = report["rows"]
    (cal,) = row["calibrations"]
    assert row["requests_per_epoch_steady"] == SAMPLES  # the probe's reads are not the mode's
    start, end = cal["loaded"]["probe_window_s"]
    assert cal["probe_window_length_s"] == end - start >= 10 * 0.01  # the 10 steps after the warm-up
    assert cal["request_s_under_load_reads"] >= 1 and cal["request_s_under_load"] > 0
    assert row["request_s_under_load"] == cal["request_s_under_load"] and row["request_s_under_load_charged"]
    assert report["request_probe"].startswith("rank 0's first")
    # rank 1's side of the same calibration and every rank's epochs, by rank: rank 0's are the row's own
    assert [o["rank"] for o in cal["other_ranks"]] == [1]
    assert set(cal["other_ranks"][0]["loaded"]) == {"step_s", "wait_s", "compute_s", "sync_s"}
    assert cal["other_ranks"][0]["loaded"]["compute_s"] >= 0.01 * 0.9
    assert len(row["wait_s_steady_ranks"]) == len(row["sync_s_steady_ranks"]) == 2
    assert row["wait_s_steady_ranks"][0] == row["wait_s_steady"] and row["sync_s_steady_ranks"][0] == row["sync_s_steady"]


@pytest.mark.timeout(120)
def test_an_http_store_is_read_as_it_is_and_counted_by_the_loaders(store_dir):
    with serve_directory(store_dir) as server:
        report = run_data_bench(_config(loader_workers=1), server.url)
        served = server.bytes_served
    rows = {r["mode"]: r for r in report["rows"]}
    assert report["remote_bytes_from"] == "loader workers' counters" and report["source"] == server.url
    assert rows["remote"]["remote_bytes_per_epoch_steady"] == report["data_bytes"]
    assert rows["locality"]["remote_bytes_per_epoch_steady"] == 0 and rows["locality"]["hit_rate_steady"] == 1.0
    assert rows["locality"]["remote_bytes_per_epoch_first"] == report["data_bytes"]  # each shard once, in a worker
    counted = sum(r["remote_bytes_per_epoch_steady"] + r["remote_bytes_per_epoch_first"] for r in rows.values())
    assert 0 < counted <= served  # the server also sent the index and the model's measurement reads
    # with a worker the ranks timed their steps beside it before the modes: the model's contention
    loaded, costs = report["measured_costs"]["loaded"], report["measured_costs"]
    assert loaded["step_s"] >= loaded["wait_s"] + loaded["compute_s"] + loaded["sync_s"] > 0
    assert report["contention"] == pytest.approx(max(1.0, loaded["step_s"] / (costs["compute_comm_s"] + costs["batch_s_pipe"])))
    assert all(r["predicted_step_s_one_calibration"] >= r["predicted_step_s_before"] for r in rows.values())
    # and right before each mode, beside that mode's own loader: the mode's contention, from its own steps alone
    for mode, r in rows.items():
        (cal,) = r["calibrations"]
        assert cal["mode"] == mode and cal["loaded"]["step_s"] >= cal["loaded"]["sync_s"] + cal["loaded"]["compute_s"]
        trip = costs["batch_s_shared"] if mode == "remote" else costs["batch_s_pipe"]
        floor = report["compute_comm_floor_s"]
        assert floor <= min(cal["alone_s"], costs["compute_comm_s"])
        assert r["contention"] == pytest.approx(max(1.0, cal["loaded"]["step_s"] / (floor + trip)))
        assert r["predicted_step_s"] == r["predicted_step_s_rounds"][0]  # one round: its own prediction
        # a store the bench does not serve: no probe, no read time under load (the model before the term)
        assert "request_s_under_load" not in cal and r["request_s_under_load"] is None
        assert r["predicted_step_s"] == r["predicted_step_s_overhead_alone"]


def test_bad_input_is_named(capsys, tmp_path):
    from caramel.cli import main

    assert main(["data-bench", "--modes", "remote,fast"]) == 2
    assert "'fast' is not a mode" in capsys.readouterr().err
    assert main(["data-bench", "--epochs", "1"]) == 2
    assert "--epochs must be >= 2" in capsys.readouterr().err
    assert main(["bench", "--data", str(tmp_path), "--compute", "fast"]) == 2
    assert "--compute 'fast' is not understood" in capsys.readouterr().err
    assert main(["bench", "--data", str(tmp_path / "nothing")]) == 2
    assert f"data store '{tmp_path / 'nothing'}'" in capsys.readouterr().err
    assert main(["data", "serve", str(tmp_path)]) == 2
    assert "index.json is not there" in capsys.readouterr().err


def test_data_make_writes_a_readable_data_set(tmp_path, capsys):
    from caramel.cli import main
    from caramel.data.store import Store

    assert main(["data", "make", str(tmp_path / "ds"), "--samples", "10", "--sample-bytes", "1kb",
                 "--samples-per-shard", "4"]) == 0
    index = Store(str(tmp_path / "ds")).index()
    assert index.num_samples == 10 and len(index.shards) == 3


def test_data_serve_serves_a_data_set_for_a_while(store_dir, capsys):
    import threading
    import time

    importlib.import_module("caramel.commands.data")  # imported here, so the server's seconds are not spent importing
    from caramel.cli import main
    from caramel.data.store import Store

    result = {}
    t = threading.Thread(target=lambda: result.update(rc=main(["data", "serve", str(store_dir), "--port", "0",
                                                               "--rate", "100mbit", "--seconds", "4"])))
    t.start()
    deadline = time.monotonic() + 4
    while "serving" not in result.setdefault("out", "") and time.monotonic() < deadline:
        time.sleep(0.05)
        result["out"] += capsys.readouterr().out
    url = result["out"].split(" at ")[1].split()[0]
    assert Store(url).index().num_samples == SAMPLES  # read through the served link
    t.join(timeout=10)
    assert result["rc"] == 0 and "served 1 requests" in capsys.readouterr().out


def test_network_cluster_refuses_a_remote_url(capsys):
    from caramel.cli import main

    assert main(["bench", "--data", "http://198.18.0.1:8000", "--network", "cluster"]) == 2
    assert "--network cluster serves a local directory" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_a_store_served_from_a_cluster_host_is_read_over_its_link_and_left_clean(store_dir):
    from caramel.cluster import netns

    if not netns.support().ok:
        pytest.skip(f"no emulated cluster here: {netns.support().reason}")
    # a loader worker, so each mode's round is calibrated beside its own loader, which must read nothing remote
    report = run_data_bench(_config(network="cluster", rank_rate_bps=1e9, loader_workers=1, calibration_steps=5),
                            str(store_dir))
    rows, data, c = {r["mode"]: r for r in report["rows"]}, report["data_bytes"], report["cluster"]
    assert report["remote_bytes_from"] != "server" and c["store_url"].startswith("http://198.1")
    assert rows["remote"]["remote_bytes_per_epoch_steady"] == data  # every sample by a range read, over the link
    assert rows["locality"]["remote_bytes_per_epoch_steady"] == 0
    # the server process's own count: what the ranks' workers counted, plus each rank's index reads
    assert all(r["calibrations"][0]["loaded"] is not None for r in rows.values())
    # the store's server runs on the store host: no probe here times it, the read-under-load term is off
    assert report["request_probe"].startswith("off: with --network cluster")
    assert all("request_s_under_load" not in r["calibrations"][0] and r["request_s_under_load"] is None
               for r in rows.values())
    assert c["server_totals"]["bytes"] > 0 and c["server_minus_counted_bytes"] == 0
    assert c["namespaces_left"] == [] and not [ns for ns in netns.list_netns() if ns.startswith(c["hosts"][0][:9])]


def test_entering_a_missing_namespace_is_one_clear_error():
    from caramel.bench.data_cluster import enter_host
    from caramel.errors import CaramelError

    with pytest.raises(CaramelError, match="network namespace caramel-no-such-host: /run/netns/caramel-no-such-host"):
        enter_host("caramel-no-such-host", "veth0")


def test_network_cluster_without_a_store_rate_is_refused_up_front(store_dir, monkeypatch):
    import caramel.bench.data_bench as bench
    from caramel.errors import CaramelError

    monkeypatch.setattr(bench.tempfile, "mkdtemp", lambda **_: pytest.fail("the bench started before the check"))
    with pytest.raises(CaramelError, match="--network cluster shapes the store's link with tc: give --store-rate"):
        run_data_bench(_config(network="cluster", store_rate_bps=None), str(store_dir))


@pytest.mark.timeout(30)
def test_the_store_servers_error_output_goes_to_its_log_and_its_end_is_named(tmp_path):
    """256 KiB of stderr would fill a pipe nobody reads and block the server; into a file it
    cannot, and the failure names the log's last line."""
    import subprocess
    import sys

    from caramel.bench.data_cluster import _wait_ready
    from caramel.errors import CaramelError

    log = tmp_path / "store-server.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('x' * 262144 + '\\nboom\\n'); "
                                 "sys.exit(3)"], stdout=subprocess.PIPE, stderr=f, text=True)
    with pytest.raises(CaramelError, match=rf"did not start within 20 s: boom \(its log: {log}\)"):
        _wait_ready(proc, 20, log)
    assert proc.returncode == 3


def test_the_parent_takes_each_ranks_message_by_its_kind():
    """Rank 0's calibration before the next mode may overtake another rank's last epoch message
    (each rank's queue sends in the background): neither is taken for the other."""
    import queue
    from types import SimpleNamespace

    from caramel.bench.data_bench import _Inbox

    q = queue.Queue()
    for message in [("epoch", (0, {}, [1.0], 0.1, 0.2)), ("calibration", {"mode": "locality"}),
                    ("epoch", (1, {}, [1.0], 0.1, 0.2))]:
        q.put(message)
    inbox = _Inbox(q, [SimpleNamespace(exitcode=None)], timeout_s=5)
    assert [inbox.get("epoch")[0], inbox.get("epoch")[0]] == [0, 1]
    assert inbox.get("calibration") == {"mode": "locality"}
    with pytest.raises(RuntimeError, match=r"failed or stalled \(exit codes \[1\]\)"):
        _Inbox(q, [SimpleNamespace(exitcode=1)], timeout_s=5).get("epoch")


def test_stored_records_of_the_previous_format_still_render():
    """The stored /1 and /2 records (one contention factor per run, or none at all) render beside
    the /3 ones the bench writes now; a field a record lacks is "-"."""
    import json
    from pathlib import Path

    from caramel.bench.data_report import REPORT_FORMAT, format_rows, stored_records

    assert REPORT_FORMAT == "caramel.data-bench/7"
    results = Path(__file__).resolve().parents[2] / "docs" / "results"
    records = {f"{path.name}:{name}": record for path in sorted(results.glob("data-bench-*.json"))
               for name, record in stored_records(json.loads(path.read_text())).items()
               if record["format"] in ("caramel.data-bench/1", "caramel.data-bench/2", "caramel.data-bench/3")}
    assert "data-bench-cluster.json:cluster-1" in records and len(records) > 10
    for name, record in records.items():
        table = format_rows(record, markdown=True).splitlines()
        assert len(table) == 2 + len(record["rows"]), name
        if "contention" not in record:
            assert all(line.split(" | ")[11] == "-" for line in table[2:]), name  # no factor to show


def test_the_record_names_the_code_that_made_it(tmp_path, monkeypatch, capsys):
    """`--json` carries the checkout's commit (`meta.code` in the strategy bench), so a later
    rescore can tell which loader and model a record's numbers came from."""
    import json
    from pathlib import Path

    from caramel.bench import data_cli
    from caramel.bench.data_report import stored_records
    from caramel.bench.provenance import code_version

    stored = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results" / "data-bench-data-side.json")
                        .read_text())
    record = next(iter(stored_records(stored).values()))
    monkeypatch.setattr(data_cli, "run_data_bench", lambda cfg, url: dict(record))
    assert data_cli.report(_config(), None, str(tmp_path / "r.json"), None) == 0
    code = json.loads((tmp_path / "r.json").read_text())["code"]
    assert code == code_version()
    # and that is this checkout's commit (or the package's version outside a git checkout)
    import re
    import subprocess

    import caramel
    from caramel.bench.provenance import package_root

    git = subprocess.run(["git", "-C", str(package_root()), "rev-parse", "--show-toplevel", "HEAD"],
                         capture_output=True, text=True)
    top, _, head = git.stdout.strip().partition("\n")
    if git.returncode == 0 and Path(top).resolve() == package_root():
        assert re.fullmatch(head[:12] + r"(-dirty)?", code), (code, head)
    else:
        assert code == f"caramel {caramel.__version__}"


def test_every_ranks_wait_and_all_reduce_are_kept_by_rank():
    """A rank other than 0 reports its calibration's means only (None without a loaded pass); the
    row keeps each rank's median over the steady epochs, and None for results that kept none."""
    from caramel.bench.data_bench_rank import other_rank_calibration
    from caramel.bench.data_report import _by_rank

    loaded = {"step_s": 7e-3, "wait_s": 1e-3, "compute_s": 4e-3, "sync_s": 2e-3, "steps_s": [7e-3] * 3}
    assert other_rank_calibration(1, {"loaded": loaded}) == {
        "rank": 1, "loaded": {"step_s": 7e-3, "wait_s": 1e-3, "compute_s": 4e-3, "sync_s": 2e-3}}
    assert other_rank_calibration(3, {"loaded": None}) == {"rank": 3, "loaded": None}
    # epochs 0..5 of 2 rounds x 3 epochs, [epoch][rank]; steady: each round's epochs 1 and 2
    per_epoch = [[9.0, 90.0], [1.0, 10.0], [2.0, 30.0], [9.0, 90.0], [4.0, 20.0], [3.0, 40.0]]
    assert _by_rank(per_epoch, [1, 2, 4, 5]) == [2.5, 25.0]
    assert _by_rank([], [1, 2]) is None
