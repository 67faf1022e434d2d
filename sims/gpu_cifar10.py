"""`bench gpu`: seconds per epoch of the paper's CIFAR10 ResNet-18 setting, Dirichlet mechanism vs DP-SGD.

The paper's setting (Section 4.1.2, one client: q = 0.005, T = 20,000 steps, alpha = 3, delta = 1e-5,
SGD at 0.1, random crop + flip on the device) through the client's trainer
(client.training.private_trainer) and privacy.registry.build_mechanism, so that what is timed is what a
client runs: the median epoch after untimed warm-up steps (composed like any other), the peak device
memory and, with real CIFAR10, the test accuracy. Then, unless --federation-clients 0, the federated job on Flower's
simulation engine with fractional GPUs per client (sims.bench.simulation.measure_run), reported as
clients per second. BENCHMARKS.md, section 5.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from client.training import PoissonBatches, private_trainer
from dirichlet_fl.data.augmentation import random_crop_flip
from dirichlet_fl.data.loaders import load_dataset
from dirichlet_fl.device import resolve_device, synchronize
from dirichlet_fl.metrics import evaluate
from dirichlet_fl.models.networks import build_model
from privacy.accounting.analysis import PAPER_DELTA
from privacy.mechanisms import MechanismSpec
from privacy.registry import MECHANISMS, build_mechanism

PAPER_SECONDS_PER_EPOCH = {"dirichlet": 30.0, "dpsgd": 60.0}
"""Section 4.2 of the paper, Quadro RTX 6000."""




def _data(args: argparse.Namespace) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """(train x, train y, test x, test y): CIFAR10 from --data-root, or synthetic (no test split)."""
    if args.synthetic:
        generator = torch.Generator().manual_seed(args.seed)
        x = torch.randn(args.synthetic_size, 3, 32, 32, generator=generator)
        return x, torch.randint(0, 10, (args.synthetic_size,), generator=generator), None, None
    data = load_dataset("cifar10", args.data_root)
    return data.train_x, data.train_y, data.test_x, data.test_y


def train_mechanism(
    name: str, args: argparse.Namespace, data: tuple[Tensor, Tensor], epochs: int, device: torch.device
) -> dict[str, object]:
    """Train a fresh model with one mechanism for `epochs` epochs; seconds of each epoch and peak memory."""
    train_x, train_y = data
    steps = args.steps_per_epoch or round(1.0 / args.sample_rate)
    spec = MechanismSpec(name, args.epsilon, PAPER_DELTA, args.sample_rate, steps * epochs + args.warmup_steps,
                         args.alpha, args.max_grad_norm, num_examples=int(train_y.shape[0]))
    mechanism = build_mechanism(spec)
    torch.manual_seed(args.seed)
    model = build_model(args.model, 3, 10, 32).to(device)
    trainer = private_trainer(mechanism, model, "sgd", args.learning_rate)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    batches = PoissonBatches(train_x, train_y, generator, random_crop_flip)
    trainer.train(batches, args.warmup_steps)
    seconds = []
    for _ in range(epochs):
        synchronize(device)
        start = time.perf_counter()
        trainer.train(batches, steps)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return {
        "model": model,
        "epoch_seconds": seconds,
        "median_epoch_seconds": statistics.median(seconds),
        "steps_per_epoch": steps,
        "epsilon": mechanism.epsilon(PAPER_DELTA),
        "parameters": mechanism.parameters(),
        "peak_device_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }


def _check_federation(args: argparse.Namespace, device: torch.device) -> None:
    """Raise ValueError for federation options that cannot run here, before anything is trained."""
    if args.federation_clients < 0 or args.federation_rounds < 2 or args.federation_steps < 1:
        raise ValueError(f"--federation-clients={args.federation_clients} must be >= 0 (0: skip), "
                         f"--federation-rounds={args.federation_rounds} >= 2 and --federation-steps >= 1")
    if not 0.0 <= args.gpus_per_client <= 1.0:
        raise ValueError(f"--gpus-per-client={args.gpus_per_client} must be in [0, 1] (0.25: four clients per GPU)")
    if args.federation_clients and args.gpus_per_client > 0 and device.type != "cuda":
        raise ValueError(f"--gpus-per-client={args.gpus_per_client} needs a CUDA device (device is {device}); "
                         "on the CPU pass --gpus-per-client 0")


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """Train each mechanism and return seconds per epoch, the ratio, and accuracy on real data."""
    mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    if not mechanisms or any(m not in MECHANISMS for m in mechanisms):
        raise ValueError(f"--mechanisms={args.mechanisms!r} is invalid: choose from {', '.join(MECHANISMS)}")
    epochs = 1 if args.short else args.epochs
    if epochs < 1 or args.synthetic_size < 2 or args.warmup_steps < 0:
        raise ValueError("--epochs must be >= 1, --synthetic-size >= 2 and --warmup-steps >= 0")
    device = resolve_device(args.device)
    _check_federation(args, device)
    train_x, train_y, test_x, test_y = _data(args)
    train = (train_x.to(device), train_y.to(device))
    results = {}
    for name in mechanisms:
        outcome = train_mechanism(name, args, train, epochs, device)
        model = outcome.pop("model")
        if test_x is not None:
            outcome["test_accuracy"] = evaluate(model, test_x.to(device), test_y.to(device))[1]
        results[name] = outcome
    report: dict[str, object] = {
        "seconds_per_epoch": {name: r["median_epoch_seconds"] for name, r in results.items()},
        "mechanisms": results,
        "paper_seconds_per_epoch": PAPER_SECONDS_PER_EPOCH,
        "config": {**vars(args), "epochs": epochs, "delta": PAPER_DELTA,
                   "device": str(device), "device_name": torch.cuda.get_device_name(device)
                   if device.type == "cuda" else "cpu", "examples": int(train_y.shape[0])},
    }
    if "dirichlet" in results and "dpsgd" in results:
        report["dpsgd_over_dirichlet"] = results["dpsgd"]["median_epoch_seconds"] / results["dirichlet"][
            "median_epoch_seconds"]
    if args.federation_clients:
        report["federation"] = federation(args, device, out_dir / "federation")
    return report


def federation(args: argparse.Namespace, device: torch.device, out: Path) -> dict[str, Any]:
    """The federated job on Flower + Ray, each client holding a fraction of the GPU; clients per second."""
    from sims.bench.simulation import measure_run, steady_and_fixed

    overrides = {"dataset": "digits", "partitioner": "iid", "num-server-rounds": args.federation_rounds,
                 "local-steps": args.federation_steps, "fraction-evaluate": 0.0, "device": device.type,
                 "model": "cnn"}
    result = measure_run("flower", overrides, args.federation_clients, out, niceness=0,
                         gpus_per_client=args.gpus_per_client)
    steady, fixed = steady_and_fixed(result)
    return {"clients": args.federation_clients, "gpus_per_client": args.gpus_per_client,
            "clients_at_once": math.floor(1 / args.gpus_per_client) if args.gpus_per_client else None,
            "steady_seconds_per_round": steady, "clients_per_second": args.federation_clients / steady,
            "startup_seconds": fixed, "round_seconds": result["round_seconds"],
            "peak_rss_bytes": result["peak_rss_bytes"], "final_accuracy": result["final_accuracy"],
            "device": device.type, "local_steps": args.federation_steps}


def summary_lines(report: dict[str, object]) -> list[str]:
    """Seconds per epoch per mechanism, beside the paper's figures."""
    config = report["config"]
    steps = next(iter(report["mechanisms"].values()))["steps_per_epoch"]
    lines = [f"{config['model']} on {'synthetic' if config['synthetic'] else 'CIFAR10'} data, "
             f"{config['device_name']}, {config['epochs']} epoch(s) of {steps} steps:"]
    for name, result in report["mechanisms"].items():
        paper = PAPER_SECONDS_PER_EPOCH.get(name)
        accuracy = f", test accuracy {result['test_accuracy']:.4f}" if "test_accuracy" in result else ""
        lines.append(f"  {name:<9} {result['median_epoch_seconds']:8.2f} s/epoch (paper: "
                     f"{f'~{paper:g} s' if paper else 'n/a'}), eps {result['epsilon']:.3f} "
                     f"(delta={PAPER_DELTA:g}){accuracy}")
    if "dpsgd_over_dirichlet" in report:
        lines.append(f"  dpsgd/dirichlet = {report['dpsgd_over_dirichlet']:.2f} (paper: ~2)")
    if "federation" in report:
        fed = report["federation"]
        lines.append(f"  federation: {fed['clients']} clients on {fed['device']}, {fed['gpus_per_client']:g} GPU each: "
                     f"{fed['steady_seconds_per_round']:.2f} s/round, {fed['clients_per_second']:.2f} clients/s, "
                     f"start-up {fed['startup_seconds']:.1f} s")
    return lines
