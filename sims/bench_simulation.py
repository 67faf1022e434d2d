"""`bench simulation`: what Flower + Ray cost per run and per round, against the same arithmetic in a loop.

Each run is a fresh child process (as `flwr run` would be), so start-up includes imports, Ray and
actor start-up. The two kinds alternate (flower, loop, loop, flower, ...) and the report takes
medians over `--runs` of each:
- flower: dirichlet_fl.simulation.simulate, the real ServerApp and ClientApp on Ray. Per-round times
  come from the `seconds` column of the run's rounds.csv (the server's clock, written as each round
  ends), so no log parsing is needed;
- loop: sims.fedavg_loop.run_fedavg in one process, timing each round itself.

Steady-state seconds per round: the median duration of rounds 2..R (round 1 also calibrates every
client and warms caches). Fixed start-up: wall time of the process minus R x the steady round, i.e.
everything that does not grow with the number of rounds. Peak memory: the largest sum of resident
set sizes over the child and all its descendants (Ray's GCS, raylet, workers and actors), sampled
from /proc every 0.2 s. RSS counts shared pages once per process, so the sum over-states memory
that processes share (torch's libraries, Ray's object store); it is the conservative figure, and
the peak sum of proportional set sizes (PSS, shared pages split among their users) is reported
beside it, with each process's share at the peak.

The loop runs torch with the threads a Flower client gets (THREADS_PER_CLIENT), and Ray's workers
run at the loop's priority (--ray-worker-niceness 0; Ray's default is 15, measured here to make rounds
several times slower whenever other work shares the cores), so that the two kinds differ by the
engine only.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
from flwr.common.config import get_fused_config_from_dir, parse_config_args

from dirichlet_fl.simulation import APP_DIR

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


def tree_memory(root: int) -> list[tuple[str, int, int]]:
    """_read_memory of `root` and every descendant still alive."""
    children = _children_map()
    pending, found = [root], []
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        memory = _read_memory(pid)
        if memory is not None:
            found.append(memory)
    return found


class PeakMemory(threading.Thread):
    """Samples tree_memory(pid) every SAMPLE_INTERVAL seconds until stopped; keeps the sample with the
    largest RSS sum (and the largest PSS sum, which counts shared pages once)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_rss = 0
        self.peak_pss = 0
        self.at_peak: list[tuple[str, int, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            sample = tree_memory(self.pid)
            rss = sum(m[1] for m in sample)
            if rss > self.peak_rss:
                self.peak_rss, self.at_peak = rss, sample
            self.peak_pss = max(self.peak_pss, sum(m[2] for m in sample))
            self._stop_event.wait(SAMPLE_INTERVAL)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _child_command(kind: str, overrides: dict[str, Any], clients: int, out: Path) -> list[str]:
    payload = json.dumps({"kind": kind, "overrides": overrides, "clients": clients, "out": str(out)})
    return [sys.executable, "-m", "sims.bench_simulation", payload]


def measure_run(kind: str, overrides: dict[str, Any], clients: int, out: Path, niceness: int) -> dict[str, Any]:
    """Run one child process of `kind` (flower or loop); return wall time, round seconds and peak memory.
    Ray starts its workers (the Flower clients) at `niceness`."""
    out.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, RAY_NICENESS_VARIABLE: str(niceness)}
    start = time.perf_counter()
    with open(out / "child.log", "w") as log:
        child = subprocess.Popen(_child_command(kind, overrides, clients, out), cwd=APP_DIR, stdout=log,
                                 stderr=subprocess.STDOUT, env=environment)
        sampler = PeakMemory(child.pid)
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
            "final_accuracy": _final_accuracy(out)}


def _final_accuracy(out: Path) -> float:
    return float(json.loads((out / "final.json").read_text())["final_accuracy"])


def steady_and_fixed(run: dict[str, Any]) -> tuple[float, float]:
    """(steady seconds per round = median of rounds 2..R, fixed seconds = wall - R x steady)."""
    rounds = run["round_seconds"]
    steady = statistics.median(rounds[1:] if len(rounds) > 1 else rounds)
    return steady, run["wall_seconds"] - len(rounds) * steady


def _child_flower(overrides: dict[str, Any], clients: int, out: Path) -> None:
    """One Flower run; per-round durations from the cumulative `seconds` column of rounds.csv."""
    from dirichlet_fl.simulation import simulate

    simulate(overrides | {"results-dir": str(out), "run-name": "run"}, num_supernodes=clients)
    with open(out / "run" / "rounds.csv") as handle:
        cumulative = [float(row["seconds"]) for row in csv.DictReader(handle)]
    durations = [later - earlier for earlier, later in zip([0.0, *cumulative], cumulative)]
    (out / "round_seconds.json").write_text(json.dumps(durations))
    summary = json.loads((out / "run" / "summary.json").read_text())
    (out / "final.json").write_text(json.dumps({"final_accuracy": summary["final_accuracy"]}))


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
    return {
        "flower": flower,
        "loop": loop,
        "overhead_seconds_per_round": overhead,
        "extra_fixed_seconds": flower["fixed_seconds"] - loop["fixed_seconds"],
        "targets": {
            "overhead_seconds_per_round": {"target": f"<= {TARGET_OVERHEAD_SECONDS}",
                                           "met": overhead <= TARGET_OVERHEAD_SECONDS},
            "flower_peak_rss_bytes": {"target": f"<= {TARGET_PEAK_BYTES}",
                                      "met": flower["max_peak_rss_bytes"] <= TARGET_PEAK_BYTES},
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
    for kind in ("flower", "loop"):
        s = report[kind]
        lines.append(
            f"  {kind:<6} fixed {s['fixed_seconds']:6.2f} s  steady {s['steady_seconds_per_round']:6.3f} s/round  "
            f"wall {s['wall_seconds']:6.2f} s  peak RSS {s['peak_rss_bytes'] / 1024**3:5.2f} GB "
            f"(PSS {s['peak_pss_bytes'] / 1024**3:4.2f} GB)  "
            f"final accuracy {s['final_accuracy']:.4f}"
        )
    for key, target in report["targets"].items():
        value = report["overhead_seconds_per_round"] if key.startswith("overhead") else report["flower"][
            "max_peak_rss_bytes"]
        lines.append(f"  {key} = {value:.4g} (target {target['target']}: {'met' if target['met'] else 'MISSED'})")
    return lines


def _child_main(payload: str) -> None:
    job = json.loads(payload)
    child = _child_flower if job["kind"] == "flower" else _child_loop
    child(job["overrides"], job["clients"], Path(job["out"]))


if __name__ == "__main__":
    _child_main(sys.argv[1])
