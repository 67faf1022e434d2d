"""The Study that command-line options describe (`dirichlet-fl study` and the `bench accuracy` preset),
with one ValueError line naming the flag and its valid range for anything out of range."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dirichlet_fl.config_groups import OPTIMIZERS, STRATEGIES
from dirichlet_fl.data.loaders import NPZ, dataset_num_classes
from privacy.registry import mechanism_class
from sims.study.data_file import check_medmnist_layout
from sims.study.plan import DEFAULT_PROXIMAL_MU, MECHANISMS, RATE_FLAGS, Study, parse_partition
from sims.study.tuning import MAX_EXTENSION_STEPS, grid_text, parse_rate_grid, parse_server_grid, server_grid_text


def numbers(flag: str, text: str, kind: type = float) -> tuple:
    """Comma-separated numbers; ValueError naming `flag` for anything else."""
    try:
        return tuple(kind(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise ValueError(f"{flag}={text!r} is invalid: give comma-separated numbers") from None


def partitions_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The partitions of --betas, --classes-per-client and --site-file, each once, in that order."""
    partitions = [parse_partition(word.strip()) for word in args.betas.split(",") if word.strip()]
    partitions += [f"classes={k}" for k in numbers("--classes-per-client", args.classes_per_client, int)]
    partitions += ["natural"] if args.site_file else []
    if any(p.startswith("classes=") and int(p.split("=")[1]) < 1 for p in partitions):
        raise ValueError(f"--classes-per-client={args.classes_per_client!r}: each K must be >= 1")
    return tuple(dict.fromkeys(partitions))


def _check_ranges(args: argparse.Namespace, partitions: tuple, epsilons: tuple, mechanisms: tuple) -> None:
    checks = [("--betas", bool(partitions), "give at least one beta or partition word"),
              ("--epsilons", bool(epsilons) and min(epsilons) > 0, "give eps values > 0"),
              ("--mechanisms", bool(mechanisms) and set(mechanisms) <= set(MECHANISMS),
               "a subset of none,dirichlet,dpsgd"),
              ("--seeds", args.seeds >= 1, "give >= 1"), ("--workers", args.workers >= 1, "give >= 1"),
              ("--num-clients", args.num_clients >= 2, "give >= 2"),
              ("--warmup-rounds", args.warmup_rounds >= 0, "give >= 0 (0: no warm-up)"),
              ("--rate-extension-steps", 0 <= args.rate_extension_steps <= MAX_EXTENSION_STEPS,
               f"give 0 to {MAX_EXTENSION_STEPS} (0: never extend the grid)"),
              ("--server-rate-extension-steps", 0 <= args.server_rate_extension_steps <= MAX_EXTENSION_STEPS,
               f"give 0 to {MAX_EXTENSION_STEPS} (0: never extend the server grid)")]
    for flag, ok, fix in checks:
        if not ok:
            raise ValueError(f"{flag}={getattr(args, flag[2:].replace('-', '_'))!r} is out of range: {fix}")
    for flag in RATE_FLAGS.values():
        rate = getattr(args, flag[2:].replace("-", "_"))
        if rate is not None and not rate > 0:
            raise ValueError(f"{flag}={rate!r} is out of range: give a rate > 0, or leave it out to tune it")


def optimizers_of(args: argparse.Namespace, rates: dict[str, float | None]) -> tuple[str, ...]:
    """--optimizers, each once; a rate flag is in one optimizer's units, so it is refused beside two."""
    optimizers = tuple(dict.fromkeys(o.strip() for o in args.optimizers.split(",") if o.strip()))
    if not optimizers or not set(optimizers) <= set(OPTIMIZERS):
        raise ValueError(f"--optimizers={args.optimizers!r} is invalid: give one or more of {', '.join(OPTIMIZERS)}")
    given = [RATE_FLAGS[m] for m, rate in rates.items() if rate is not None]
    if len(optimizers) > 1 and given:
        raise ValueError(f"{given[0]} with --optimizers={','.join(optimizers)}: a rate is in one optimizer's units "
                         "(SGD's effective rate is not Adam's); leave it out to tune each optimizer over its own grid, "
                         "or give one optimizer")
    return optimizers


def strategies_of(args: argparse.Namespace) -> tuple[str, ...]:
    """--strategies, each once; --proximal-mu, which only FedProx reads, refused out of range or without it."""
    strategies = tuple(dict.fromkeys(s.strip() for s in args.strategies.split(",") if s.strip()))
    if not strategies or not set(strategies) <= set(STRATEGIES):
        raise ValueError(f"--strategies={args.strategies!r} is invalid: give one or more of {', '.join(STRATEGIES)}")
    mu = args.proximal_mu
    if not (math.isfinite(mu) and mu >= 0):
        raise ValueError(f"--proximal-mu={mu!r} is out of range: give a finite number >= 0")
    if mu != DEFAULT_PROXIMAL_MU and "fedprox" not in strategies:
        raise ValueError(f"--proximal-mu={mu!r} has no effect without fedprox in --strategies="
                         f"{','.join(strategies)}: add fedprox, or leave --proximal-mu out")
    return strategies


def with_network_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with --optimizers and --warmup-rounds, where not given (None), the network's own: its Recipe
    (dirichlet_fl.models.recipes), for --model with --norm."""
    from dirichlet_fl.models.recipes import recipe

    own = recipe(args.model, args.norm)
    return argparse.Namespace(**{**vars(args),
                                 "optimizers": own.optimizer if args.optimizers is None else args.optimizers,
                                 "warmup_rounds": own.warmup_rounds if args.warmup_rounds is None
                                 else args.warmup_rounds})


def network_adam_grid(model: str, norm: str) -> dict[str, tuple[float, ...]]:
    """The Adam rates tuned per mechanism where --adam-rate-grid names none: the network's own (its Recipe)."""
    from dirichlet_fl.models.recipes import recipe

    return {mechanism: recipe(model, norm).adam_grid for mechanism in MECHANISMS}


def study_of(args: argparse.Namespace) -> Study:
    """The Study the options describe (a rate flag not given: None, tuned on the validation split; the optimizer
    and warm-up not given: the network's own)."""
    args = with_network_defaults(args)
    partitions = partitions_of(args)
    epsilons = tuple(sorted(set(numbers("--epsilons", args.epsilons))))
    mechanisms = tuple(dict.fromkeys(m.strip() for m in args.mechanisms.split(",") if m.strip()))
    _check_ranges(args, partitions, epsilons, mechanisms)
    rates = {m: getattr(args, flag[2:].replace("-", "_")) for m, flag in RATE_FLAGS.items()}
    optimizers = optimizers_of(args, rates)
    strategies = strategies_of(args)
    server_grid = server_grid_text(parse_server_grid(args.server_rate_grid), strategies)
    tuned = tuple(m for m in mechanisms if rates[m] is None)
    parsed = {"sgd": parse_rate_grid(args.rate_grid, "sgd"),
              "adam": parse_rate_grid(args.adam_rate_grid, "adam", network_adam_grid(args.model, args.norm))}
    grids = {o: grid_text(grid, tuned) if o in optimizers else "" for o, grid in parsed.items()}
    if args.data_path and args.dataset != NPZ:
        check_medmnist_layout(Path(args.data_path), dataset_num_classes(args.dataset))
    return Study(dataset=args.dataset, data_root=args.data_root,
                 data_path=str(Path(args.data_path).resolve()) if args.data_path else "",
                 num_clients=args.num_clients, partitions=partitions, site_file=args.site_file, epsilons=epsilons,
                 mechanisms=mechanisms, seeds=tuple(range(args.seeds)), model=args.model, rounds=args.rounds,
                 local_epochs=args.local_epochs, batch_size=args.batch_size,
                 **{mechanism_class(m).rate_key: rate for m, rate in rates.items()},
                 rate_grid=grids["sgd"], optimizers=optimizers, adam_rate_grid=grids["adam"],
                 strategies=strategies, server_rate_grid=server_grid, proximal_mu=args.proximal_mu,
                 rate_extension_steps=args.rate_extension_steps,
                 server_rate_extension_steps=args.server_rate_extension_steps,
                 learning_rate_mode=args.learning_rate_mode, validation=args.validation, norm=args.norm,
                 dirichlet_weighting=args.dirichlet_weighting, dirichlet_weight_cap=args.dirichlet_weight_cap,
                 class_weighting=args.class_weighting, class_weight_cap=args.class_weight_cap,
                 logit_adjustment=args.logit_adjustment,
                 warmup_rounds=args.warmup_rounds, device=args.device)
