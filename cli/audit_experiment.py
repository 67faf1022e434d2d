"""`dirichlet-fl audit-experiment`: the command line of sims/audit/experiment.py."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from sims.audit.config import (
    DEFAULT_CLIP_GRID,
    ExperimentConfig,
    parse_named_values,
    parse_rate_grids,
    parse_rates,
    parse_values,
)

PROG = "dirichlet-fl audit-experiment"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    defaults = ExperimentConfig()
    parser = subparsers.add_parser(
        "audit-experiment",
        description="A fixed pool of candidates, each a member by a fair coin per seed; one model per mechanism, "
        "eps and seed plus a control that never saw the candidates (the accuracy to match); loss, offline LiRA / "
        "RMIA (K reference models) and one-run membership audits with empirical eps bounds and verdicts.",
    )
    parser.add_argument("--dataset", default=defaults.dataset, help=f"data set (default {defaults.dataset})")
    parser.add_argument("--data-root", default=None, help="folder of the data set (mnist-idx: the IDX files)")
    parser.add_argument("--epsilon", default=",".join(f"{eps:g}" for eps in defaults.epsilons),
                        help="target eps of every private arm; comma-separated for several (e.g. 1,4)")
    parser.add_argument("--mechanism-epsilon", default="",
                        help="eps values per mechanism instead of --epsilon, e.g. dpsgd=1/4")
    parser.add_argument("--delta", type=float, default=defaults.delta)
    parser.add_argument("--alpha", type=float, default=defaults.alpha, help="Dirichlet offset alpha")
    parser.add_argument("--sample-rate", type=float, default=defaults.sample_rate, help="Poisson rate q")
    parser.add_argument("--steps", type=int, default=None, help=f"training steps T (default {defaults.steps})")
    parser.add_argument("--seeds", type=int, default=None, help=f"number of seeds (default {len(defaults.seeds)})")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--candidates", type=int, default=defaults.candidates, help="pool size (about half members)")
    parser.add_argument("--extra-train", type=int, default=defaults.extra_train, help="non-candidate training examples")
    parser.add_argument("--model", default=defaults.model, help=f"network (default {defaults.model})")
    parser.add_argument("--norm", default=defaults.norm or "default",
                        help="normalisation: none, group, group-K, batch (default %(default)s; 'default': the "
                        "model's own)")
    parser.add_argument("--weighting", default=",".join(defaults.weightings),
                        help="the Dirichlet losses to run, one arm each per eps: paper, normalized (default "
                        "%(default)s)")
    parser.add_argument("--weight-cap", type=float, default=defaults.weight_cap,
                        help="the normalised loss's weight cap (default %(default)s)")
    parser.add_argument("--validation", type=int, default=defaults.validation,
                        help="non-candidate examples the rates are chosen on (default %(default)s)")
    parser.add_argument(
        "--rate", default="",
        help="fix SGD rates per arm or mechanism instead of choosing them, e.g. dirichlet=0.7,none=0.025 or "
        "dirichlet-eps4=0.3 (the optimizer's own rate; default: every arm chooses from --rate-grid)",
    )
    grids = ",".join(f"{name}={'/'.join(f'{rate:g}' for rate in grid)}" for name, grid in defaults.rate_grids)
    parser.add_argument("--rate-grid", default="",
                        help="effective rates an arm tries, per mechanism, e.g. dirichlet=0.05/0.1 (Dirichlet "
                        f"divides each by kappa(0.9)); default {grids}")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default=None,
                        help="default: the network's own (dirichlet_fl.models.recipes: sgd for lenet, adam for lenet "
                        "with GroupNorm and resnet9); with adam the default --rate-grid is Adam's 0.0003/0.001/0.003")
    parser.add_argument("--max-grad-norm", type=float, default=None,
                        help="DP-SGD clip norm C (default: chosen from --clip-grid with the rate; 1 with --rate)")
    parser.add_argument("--clip-grid", default="/".join(f"{clip:g}" for clip in DEFAULT_CLIP_GRID),
                        help="DP-SGD clip norms tried with each rate (default %(default)s)")
    parser.add_argument("--mechanisms", default=",".join(defaults.mechanisms), help="comma-separated arms")
    parser.add_argument("--references", type=int, default=defaults.references,
                        help=f"K reference models per arm for LiRA / RMIA (default {defaults.references}; "
                        "0: skip them)")
    parser.add_argument("--reference-epsilon", default="",
                        help="train reference models only for the private arms at these eps, e.g. 1 "
                        "(and for none and the control; default: every arm)")
    parser.add_argument("--margin", type=float, default=defaults.margin,
                        help="matched utility: accuracy at most this far below the control's "
                        f"(default {defaults.margin})")
    parser.add_argument("--workers", type=int, default=min(defaults.workers, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="2 seeds x 1000 steps (minutes): a smoke run")
    parser.add_argument("--out", default=None, help="output folder (default results/audit-experiment-<time>)")
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """--quick sets 2 seeds and 1000 steps unless --seeds / --steps say otherwise; ValueError names a bad flag."""
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else len(ExperimentConfig.seeds))
    steps = args.steps if args.steps is not None else (1000 if args.quick else ExperimentConfig.steps)
    epsilons = parse_epsilons("--epsilon", args.epsilon)
    optimizer = args.optimizer or network_optimizer(args.model, args.norm)
    return ExperimentConfig(
        dataset=args.dataset,
        data_root=args.data_root,
        epsilons=epsilons,
        mechanism_epsilons=parse_named_values("--mechanism-epsilon", args.mechanism_epsilon),
        reference_epsilons=parse_epsilons("--reference-epsilon", args.reference_epsilon),
        delta=args.delta,
        alpha=args.alpha,
        sample_rate=args.sample_rate,
        steps=steps,
        seeds=tuple(range(args.first_seed, args.first_seed + seeds)),
        candidates=args.candidates,
        extra_train=args.extra_train,
        model=args.model,
        norm=None if args.norm == "default" else args.norm,
        weightings=tuple(name.strip() for name in args.weighting.split(",") if name.strip()),
        weight_cap=args.weight_cap,
        validation=args.validation,
        rates=parse_rates(args.rate),
        rate_grids=parse_rate_grids(args.rate_grid, optimizer),
        optimizer=optimizer,
        max_grad_norm=args.max_grad_norm,
        clip_grid=parse_values("--clip-grid", args.clip_grid),
        mechanisms=tuple(name.strip() for name in args.mechanisms.split(",") if name.strip()),
        references=args.references,
        margin=args.margin,
        workers=args.workers,
    )


def network_optimizer(model: str, norm: str) -> str:
    """The optimizer `model` with `norm` trains with unless told otherwise (its Recipe)."""
    from dirichlet_fl.models.recipes import recipe

    return recipe(model, norm).optimizer


def parse_epsilons(flag: str, text: str) -> tuple[float, ...]:
    """'1,4' -> (1.0, 4.0); ValueError naming the flag."""
    try:
        return tuple(float(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise ValueError(f"{flag}={text!r} is invalid: give comma-separated numbers, e.g. 1,4") from None


def run(args: argparse.Namespace) -> int:
    from dirichlet_fl.models.norms import MODELS
    from sims.audit.experiment import RESULTS_JSON, run_experiment, write_outputs
    from sims.audit.tables import results_markdown
    from sims.audit.training import load_experiment_data

    out = Path(args.out or f"results/audit-experiment-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        config = config_from_args(args)
        if config.model not in MODELS:
            raise ValueError(f"--model={config.model!r} is unknown; valid: {', '.join(MODELS)}")
        config.validate_flags()
        config.validate(len(load_experiment_data(config.dataset, config.data_root).train_y))
    except (OSError, ValueError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    experiment = run_experiment(config, log=lambda line: print(line, flush=True))
    write_outputs(out, experiment)
    print(results_markdown(experiment.to_dict()))
    print(f"wrote {RESULTS_JSON}, results.csv, tuning.csv, results.md, reference_sweep.csv, losses.npz and "
          f"audit_roc.png in {out}")
    return 0
