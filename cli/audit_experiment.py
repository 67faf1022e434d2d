"""`dirichlet-fl audit-experiment`: the command line of sims/audit_experiment.py."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from sims.audit_config import ExperimentConfig

PROG = "dirichlet-fl audit-experiment"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    defaults = ExperimentConfig()
    parser = subparsers.add_parser(
        "audit-experiment",
        help="audit models trained with none, dirichlet and dpsgd at one eps over several seeds",
        description="random members/non-members, one model per mechanism and seed plus a "
        "control that never saw the candidates; loss-threshold membership audit with an empirical eps bound.",
    )
    parser.add_argument("--dataset", default=defaults.dataset, help=f"data set (default {defaults.dataset})")
    parser.add_argument("--data-root", default=None, help="folder of the data set (mnist-idx: the IDX files)")
    parser.add_argument("--epsilon", type=float, default=defaults.epsilon, help="target eps of every private arm")
    parser.add_argument("--delta", type=float, default=defaults.delta)
    parser.add_argument("--alpha", type=float, default=defaults.alpha, help="Dirichlet offset alpha")
    parser.add_argument("--sample-rate", type=float, default=defaults.sample_rate, help="Poisson rate q")
    parser.add_argument("--steps", type=int, default=None, help=f"training steps T (default {defaults.steps})")
    parser.add_argument("--seeds", type=int, default=None, help=f"number of seeds (default {len(defaults.seeds)})")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--candidates", type=int, default=defaults.candidates, help="candidates per seed (half members)")
    parser.add_argument("--extra-train", type=int, default=defaults.extra_train, help="non-candidate training examples")
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate, help="non-private SGD rate")
    parser.add_argument("--dpsgd-learning-rate", type=float, default=defaults.dpsgd_learning_rate)
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default=defaults.optimizer)
    parser.add_argument("--max-grad-norm", type=float, default=defaults.max_grad_norm, help="DP-SGD clip norm C")
    parser.add_argument("--mechanisms", default=",".join(defaults.mechanisms), help="comma-separated arms")
    parser.add_argument("--workers", type=int, default=min(defaults.workers, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="2 seeds x 1000 steps (minutes): a smoke run")
    parser.add_argument("--out", default=None, help="output folder (default results/audit-experiment-<time>)")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """--quick sets 2 seeds and 1000 steps unless --seeds / --steps say otherwise."""
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else len(ExperimentConfig.seeds))
    steps = args.steps if args.steps is not None else (1000 if args.quick else ExperimentConfig.steps)
    return ExperimentConfig(
        dataset=args.dataset,
        data_root=args.data_root,
        epsilon=args.epsilon,
        delta=args.delta,
        alpha=args.alpha,
        sample_rate=args.sample_rate,
        steps=steps,
        seeds=tuple(range(args.first_seed, args.first_seed + seeds)),
        candidates=args.candidates,
        extra_train=args.extra_train,
        model=args.model,
        learning_rate=args.learning_rate,
        dpsgd_learning_rate=args.dpsgd_learning_rate,
        optimizer=args.optimizer,
        max_grad_norm=args.max_grad_norm,
        mechanisms=tuple(name.strip() for name in args.mechanisms.split(",") if name.strip()),
        workers=args.workers,
    )


def run(args: argparse.Namespace) -> int:
    from sims.audit_experiment import audit_rows, load_experiment_data, markdown, run_arms, write_outputs

    config = config_from_args(args)
    out = Path(args.out or f"results/audit-experiment-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        config.validate_flags()
        config.validate(len(load_experiment_data(config.dataset, config.data_root).train_y))
    except (OSError, ValueError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    started = time.monotonic()
    results = run_arms(config, log=lambda line: print(line, flush=True))
    seconds = time.monotonic() - started
    rows = audit_rows(config, results)
    write_outputs(out, config, results, rows, seconds)
    print(markdown(config, rows, seconds))
    print(f"wrote config.json, results.csv, results.md and losses.npz in {out}")
    return 0
