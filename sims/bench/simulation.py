"""`bench simulation`: what Flower + Ray cost per run and per round, against the same arithmetic in a loop.

Each run is a fresh child process, the kinds alternating: flower (dirichlet_fl.simulation.simulate, the
real ServerApp and ClientApp on Ray; round times from rounds.csv's `seconds`) and loop
(sims.fedavg_loop.run_fedavg, timing its own rounds, with the threads a Flower client gets). Steady
seconds per round are the median of rounds 2..R, fixed start-up is wall time minus R steady rounds, and
peak memory the largest RSS (and PSS) summed over the child and its descendants, sampled from /proc.
Ray's workers run at the loop's priority so the kinds differ by the engine only. BENCHMARKS.md,
section 3, has the method and the results.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from flwr.common.config import get_fused_config_from_dir, parse_config_args

from dirichlet_fl.paths import APP_DIR, stage_app

SAMPLE_INTERVAL = 0.2
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
TARGET_OVERHEAD_SECONDS = 0.5
TARGET_PEAK_BYTES = 3 * 1024**3
RAY_NICENESS_VARIABLE = "RAY_worker_niceness"
"""Ray starts its worker processes (here: the ClientApp actors) at this niceness; Ray's default is 15."""
THREADS_PER_CLIENT = 1
"""Torch threads in the loop: what Ray gives each ClientApp actor (OMP_NUM_THREADS = its 1 CPU). With 2
threads on a busy 2-core machine, tiny OpenMP-parallel ops wait for a descheduled thread and a round
can take 10x longer (measured: 0.05-0.1 s against 0.4-2.4 s)."""


def _children_map() -> dict[int, list[int]]:
    """ppid -> pids, for every process visible in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _read_memory(pid: int) -> tuple[str, int, int] | None:
    """(command name, resident bytes, proportional set size bytes) of one process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            name = handle.read().strip()
        with open(f"/proc/{pid}/statm") as handle:
            rss = int(handle.read().split()[1]) * PAGE_SIZE
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            pss = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return None
    return name, rss, pss


def _descendants(roots: list[int]) -> list[int]:
    """`roots` and every process below them."""
    children = _children_map()
    pending, found = list(roots), []
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.append(pid)
            pending.extend(children.get(pid, []))
    return found


def tree_memory(roots: list[int]) -> list[tuple[str, int, int]]:
    """_read_memory of `roots` and every descendant still alive."""
    return [memory for memory in map(_read_memory, _descendants(roots)) if memory is not None]


class PeakMemory(threading.Thread):
    """Samples tree_memory(roots()) every SAMPLE_INTERVAL seconds until stopped; keeps the sample with the
    largest RSS sum (and the largest PSS sum, which counts shared pages once). `roots` is asked at every
    sample: a detached process (flwr run's SuperLink) joins the measured set once it exists."""

    def __init__(self, roots: Callable[[], list[int]]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.peak_rss = 0
        self.peak_pss = 0
        self.at_peak: list[tuple[str, int, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            sample = tree_memory(self.roots())
            rss = sum(m[1] for m in sample)
            if rss > self.peak_rss:
                self.peak_rss, self.at_peak = rss, sample
            self.peak_pss = max(self.peak_pss, sum(m[2] for m in sample))
            self._stop_event.wait(SAMPLE_INTERVAL)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _child_command(kind: str, overrides: dict[str, Any], clients: int, out: Path, gpus_per_client: float) -> list[str]:
    payload = json.dumps({"kind": kind, "overrides": overrides, "clients": clients, "out": str(out),
                          "gpus_per_client": gpus_per_client})
    return [sys.executable, "-m", "sims.bench.simulation", payload]


def measure_run(kind: str, overrides: dict[str, Any], clients: int, out: Path, niceness: int,
                gpus_per_client: float = 0.0) -> dict[str, Any]:
    """Run one child process of `kind` (flower or loop); return wall time, round seconds and peak memory.
    Ray starts its workers (the Flower clients) at `niceness`; each Flower client gets `gpus_per_client`
    GPUs (0.25: four share one)."""
    out.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, RAY_NICENESS_VARIABLE: str(niceness)}
    start = time.perf_counter()
    with open(out / "child.log", "w") as log:
        command = _child_command(kind, overrides, clients, out, gpus_per_client)
        child = subprocess.Popen(command, cwd=APP_DIR, stdout=log, stderr=subprocess.STDOUT, env=environment)
        sampler = PeakMemory(lambda: [child.pid])
        sampler.start()
        code = child.wait()
        sampler.stop()
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{kind} run failed with exit code {code}; see {out / 'child.log'}")
    rounds = json.loads((out / "round_seconds.json").read_text())
    processes = sorted(sampler.at_peak, key=lambda m: -m[1])
    return {"kind": kind, "wall_seconds": wall, "round_seconds": rounds, "peak_rss_bytes": sampler.peak_rss,
            "peak_pss_bytes": sampler.peak_pss, "processes_at_peak": [
                {"name": name, "rss_bytes": rss, "pss_bytes": pss} for name, rss, pss in processes],
            **_final(out)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _processes_naming(text: str) -> list[int]:
    """PIDs whose command line contains `text`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if text.encode() in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _stop(pids: list[int]) -> None:
    """SIGTERM `pids` and their descendants, SIGKILL what is left after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in _descendants(pids) if _read_memory(pid) is not None]
        for pid in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_read_memory(pid) is not None for pid in alive):
            time.sleep(0.2)


def _run_config_text(overrides: dict[str, Any]) -> str:
    """`flwr run --run-config` text: strings quoted, booleans lower-case."""
    def value(item: Any) -> str:
        if isinstance(item, bool):
            return str(item).lower()
        return json.dumps(item) if isinstance(item, str) else repr(item)
    return " ".join(f"{key}={value(item)}" for key, item in overrides.items())


def measure_flwr_run(overrides: dict[str, Any], clients: int, out: Path, niceness: int) -> dict[str, Any]:
    """`flwr run` as scripts/run.sh runs it, on a snapshot of the app (which Flower may rewrite; the checkout
    stays untouched), with a local SuperLink of its own (its own Flower home and ports, started from a
    folder holding no copy of the project). The SuperLink runs detached; it starts
    the SuperExec and the simulation process, which starts Ray. Peak memory is summed over `flwr run`
    and the SuperLink's whole tree; the SuperLink is stopped (by PID) afterwards."""
    out = out.resolve()
    home, neutral = out / "flwr-home", out / "cwd"
    neutral.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, "FLWR_HOME": str(home), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
                   "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()), "FLWR_TELEMETRY_ENABLED": "0",
                   "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", RAY_NICENESS_VARIABLE: str(niceness),
                   "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    environment.pop("PYTHONPATH", None)
    run_config = _run_config_text(overrides | {"results-dir": str(out), "run-name": "run"})
    app = stage_app(APP_DIR, out / "app")
    command = [str(Path(sys.executable).with_name("flwr")), "run", str(app), "--stream",
               "--federation-config", f"num-supernodes={clients}", "--run-config", run_config]

    def superlink() -> list[int]:
        return _processes_naming(f"{home}/local-superlink")

    start = time.perf_counter()
    try:
        with open(out / "child.log", "w") as log:
            child = subprocess.Popen(command, cwd=neutral, stdout=log, stderr=subprocess.STDOUT, env=environment)
            sampler = PeakMemory(lambda: [child.pid, *superlink()])
            sampler.start()
            code = child.wait()
            sampler.stop()
    finally:
        _stop(superlink())
    wall = time.perf_counter() - start
    summary = out / "run" / "summary.json"
    if code != 0 or not summary.is_file():
        raise RuntimeError(f"flwr run failed (exit code {code}, no summary.json); see {out / 'child.log'}")
    with open(out / "run" / "rounds.csv") as handle:
        rounds = list(csv.DictReader(handle))
    cumulative = [float(row["seconds"]) for row in rounds]
    processes = sorted(sampler.at_peak, key=lambda m: -m[1])
    return {"kind": "flwr-run", "wall_seconds": wall,
            "failed_client_rounds": sum(int(row["failed"]) for row in rounds),
            "round_seconds": [later - earlier for earlier, later in zip([0.0, *cumulative], cumulative)],
            "peak_rss_bytes": sampler.peak_rss, "peak_pss_bytes": sampler.peak_pss,
            "processes_at_peak": [{"name": name, "rss_bytes": rss, "pss_bytes": pss} for name, rss, pss in processes],
            "final_accuracy": float(json.loads(summary.read_text())["final_accuracy"])}


def _final(out: Path) -> dict[str, Any]:
    """The child's final accuracy, and (Flower runs) how many client rounds failed: a run whose actor
    was killed (e.g. by Ray's out-of-memory monitor) still ends with exit code 0."""
    final = json.loads((out / "final.json").read_text())
    return {
        "final_accuracy": float(final["final_accuracy"]),
        "failed_client_rounds": final.get("failed_client_rounds", 0),
    }


def steady_and_fixed(run: dict[str, Any]) -> tuple[float, float]:
    """(steady seconds per round = median of rounds 2..R, fixed seconds = wall - R x steady)."""
    rounds = run["round_seconds"]
    steady = statistics.median(rounds[1:] if len(rounds) > 1 else rounds)
    return steady, run["wall_seconds"] - len(rounds) * steady


def _child_flower(overrides: dict[str, Any], clients: int, out: Path, gpus_per_client: float = 0.0) -> None:
    """One Flower run; per-round durations from the cumulative `seconds` column of rounds.csv."""
    from dirichlet_fl.simulation import simulate

    simulate(overrides | {"results-dir": str(out), "run-name": "run"}, num_supernodes=clients,
             num_gpus_per_client=gpus_per_client)
    with open(out / "run" / "rounds.csv") as handle:
        rounds = list(csv.DictReader(handle))
    cumulative = [float(row["seconds"]) for row in rounds]
    durations = [later - earlier for earlier, later in zip([0.0, *cumulative], cumulative)]
    (out / "round_seconds.json").write_text(json.dumps(durations))
    summary = json.loads((out / "run" / "summary.json").read_text())
    (out / "final.json").write_text(json.dumps({"final_accuracy": summary["final_accuracy"],
                                                "failed_client_rounds": sum(int(row["failed"]) for row in rounds)}))


def _child_loop(overrides: dict[str, Any], clients: int, out: Path) -> None:
    """The same run as a plain loop; per-round durations measured in the loop. Torch gets the threads a
    Flower client gets: Ray sets OMP_NUM_THREADS to the actor's CPUs (simulate's default: 1)."""
    import torch

    from dirichlet_fl.config import RunConfig
    from sims.fedavg_loop import run_fedavg

    torch.set_num_threads(THREADS_PER_CLIENT)
    config = RunConfig.from_run_config(get_fused_config_from_dir(APP_DIR, overrides))
    result = run_fedavg(config, clients)
    (out / "round_seconds.json").write_text(json.dumps([r.seconds for r in result.rounds]))
    (out / "final.json").write_text(json.dumps({"final_accuracy": result.final_accuracy}))




def parse_overrides(text: str) -> dict[str, Any]:
    """`flwr run --run-config` syntax to a dict, validated against RunConfig."""
    from dirichlet_fl.config import RunConfig

    try:
        overrides = parse_config_args([text]) if text.strip() else {}
    except click.ClickException as error:
        raise ValueError(f"--run-config={text!r}: {error.message}") from None
    RunConfig.from_run_config(get_fused_config_from_dir(APP_DIR, overrides))
    return overrides



def _summarise(runs: list[dict[str, Any]]) -> dict[str, float]:
    pairs = [steady_and_fixed(run) for run in runs]
    return {
        "steady_seconds_per_round": statistics.median([steady for steady, _ in pairs]),
        "fixed_seconds": statistics.median([fixed for _, fixed in pairs]),
        "wall_seconds": statistics.median([run["wall_seconds"] for run in runs]),
        "peak_rss_bytes": statistics.median([run["peak_rss_bytes"] for run in runs]),
        "max_peak_rss_bytes": max(run["peak_rss_bytes"] for run in runs),
        "peak_pss_bytes": statistics.median([run["peak_pss_bytes"] for run in runs]),
        "final_accuracy": statistics.median([run["final_accuracy"] for run in runs]),
        "failed_client_rounds": sum(run["failed_client_rounds"] for run in runs),
    }


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """Alternate flower and loop runs; return medians, the per-round overhead and the peak memory."""
    if args.runs < 1 or args.clients < 1:
        raise ValueError("--runs and --clients must be >= 1")
    overrides = parse_overrides(args.run_config)
    runs: dict[str, list[dict[str, Any]]] = {"flower": [], "loop": []}
    for i in range(args.runs):
        for kind in ("flower", "loop") if i % 2 == 0 else ("loop", "flower"):
            runs[kind].append(measure_run(kind, overrides, args.clients, out_dir / f"{kind}-{i}",
                                          args.ray_worker_niceness))
    flower, loop = _summarise(runs["flower"]), _summarise(runs["loop"])
    overhead = flower["steady_seconds_per_round"] - loop["steady_seconds_per_round"]
    config = get_fused_config_from_dir(APP_DIR, overrides)
    extra: dict[str, Any] = {}
    if args.flwr_run:
        runs["flwr-run"] = [
            measure_flwr_run(overrides, args.clients, out_dir / f"flwr-run-{i}", args.ray_worker_niceness)
            for i in range(args.runs)
        ]
        extra["flwr-run"] = _summarise(runs["flwr-run"])
    memory_kind = "flwr-run" if args.flwr_run else "flower"
    peak = (extra.get("flwr-run") or flower)["max_peak_rss_bytes"]
    return {
        "flower": flower,
        "loop": loop,
        **extra,
        "overhead_seconds_per_round": overhead,
        "extra_fixed_seconds": flower["fixed_seconds"] - loop["fixed_seconds"],
        "targets": {
            "overhead_seconds_per_round": {"target": f"<= {TARGET_OVERHEAD_SECONDS}",
                                           "met": overhead <= TARGET_OVERHEAD_SECONDS},
            f"{memory_kind}_peak_rss_bytes": {"target": f"<= {TARGET_PEAK_BYTES}", "met": peak <= TARGET_PEAK_BYTES},
        },
        "runs": runs,
        "config": {"clients": args.clients, "runs": args.runs, "overrides": overrides, "run_config": config,
                   "sample_interval_seconds": SAMPLE_INTERVAL, "ray_worker_niceness": args.ray_worker_niceness,
                   "loop_threads": THREADS_PER_CLIENT},
    }


def summary_lines(report: dict[str, object]) -> list[str]:
    """Human-readable lines: per kind, then overhead and memory against their targets."""
    lines = [f"{report['config']['clients']} clients, {report['config']['run_config']['num-server-rounds']} rounds, "
             f"median of {report['config']['runs']} runs each:"]
    for kind in ("flower", "loop", "flwr-run"):
        if kind not in report:
            continue
        s = report[kind]
        lines.append(
            f"  {kind:<8} fixed {s['fixed_seconds']:6.2f} s  steady {s['steady_seconds_per_round']:6.3f} s/round  "
            f"wall {s['wall_seconds']:6.2f} s  peak RSS {s['peak_rss_bytes'] / 1024**3:5.2f} GB "
            f"(PSS {s['peak_pss_bytes'] / 1024**3:4.2f} GB)  "
            f"final accuracy {s['final_accuracy']:.4f}"
            + (
                f"  ({s['failed_client_rounds']} client rounds FAILED: see child.log)"
                if s["failed_client_rounds"]
                else ""
            )
        )
    for key, target in report["targets"].items():
        value = report["overhead_seconds_per_round"] if key.startswith("overhead") else report[
            key.removesuffix("_peak_rss_bytes")]["max_peak_rss_bytes"]
        lines.append(f"  {key} = {value:.4g} (target {target['target']}: {'met' if target['met'] else 'MISSED'})")
    return lines


def _child_main(payload: str) -> None:
    job = json.loads(payload)
    if job["kind"] == "flower":
        _child_flower(job["overrides"], job["clients"], Path(job["out"]), job["gpus_per_client"])
    else:
        _child_loop(job["overrides"], job["clients"], Path(job["out"]))


if __name__ == "__main__":
    _child_main(sys.argv[1])
