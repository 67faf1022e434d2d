"""`dirichlet-fl bench <what>`: speed, memory and accuracy benchmarks, measured side by side (sims/).

  steps       one training step: plain cross-entropy vs the Dirichlet loss vs Opacus DP-SGD
  accountant  one r* solve (calibrate_r): the paper's settings, near the floor, 313 random configurations
  simulation  a default federated run on Flower + Ray vs the same arithmetic in a plain loop
  scale       10 to 2,000 clients, a fixed 10 sampled per round: seconds per round, start-up, memory
  accuracy    accuracy vs eps on MNIST digits: none / Dirichlet / DP-SGD, IID, non-IID, centralized
              (a preset of `dirichlet-fl study`: its table.csv, table.md, tuning.csv, study.json, pictures)
  gpu         seconds per epoch of the paper's CIFAR10 ResNet-18 setting, then the federated job with
              fractional GPUs, clients per second (needs a GPU; --synthetic --gpus-per-client 0 to smoke-test)
  secagg      SecAgg+ per round: the protocol in-process, and (--flower) whole runs, against plain FedAvg
  client-dp   accuracy against client-level eps (DP-FedAvg) on MNIST t10k, per-example privacy on too

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
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

PROG = "dirichlet-fl bench"


def _steps_options(parser: argparse.ArgumentParser) -> None:
    """Options of `bench steps`."""
    from dirichlet_fl.models.norms import MODELS
    parser.add_argument("--model", choices=MODELS, default="cnn", help="network (default cnn)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step (default 64)")
    parser.add_argument("--image-size", type=int, default=28, help="square input side (default 28, MNIST)")
    parser.add_argument("--channels", type=int, default=1, help="input channels (default 1)")
    parser.add_argument("--classes", type=int, default=10, help="output classes (default 10)")
    parser.add_argument("--repeats", type=int, default=50, help="timed steps per contender (default 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per contender first (default 5)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's choice)")
    parser.add_argument("--profile", action="store_true", help="also time the pieces of each step")
    parser.add_argument("--seed", type=int, default=0)


def _accountant_options(parser: argparse.ArgumentParser) -> None:
    """Options of `bench accountant`."""
    parser.add_argument("--repeats", type=int, default=5, help="warm solves per configuration (default 5)")
    parser.add_argument("--reference-configs", type=int, default=2,
                        help="configurations also solved by the plain reference loop (default 2; ~1 s each)")
    parser.add_argument("--groups", default="paper,issue-33,near-floor,random",
                        help="comma-separated groups of configurations (default: all four)")


def _simulation_options(parser: argparse.ArgumentParser) -> None:
    """Options of `bench simulation`."""
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind, alternating (default 3)")
    parser.add_argument("--clients", type=int, default=10, help="federation size (default 10)")
    parser.add_argument("--ray-worker-niceness", type=int, default=0,
                        help="niceness of Ray's workers, the Flower clients (default 0, the loop's; Ray's own "
                             "default, 15, starves them on a busy machine)")
    parser.add_argument("--run-config", default="", metavar="'KEY=VALUE ...'",
                        help="run-config overrides, as for `flwr run --run-config` (default: none, the "
                             "pyproject defaults)")
    parser.add_argument("--flwr-run", action="store_true",
                        help="also run the job through `flwr run` (its own local SuperLink, SuperExec, simulation "
                             "process and Ray) and take the memory target on that whole tree")


def _scale_options(parser: argparse.ArgumentParser) -> None:
    """Options of `bench scale`."""
    parser.add_argument("--populations", default="10,100,1000",
                        help="comma-separated numbers of clients (default 10,100,1000; MNIST t10k allows up to 2000)")
    parser.add_argument("--sampled", type=int, default=10, help="clients sampled per round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3)")
    parser.add_argument("--local-steps", type=int, default=5, help="local steps per sampled client (default 5)")
    parser.add_argument("--batch-size", type=int, default=2,
                        help="expected batch size (default 2: below the 4 examples each of 2,000 clients holds)")
    parser.add_argument("--data-root", default="data/mnist-t10k", help="folder with MNIST's t10k IDX files")
    parser.add_argument("--ray-worker-niceness", type=int, default=0, help="niceness of Ray's workers (default 0)")
    parser.add_argument("--profile-linkstate", action="store_true",
                        help="also time one sweep of Flower's simulation message extractor per population")
    parser.add_argument("--num-supernodes", type=int, default=0,
                        help="virtual clients: this many SuperNodes serve every population (default 0: one per client)")
    parser.add_argument("--dataset", default="mnist-idx", choices=("mnist-idx", "synthetic"),
                        help="mnist-idx (at most 2000 clients) or synthetic (generated per client, model logreg)")
    parser.add_argument("--flwr-run", action="store_true",
                        help="run each population through `flwr run` with a local SuperLink of its own")
    parser.add_argument("--run-config", default="", metavar="'KEY=VALUE ...'", help="further run-config overrides")


def _accuracy_options(parser: argparse.ArgumentParser) -> None:
    """Options of `bench accuracy`, a preset of `dirichlet-fl study` (defaults: the full sweep; an option
    not given is None here and filled by sims.study.bench_preset: from --quick, else the bench's default)."""
    from cli.study import rate_flags, strategy_flags
    from dirichlet_fl.config_groups import CLASS_WEIGHTINGS
    from dirichlet_fl.models.norms import MODELS
    from privacy.registry import BASELINE_FIRST
    from sims.study.bench_preset import DEFAULTS, SPLITS
    from sims.study.tuning import ADAM_GRID, DEFAULT_GRID, grid_text

    def add(flag: str, default: object = None, **options: object) -> None:
        """An option not given is None; its help names the bench's default (`default` is the study's: unused)."""
        value = DEFAULTS[flag[2:].replace("-", "_")]
        shown = f" (default {value})" if value not in (None, "") else ""
        options = {**options, "help": f"{options.get('help', '')}{shown}".strip()}
        parser.add_argument(flag, default=None, **options)  # type: ignore[arg-type]

    parser.add_argument("--quick", action="store_true",
                        help="the app's default digits job with its rates, one seed, eps in {1, 4}: a few minutes")
    add("--dataset", help="a data set the app reads; npz: the file at --data-path")
    add("--data-root", help="folder of the data set's files")
    add("--data-path", help="an .npz in medmnist's layout (a site's data-file format)")
    add("--num-clients", type=int)
    add("--model", choices=sorted(MODELS), help="network")
    add("--seeds", type=int, help="seeds 0..N-1")
    add("--epsilons", help="comma-separated target eps values, at delta=1e-5")
    add("--splits", help=f"subset of {','.join(SPLITS)} (noniid: Dirichlet label skew, beta {SPLITS['noniid']})")
    add("--mechanisms", help="subset of none,dirichlet,dpsgd")
    add("--rounds", type=int)
    add("--local-epochs", type=float)
    add("--batch-size", type=int)
    add("--optimizers", help="comma-separated optimizers, each a study axis with its own rate grid: sgd, adam "
        "(default: the network's own, as `dirichlet-fl study`)")
    rate_flags(parser, add, grid_text(DEFAULT_GRID, BASELINE_FIRST), grid_text(ADAM_GRID, BASELINE_FIRST))
    strategy_flags(add)
    add("--learning-rate-mode", choices=["effective", "adaptive"],
        help="the Dirichlet clients' rate rule (the app's learning-rate-mode)")
    parser.add_argument("--validation", action="store_true",
                        help="evaluate the cells on 20%% of the training data instead of the test set")
    add("--norm", help="the model's normalisation: default, none, group or group-K (K channels per group)")
    add("--dirichlet-weighting", choices=["normalized", "paper"],
        help="the Dirichlet NLL's per-example weighting (the app's dirichlet-weighting)")
    add("--dirichlet-weight-cap", type=float)
    add("--class-weighting", choices=list(CLASS_WEIGHTINGS),
        help="how each client's loss weighs its classes (the app's class-weighting; default none)")
    add("--class-weight-cap", type=float, help="cap of a balanced class weight (the app's class-weight-cap)")
    add("--logit-adjustment", type=float,
        help="tau of each client's logit-adjusted loss (the app's logit-adjustment; default 0: none)")
    add("--warmup-rounds", type=int, help="linear learning-rate warm-up over this many rounds (0: none; default: "
        "the network's own)")
    add("--workers", type=int, help="worker processes, one thread each")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cells and tuning runs finished in --out and run the rest")
    parser.add_argument("--table-only", action="store_true",
                        help="rebuild table.md and the pictures from the cells finished in --out, run nothing")


def _gpu_options(parser: argparse.ArgumentParser) -> None:
    """Options of `bench gpu` (defaults: the paper's setting)."""
    from dirichlet_fl.models.norms import MODELS
    parser.add_argument("--data-root", default=None, help="folder holding cifar-10-batches-py/")
    parser.add_argument("--synthetic", action="store_true", help="random CIFAR-shaped data instead of CIFAR10")
    parser.add_argument("--synthetic-size", type=int, default=50_000, help="examples of synthetic data")
    parser.add_argument("--short", action="store_true", help="one epoch per mechanism")
    parser.add_argument("--epochs", type=int, default=100, help="epochs per mechanism (default 100 = 20,000 steps)")
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="default: round(1 / sample rate)")
    parser.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--mechanisms", default="dirichlet,dpsgd", help="comma-separated: dirichlet, dpsgd, none")
    parser.add_argument("--model", choices=MODELS, default="resnet18")
    parser.add_argument("--sample-rate", type=float, default=0.005)
    parser.add_argument("--epsilon", type=float, default=4.0, help="target eps at delta=1e-5 (default 4)")
    parser.add_argument("--alpha", type=float, default=3.0)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cuda or cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--federation-clients", type=int, default=8,
                        help="clients of the federated run on Flower + Ray (default 8; 0 skips it)")
    parser.add_argument("--gpus-per-client", type=float, default=0.25,
                        help="GPU share of each client (default 0.25: four train at once; 0 on a CPU)")
    parser.add_argument("--federation-rounds", type=int, default=3, help="rounds of the federated run (default 3)")
    parser.add_argument("--federation-steps", type=int, default=20,
                        help="local steps per client and round (default 20)")


def _secagg_options(parser: argparse.ArgumentParser) -> None:
    """Options of `bench secagg`."""
    parser.add_argument("--runs", type=int, default=3, help="measurements of each kind, alternating (default 3)")
    parser.add_argument("--clients", type=int, default=10, help="federation size (default 10)")
    parser.add_argument("--flower", action="store_true",
                        help="also time whole runs on Flower's simulation engine, plain vs secaggplus")
    parser.add_argument("--ray-worker-niceness", type=int, default=0, help="as for `bench simulation`")
    parser.add_argument("--run-config", default="", metavar="'KEY=VALUE ...'",
                        help="run-config overrides (default: none, the pyproject defaults)")


def _client_dp_options(parser: argparse.ArgumentParser) -> None:
    """Options of `bench client-dp`."""
    from dirichlet_fl.config import RunConfig
    from dirichlet_fl.config_groups import STRATEGIES

    parser.add_argument("--dataset", default="mnist-idx")
    parser.add_argument("--data-root", default="data/mnist-t10k", help="folder of the data set's files")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fraction-train", type=float, default=1.0)
    parser.add_argument("--noise-multipliers", default="0,2,4,8,16", help="z values; 0: client-dp none")
    parser.add_argument("--clipping-norm", type=float, default=1.0, help="C (adaptive: its first value)")
    parser.add_argument("--clipping", dest="clipping_mode", default="central", choices=["central", "adaptive"],
                        help="central: fixed C; adaptive: C follows --target-quantile of the update norms")
    parser.add_argument("--target-quantile", type=float, default=0.5,
                        help="adaptive clipping: fraction of updates left unclipped (default 0.5)")
    parser.add_argument("--mechanism", default="dirichlet", help="each client's per-example mechanism")
    parser.add_argument("--target-epsilon", type=float, default=1.0, help="each client's per-example eps")
    parser.add_argument("--model", default="cnn", help="network (default cnn)")
    parser.add_argument("--learning-rate", type=float, default=RunConfig().training.rate)
    parser.add_argument("--batch-size", type=int, default=RunConfig().local.batch_size)
    parser.add_argument("--local-epochs", type=float, default=1.0, help="local epochs per round")
    parser.add_argument("--local-steps", type=int, default=0, help="steps per round (0: --local-epochs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", default="fedavg", choices=STRATEGIES,
                        help="the Flower strategy that aggregates the noised mean (default fedavg: DP-FedAvg)")


BENCHMARKS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "steps": ("time one training step per mechanism", _steps_options),
    "accountant": ("time one r* solve", _accountant_options),
    "simulation": ("Flower + Ray against a plain loop: start-up, per round, memory", _simulation_options),
    "scale": ("seconds per round, start-up and memory against the number of clients", _scale_options),
    "accuracy": ("accuracy against eps, federated and centralized (a preset of `dirichlet-fl study`)",
                 _accuracy_options),
    "gpu": ("seconds per epoch, CIFAR10 ResNet-18, Dirichlet vs DP-SGD", _gpu_options),
    "secagg": ("SecAgg+ cost per round against the plain aggregation", _secagg_options),
    "client-dp": ("accuracy against client-level eps (DP-FedAvg) with per-example privacy on", _client_dp_options),
}


def _module(name: str) -> ModuleType:
    """The sims module of a benchmark, imported on use (each pulls in torch, Flower or Opacus)."""
    if name == "steps":
        from sims.bench import steps as module
    elif name == "accountant":
        from sims.bench import accountant as module
    elif name == "simulation":
        from sims.bench import simulation as module
    elif name == "scale":
        from sims.bench import scale as module
    elif name == "accuracy":
        from sims.study import bench_preset as module
    elif name == "secagg":
        from sims.bench import secagg as module
    elif name == "client-dp":
        from sims import client_dp_sweep as module
    else:
        from sims import gpu_cifar10 as module
    return module


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `bench <what> [options]` with `func=run`.

    Each benchmark's options are parsed in run() by a parser built from its sims module, so that
    the other subcommands do not import the benchmarks (Flower, Opacus) just to build the CLI."""
    parser = subparsers.add_parser("bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", choices=list(BENCHMARKS), help="which benchmark")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="its options; see `bench <what> --help`")
    parser.set_defaults(func=run, parser_class=type(parser))


def benchmark_parser(name: str, parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The option parser of one benchmark: its module's options plus --json and --out."""
    description, add_options = BENCHMARKS[name]
    parser = parser_class(prog=f"{PROG} {name}", description=description)
    add_options(parser)
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
