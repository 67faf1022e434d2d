"""`dirichlet-fl bench accuracy`: a preset of the study (sims/study/execute.py), with the bench's own
defaults: real MNIST t10k (`mnist-idx` from data/mnist-t10k), 10 clients, `lenet`, 20 rounds x 1 local
epoch, batch 32, eps 0.5-8, 3 seeds, and its splits: `iid`, `noniid` (the Dirichlet label skew beta 0.3,
the study's partition "0.3") and `central`. Rates not given are tuned on the validation split
(sims/study/tuning.py). `--quick` is the app's default digits job at eps 1 and 4, one seed, with the
app's weighting and rates (given, so nothing is tuned). Outputs: the study's (docs/study.md).
BENCHMARKS.md, section 4, has the setting and the results.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dirichlet_fl.config import RunConfig
from sims.study.execute import execute
from sims.study.options import study_of
from sims.study.plan import DEFAULT_PROXIMAL_MU
from sims.study.runner import describe

SPLITS = {"iid": "iid", "noniid": "0.3", "central": "central"}
"""Each --splits word and the study's partition it is."""
DEFAULTS: dict[str, object] = {
    "dataset": "mnist-idx", "data_root": "data/mnist-t10k", "data_path": "", "num_clients": 10, "model": "lenet",
    "seeds": 3, "epsilons": "0.5,1,2,4,8", "splits": ",".join(SPLITS), "mechanisms": "none,dirichlet,dpsgd",
    "rounds": 20, "local_epochs": 1.0, "batch_size": 32, "learning_rate": None, "dirichlet_learning_rate": None,
    "dpsgd_learning_rate": None, "rate_grid": "", "adam_rate_grid": "", "optimizers": None,
    "strategies": "fedavg", "server_rate_grid": "", "proximal_mu": DEFAULT_PROXIMAL_MU,
    "rate_extension_steps": 2, "server_rate_extension_steps": 2,
    "learning_rate_mode": "effective", "norm": "default",
    "dirichlet_weighting": "normalized", "dirichlet_weight_cap": 20.0, "warmup_rounds": None,
    "class_weighting": "none", "class_weight_cap": 10.0, "logit_adjustment": 0.0,
    "workers": 2,
}
"""The bench's defaults (the parser's own default is None: 'not given'; a rate left None is tuned; the optimizer
and warm-up left None are the network's own: sims.study.options.with_network_defaults)."""
QUICK_DPSGD_LEARNING_RATE = 0.02
"""DP-SGD's rate in --quick (digits, batch 8), tuned on its validation split over 0.01-2 (BENCHMARKS.md, section 4)."""


def quick_defaults() -> dict[str, object]:
    """--quick: the app's default digits job (its model, rounds, local epochs, batch size, rate and
    Dirichlet weighting) at eps 1 and 4, one seed; flags given beside it win."""
    app = RunConfig()
    return {"dataset": app.data.dataset, "data_root": "", "data_path": "", "model": app.network.name,
            "rounds": app.num_server_rounds, "local_epochs": app.local.epochs, "batch_size": app.local.batch_size,
            "learning_rate": app.training.rate, "dirichlet_learning_rate": app.training.rate,
            "optimizers": app.training.optimizer,
            "dpsgd_learning_rate": QUICK_DPSGD_LEARNING_RATE, "dirichlet_weighting": app.privacy.dirichlet_weighting,
            "dirichlet_weight_cap": app.privacy.dirichlet_weight_cap, "warmup_rounds": app.training.warmup_rounds,
            "seeds": 1,
            "epsilons": "1,4"}


def partitions(splits: str) -> str:
    """--splits as the study's --betas."""
    chosen = [item.strip() for item in splits.split(",") if item.strip()]
    if not chosen or any(item not in SPLITS for item in chosen):
        raise ValueError(f"--splits={splits!r} is invalid: choose from {', '.join(SPLITS)}")
    return ",".join(SPLITS[item] for item in chosen)


def study_args(options: argparse.Namespace) -> argparse.Namespace:
    """The study's options for the bench's: every option not given from --quick or the defaults."""
    preset = quick_defaults() if options.quick else {}
    values = {key: preset.get(key, default) if getattr(options, key) is None else getattr(options, key)
              for key, default in DEFAULTS.items()}
    return argparse.Namespace(**values, betas=partitions(str(values["splits"])), classes_per_client="",
                              site_file="", validation=options.validation, device="cpu")


def run(options: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """Run the preset's study in out_dir; the study's summary and its study.json as `config`."""
    args = study_args(options)
    study = study_of(args)
    report = execute(study, args.workers, out_dir, resume=options.resume, table_only=options.table_only)
    return {**report, "config": {**json.loads(describe(study)), "workers": args.workers}}


def summary_lines(report: dict[str, object]) -> list[str]:
    """The markdown table, the rates tuned and where the files are."""
    rates = [f"{r['mechanism']} beta={r['beta']} eps={float(r['epsilon']):g} {r['optimizer']}: {r['learning_rate']:g}"
             for r in report["rates"]]  # type: ignore[attr-defined]
    return [f"{report['rows']} of {report['cells']} cells and {report['tuning_runs']} tuning runs in "
            f"{report['seconds']:.0f} s; metrics (%) mean ± sd over seeds:", str(report["table"]).rstrip(),
            *(["rates tuned on the validation split: " + "; ".join(rates)] if rates else []),
            *(f"warning: {line}" for line in report["rate_warnings"]),  # type: ignore[attr-defined]
            f"pictures: {report['pictures']}"]
