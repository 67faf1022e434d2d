"""`dirichlet-fl bench <what>`: speed, memory and accuracy benchmarks, measured side by side (sims/).

  steps       one training step: plain cross-entropy vs the Dirichlet loss vs Opacus DP-SGD
  accountant  one r* solve (calibrate_r) over the paper's settings, vs a plain loop over orders
  simulation  a default federated run on Flower + Ray vs the same arithmetic in a plain loop
  accuracy    accuracy vs eps on MNIST digits: none / Dirichlet / DP-SGD, IID, non-IID, centralized
  gpu         seconds per epoch of the paper's CIFAR10 ResNet-18 setting (needs a GPU; --synthetic to smoke-test)

Each writes config.json (its options, the machine, the date) and results.json to a folder of its
own (--out, default results/bench/<what>-<time>), and prints a summary, or the results as one JSON
object with --json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

PROG = "dirichlet-fl bench"
BENCHMARKS = {
    "steps": ("sims.bench_steps", "time one training step per mechanism"),
    "accountant": ("sims.bench_accountant", "time one r* solve"),
    "simulation": ("sims.bench_simulation", "Flower + Ray against a plain loop: start-up, per round, memory"),
    "accuracy": ("sims.accuracy_vs_epsilon", "accuracy against eps, federated and centralized"),
    "gpu": ("sims.gpu_cifar10", "seconds per epoch, CIFAR10 ResNet-18, Dirichlet vs DP-SGD"),
}


def _module(name: str) -> ModuleType:
    """The sims module of a benchmark, imported on use (each pulls in torch, Flower or Opacus)."""
    import importlib

    return importlib.import_module(BENCHMARKS[name][0])


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `bench <what> [options]` with `func=run`.

    Each benchmark's options are parsed in run() by a parser built from its sims module, so that
    the other subcommands do not import the benchmarks (Flower, Opacus) just to build the CLI."""
    parser = subparsers.add_parser("bench", help="speed, memory and accuracy benchmarks",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", choices=list(BENCHMARKS), help="which benchmark")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="its options; see `bench <what> --help`")
    parser.set_defaults(func=run, parser_class=type(parser))


def benchmark_parser(name: str, parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The option parser of one benchmark: its module's options plus --json and --out."""
    parser = parser_class(prog=f"{PROG} {name}", description=BENCHMARKS[name][1])
    _module(name).add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument("--out", default=None, help="results folder (default results/bench/<what>-<time>)")
    return parser


def machine() -> dict[str, object]:
    """Where a benchmark ran: CPU model, cores, memory, load, versions, date and git commit."""
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    memory_kb = next((int(line.split()[1]) for line in _lines("/proc/meminfo") if line.startswith("MemTotal")), 0)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(memory_kb / 1024**2, 1),
        "load_average": list(os.getloadavg()),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": _git_commit(),
    }


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent)
    except OSError:
        return None
    return done.stdout.strip() or None


def finite(value: object) -> object:
    """The value with every non-finite float replaced by 'inf', '-inf' or 'nan' (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _write(path: Path, payload: object) -> None:
    path.write_text(json.dumps(finite(payload), indent=2, allow_nan=False, default=str) + "\n")


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark; 0 on success, 2 with one stderr line for invalid input or missing data."""
    module = _module(args.benchmark)
    options = benchmark_parser(args.benchmark, args.parser_class).parse_args(args.options)
    out = Path(options.out or f"results/bench/{args.benchmark}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write(out / "config.json", {"command": f"{PROG} {args.benchmark} {' '.join(args.options)}".strip(),
                                     "options": vars(options), "machine": machine()})
        report = module.run(options, out)
    except (ValueError, FileNotFoundError, OSError) as error:
        print(f"{PROG} {args.benchmark}: error: {error}", file=sys.stderr)
        return 2
    report = {**report, "machine_after": {"load_average": list(os.getloadavg())}, "results_folder": str(out)}
    _write(out / "results.json", report)
    if options.json:
        print(json.dumps(finite(report), allow_nan=False, default=str))
    else:
        print("\n".join([*module.summary_lines(report), f"results: {out}"]))
    return 0
