"""Workers on this machine: one environment for every launcher, one loopback launcher."""
import os

from caramel.cluster.local import repo_root, run_local, worker_env


def test_worker_env_puts_this_checkout_first_once(monkeypatch):
    root = repo_root()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", root]))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = worker_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert os.path.isdir(os.path.join(root, "caramel"))


def test_worker_env_keeps_the_users_threads_unless_told(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert worker_env()["OMP_NUM_THREADS"] == "4"
    env = worker_env(threads=1)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"


def test_run_local_gives_each_rank_torchruns_variables(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import os, sys\n"
                      "print('rank', os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR'])\n"
                      "import caramel\n"
                      "sys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    rc, nodes = run_local(2, [str(script)], timeout_s=60, out=open(os.devnull, "w"))
    assert rc == 3
    assert "rank 0 2 127.0.0.1" in "".join(nodes[0].lines) and "rank 1 2 127.0.0.1" in "".join(nodes[1].lines)


def test_run_local_hosts_the_store_before_any_worker_starts(tmp_path):
    # a worker reaches the store as a client at once: no rank binds a port chosen earlier
    script = tmp_path / "w.py"
    script.write_text("import datetime, os\n"
                      "import torch.distributed as dist\n"
                      "assert os.environ['TORCHELASTIC_USE_AGENT_STORE'] == 'True'\n"
                      "s = dist.TCPStore('127.0.0.1', int(os.environ['MASTER_PORT']), None, is_master=False,\n"
                      "                  timeout=datetime.timedelta(seconds=5))\n"
                      "s.set('r' + os.environ['RANK'], 'up')\n"
                      "s.wait(['r0', 'r1'])\n"
                      "print('joined')\n")
    rc, nodes = run_local(2, [str(script)], timeout_s=60, out=open(os.devnull, "w"))
    assert rc == 0, [n.lines for n in nodes]
    assert all("joined" in "".join(n.lines) for n in nodes)
