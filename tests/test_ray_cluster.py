"""The simulation on an existing Ray cluster, on loopback: `ray start --head` plus one `ray start --address`
worker node, and Flower's Ray backend joining that cluster (Ray's `address`) instead of starting its own.

The test starts the two nodes itself (`ray start --block`, each in a session of its own, on free ports
and in a temporary folder of its own) and stops them itself, by PID: every process of the two nodes'
trees, and any process whose command line names the cluster's temporary folder. Never `ray stop`,
which would stop every Ray cluster of this user, other people's runs included.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dirichlet_fl.simulation import APP_DIR
from tests.processes import descendants

pytestmark = pytest.mark.xdist_group("flwr-run")  # scripts/test.sh: never beside `flwr run`, whose Ray joins a cluster

RAY = str(Path(sys.executable).with_name("ray"))
START_TIMEOUT = 60.0
RUN_TIMEOUT = 150.0
WORKER_STARTS = 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _naming(text: str) -> set[int]:
    """Processes whose command line contains `text` (our cluster's temporary folder)."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if text.encode() in handle.read():
                    found.add(int(entry))
        except (OSError, ValueError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ray_processes(nodes: list[subprocess.Popen], temp_dir: str) -> set[int]:
    return (descendants([node.pid for node in nodes]) | _naming(temp_dir)) - {os.getpid()}


def stop_cluster(nodes: list[subprocess.Popen], temp_dir: str) -> None:
    """SIGTERM every process of our nodes, SIGKILL what is left after 10 s, reap our children."""
    pids = _ray_processes(nodes, temp_dir)
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            for node in nodes:
                node.poll()
            time.sleep(0.2)
        pids = {pid for pid in pids | _ray_processes(nodes, temp_dir) if _alive(pid)}
        if not pids:
            break
    for node in nodes:
        node.wait(timeout=10)


def _ports() -> list[str]:
    """Free ports for every fixed-port service of one Ray node (its defaults would clash with other clusters)."""
    options = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
               "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
    return [item for option in options for item in (option, str(free_port()))]


def _wait_for_port(address: str, log: Path) -> None:
    """Until the head's GCS accepts connections at `address` (cheaper than a driver's ray.init)."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"the head's GCS did not listen at {address}; see {log}")


def _wait_for_nodes(address: str, count: int, log: Path, worker: subprocess.Popen) -> bool:
    """Until the cluster at `address` has `count` live nodes (asked from a separate driver process): True; False
    as soon as the `worker` node's `ray start` has exited (it gives up when its raylet has not registered within
    the 30 s fixed in ray/_private/node.py, which a loaded machine can exceed)."""
    probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
             "print(sum(node['Alive'] for node in ray.nodes()))")
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            return False
        done = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
            return True
        time.sleep(1.0)
    raise AssertionError(f"the cluster at {address} did not reach {count} nodes; see {log}")


@pytest.fixture
def loopback_cluster(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """A head node and one worker node on this machine, one CPU each; yields (address, [head, worker]). A worker
    node whose start timed out is started again, at most WORKER_STARTS times in all."""
    temp_dir = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # Ray's socket paths must stay short
    address = f"127.0.0.1:{free_port()}"
    environment = {**os.environ, "RAY_worker_niceness": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    common = ["--block", "--num-cpus", "1", "--num-gpus", "0", "--disable-usage-stats"]
    head = [RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", address.split(":")[1],
            "--temp-dir", temp_dir, "--include-dashboard", "false", "--ray-client-server-port", str(free_port()),
            *common, *_ports()]
    started: list[subprocess.Popen] = []  # every node process, a worker that gave up included: all are stopped
    log = tmp_path / "ray-nodes.log"
    try:
        with open(log, "w") as handle:
            def start(command: list[str]) -> subprocess.Popen:
                started.append(subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=environment,
                                                start_new_session=True))
                return started[-1]

            head_node = start(head)
            _wait_for_port(address, log)
            for _ in range(WORKER_STARTS):
                worker_node = start([RAY, "start", "--address", address, "--node-ip-address", "127.0.0.1", *common,
                                     *_ports()])
                if _wait_for_nodes(address, 2, log, worker_node):
                    break
            else:
                raise AssertionError(f"the worker node's `ray start` gave up {WORKER_STARTS} times; see {log}")
            yield address, [head_node, worker_node]
    finally:
        stop_cluster(started, temp_dir)
    assert not {pid for pid in _naming(temp_dir) if _alive(pid)}, "a Ray process of the test survived"


def _actors_per_node(nodes: list[subprocess.Popen], seen: list[set[int]], stop: threading.Event) -> None:
    """Record, for each node, whether a Flower ClientApp actor ran in its process tree."""
    while not stop.is_set():
        for index, node in enumerate(nodes):
            for pid in descendants([node.pid]):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        if b"ClientAppActor" in handle.read():
                            seen[index].add(pid)
                except OSError:
                    continue
        stop.wait(0.5)


def test_the_simulation_runs_on_an_existing_two_node_ray_cluster(tmp_path: Path, loopback_cluster) -> None:
    address, nodes = loopback_cluster
    overrides = {"num-server-rounds": 2, "local-steps": 3, "partitioner": "iid", "fraction-evaluate": 0.0,
                 "results-dir": str(tmp_path), "run-name": "cluster"}
    driver = ("import json, sys; from dirichlet_fl.simulation import simulate; "
              "simulate(json.loads(sys.argv[1]), num_supernodes=4, ray_address=sys.argv[2])")
    seen: list[set[int]] = [set(), set()]
    stop = threading.Event()
    watcher = threading.Thread(target=_actors_per_node, args=(nodes, seen, stop), daemon=True)
    watcher.start()
    try:
        done = subprocess.run([sys.executable, "-c", driver, json.dumps(overrides), address], cwd=APP_DIR,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT,
                              env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"})
    finally:
        stop.set()
        watcher.join()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    assert summary["rounds"] == 2 and sum(client["steps"] for client in summary["clients"]) == 4 * 2 * 3
    assert all(seen), f"ClientApp actors ran on nodes {[bool(s) for s in seen]}: both nodes should host one"
