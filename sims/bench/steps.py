"""`bench steps`: the cost of one training step under each mechanism, on the same model and batch.

Five contenders start from the same weights and train on the same fixed batch:
- plain: cross-entropy, NoPrivacy.train_step (the non-private baseline);
- dirichlet: Algorithm 1's loss through DirichletMechanism.train_step (privacy.dirichlet.dirichlet_nll_loss);
- dirichlet-csprng: the same, its Gamma and uniform draws from the OS's CSPRNG (privacy/csprng.py, secure-rng);
- normalized: the same with the per-example confidence normalisation (dirichlet-weighting = "normalized");
- opacus: DP-SGD through DPSGDMechanism.train_step (GradSampleModule + DPOptimizer).

Why interleaved: on a shared machine the load drifts, so each repeat times one step of every contender
back to back (in a rotating order) and the report takes medians over repeats. With --profile, the
body of each train_step is also timed in pieces (forward, loss forward+backward on the logits alone,
backward through the model, optimizer step), to show where any extra time goes.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from client.training import PrivateTrainer, private_trainer
from dirichlet_fl.device import synchronize
from dirichlet_fl.models.networks import build_model
from privacy.accounting.analysis import PAPER_DELTA, calibrate_r
from privacy.csprng import SecureRandom
from privacy.dpsgd import DPSGDMechanism
from privacy.mechanisms import DirichletMechanism, LossWeighting, Mechanism, MechanismSpec, NoPrivacy

CONTENDERS = ("plain", "dirichlet", "dirichlet-csprng", "normalized", "opacus")
PAPER_SAMPLE_RATE = 0.005
PAPER_STEPS = 20_000
"""The paper's CIFAR10 setting; it only fixes r and sigma here, which do not change a step's cost."""
TARGETS = {"dirichlet_over_plain": ("<=", 1.10), "normalized_over_plain": ("<=", 1.10),
           "opacus_over_dirichlet": (">=", 2.0)}


@dataclass
class Contender:
    """One mechanism's trainer, with its own model and optimizer (all start from the same weights)."""

    trainer: PrivateTrainer
    secure: SecureRandom | None = None
    """The contender's own CSPRNG (dirichlet-csprng); None: the shared seeded generator."""

    def draws(self, generator: torch.Generator) -> torch.Generator | SecureRandom:
        """Where this contender's privacy draws come from."""
        return generator if self.secure is None else self.secure


def _check(args: argparse.Namespace) -> None:
    for name in ("batch_size", "repeats", "image_size", "channels", "classes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} is out of range: it must be >= 1")
    if args.warmup < 0 or args.threads < 0:
        raise ValueError("--warmup and --threads must be >= 0")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        raise ValueError(f"--device={args.device!r} is invalid: use cpu, cuda or cuda:N")


def _mechanisms(batch_size: int) -> dict[str, Mechanism]:
    """The mechanisms, calibrated for eps = 1 (delta = 1e-5) in the paper's CIFAR10 setting."""
    num_examples = round(batch_size / PAPER_SAMPLE_RATE)
    spec = MechanismSpec("dpsgd", 1.0, PAPER_DELTA, PAPER_SAMPLE_RATE, PAPER_STEPS, num_examples=num_examples)
    r = calibrate_r(spec.target_epsilon, spec.delta, spec.sample_rate, spec.planned_steps, spec.alpha).r
    return {
        "plain": NoPrivacy(PAPER_SAMPLE_RATE),
        "dirichlet": DirichletMechanism(r, spec.alpha, PAPER_SAMPLE_RATE, spec.delta),
        "dirichlet-csprng": DirichletMechanism(r, spec.alpha, PAPER_SAMPLE_RATE, spec.delta),
        "normalized": DirichletMechanism(r, spec.alpha, PAPER_SAMPLE_RATE, spec.delta, LossWeighting()),
        "opacus": DPSGDMechanism.calibrated(spec),
    }


def build_contenders(args: argparse.Namespace, device: torch.device) -> dict[str, Contender]:
    """A fresh, identically initialised model and SGD optimizer (lr 0.1) per mechanism, wrapped by it."""
    torch.manual_seed(args.seed)
    initial = build_model(args.model, args.channels, args.classes, args.image_size).state_dict()
    contenders = {}
    for name, mechanism in _mechanisms(args.batch_size).items():
        model = build_model(args.model, args.channels, args.classes, args.image_size)
        model.load_state_dict(initial)
        model.to(device)
        trainer = private_trainer(mechanism, model, "sgd", 0.1)
        contenders[name] = Contender(trainer, SecureRandom() if name.endswith("csprng") else None)
    return contenders


def _timed(device: torch.device, action: Callable[[], object]) -> float:
    synchronize(device)
    start = time.perf_counter()
    action()
    synchronize(device)
    return time.perf_counter() - start


def time_steps(
    contenders: dict[str, Contender], batch: tuple[Tensor, Tensor], repeats: int, warmup: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds of each train_step, interleaved: repeat i runs every contender once, starting at i mod their number."""
    inputs, labels = batch
    generator = torch.Generator(device=device).manual_seed(0)
    names = list(contenders)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            c = contenders[name]
            seconds = _timed(device, lambda: c.trainer.step(inputs, labels, c.draws(generator)))
            if i >= warmup:
                times[name].append(seconds)
    return times


def _loss_function(name: str, contender: Contender, generator: torch.Generator) -> Callable[[Tensor, Tensor], Tensor]:
    """The loss each train_step differentiates: DP-SGD sums per-example losses (its optimizer averages)."""
    if name == "opacus":
        return lambda logits, labels: nn.functional.cross_entropy(logits, labels, reduction="sum")
    return lambda logits, labels: contender.trainer.mechanism.loss(logits, labels, contender.draws(generator))


def profile_pieces(
    contenders: dict[str, Contender], batch: tuple[Tensor, Tensor], repeats: int, device: torch.device
) -> dict[str, dict[str, float]]:
    """Median seconds of the pieces of each step: forward, loss (forward + backward on detached logits),
    backward through the model (loss included), optimizer step (for Opacus: clip, noise, average)."""
    inputs, labels = batch
    generator = torch.Generator(device=device).manual_seed(1)
    pieces: dict[str, dict[str, list[float]]] = {name: {} for name in contenders}
    with warnings.catch_warnings():  # Opacus's hooks on a first layer whose input needs no gradient: benign
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        for _ in range(repeats):
            _profile_once(contenders, inputs, labels, generator, device, pieces)
    return {name: {piece: statistics.median(v) for piece, v in t.items()} for name, t in pieces.items()}


def _profile_once(
    contenders: dict[str, Contender],
    inputs: Tensor,
    labels: Tensor,
    generator: torch.Generator,
    device: torch.device,
    pieces: dict[str, dict[str, list[float]]],
) -> None:
    """One step of every contender, its pieces timed and appended to `pieces`."""
    for name, c in contenders.items():
        loss_fn = _loss_function(name, c, generator)
        model, optimizer = c.trainer.model, c.trainer.optimizer
        if name == "opacus":
            optimizer.generator = generator
        optimizer.zero_grad(set_to_none=True)
        holder: dict[str, Tensor] = {}
        forward = _timed(device, lambda: holder.update(logits=model(inputs)))
        detached = holder["logits"].detach().requires_grad_(True)
        measured = {
            "forward": forward,
            "loss": _timed(device, lambda: loss_fn(detached, labels).backward()),
            "backward": _timed(device, lambda: loss_fn(holder["logits"], labels).backward()),
            "optimizer_step": _timed(device, optimizer.step),
        }
        for piece, seconds in measured.items():
            pieces[name].setdefault(piece, []).append(seconds)


def _verdict(ratio: float, target: tuple[str, float]) -> bool:
    operator, bound = target
    return ratio <= bound if operator == "<=" else ratio >= bound


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """Time the contenders and return the report (medians in seconds, ratios, targets)."""
    _check(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    contenders = build_contenders(args, device)
    generator = torch.Generator().manual_seed(args.seed)
    inputs = torch.randn(args.batch_size, args.channels, args.image_size, args.image_size, generator=generator)
    labels = torch.randint(0, args.classes, (args.batch_size,), generator=generator)
    batch = (inputs.to(device), labels.to(device))
    times = time_steps(contenders, batch, args.repeats, args.warmup, device)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratios = {
        "dirichlet_over_plain": medians["dirichlet"] / medians["plain"],
        "csprng_over_dirichlet": medians["dirichlet-csprng"] / medians["dirichlet"],
        "normalized_over_plain": medians["normalized"] / medians["plain"],
        "normalized_over_dirichlet": medians["normalized"] / medians["dirichlet"],
        "opacus_over_dirichlet": medians["opacus"] / medians["dirichlet"],
    }
    report: dict[str, object] = {
        **ratios,
        "median_seconds": medians,
        "step_seconds": times,
        "quartiles_seconds": {name: statistics.quantiles(v, n=4) for name, v in times.items() if len(v) > 1},
        "targets": {key: {"target": f"{op} {bound:g}", "met": _verdict(ratios[key], (op, bound))}
                    for key, (op, bound) in TARGETS.items()},
        "config": {
            "model": args.model, "batch_size": args.batch_size, "input": [args.channels, args.image_size,
            args.image_size], "classes": args.classes, "repeats": args.repeats, "warmup": args.warmup,
            "device": str(device), "threads": torch.get_num_threads(), "optimizer": "sgd lr=0.1",
            "mechanism_parameters": {name: c.trainer.mechanism.parameters() for name, c in contenders.items()},
        },
    }
    if args.profile:
        report["profile_median_seconds"] = profile_pieces(contenders, batch, args.repeats, device)
    return report


def summary_lines(report: dict[str, object]) -> list[str]:
    """Human-readable lines: medians, ratios against their targets, and the profile if any."""
    config = report["config"]
    medians = report["median_seconds"]
    lines = [
        f"one training step, {config['model']}, batch {config['batch_size']} x {config['input']}, "
        f"{config['device']}, {config['threads']} threads, median of {config['repeats']} interleaved repeats:"
    ]
    lines += [f"  {name:<16} {medians[name] * 1e3:9.2f} ms" for name in CONTENDERS]
    lines.append(f"  csprng_over_dirichlet = {report['csprng_over_dirichlet']:.3f}  (the cost of secure-rng)")
    for key, target in report["targets"].items():
        state = "met" if target["met"] else "MISSED"
        lines.append(f"  {key} = {report[key]:.3f}  (target {target['target']}: {state})")
    for name, pieces in report.get("profile_median_seconds", {}).items():
        parts = ", ".join(f"{piece} {seconds * 1e3:.2f} ms" for piece, seconds in pieces.items())
        lines.append(f"  profile {name}: {parts}")
    return lines
