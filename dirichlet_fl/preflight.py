"""Pre-flight: everything about a run that can be checked before Ray and the SuperLink start.

`scripts/run.sh` runs it (as `dirichlet-fl check`) before `flwr run`, so that a bad value stops the
run within seconds, as one line naming the key, with no folder written and no process left behind.
It reads --run-config exactly as `flwr run` does (flwr.common.config, pyproject defaults fused with
the overrides), but names what flwr would drop, override or reject silently: a key with an empty value,
a key given twice, text that is no KEY=VALUE pair, an unquoted string, an unknown key. Then it validates
the typed RunConfig and checks what a client would only find out later: the device, the results folder,
the data and site files, every client's shard against batch-size (a shard too small sits out, as the
server lets it; no client able to train is an error), client-epsilons against the number of clients,
delta below 1/n and the steps a round for each client, and whether every client's target eps lies above
the floor of Theorem 10 (privacy.accounting.analysis.epsilon_floor) for its sampling rate and planned steps; and
for resume-from, a checkpoint, a readable config.json and an unchanged accounting. The run config is
read and validated without torch (a bad value answers in about a second); the device, data and shard
checks import it.
"""

from __future__ import annotations

import difflib
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import tomli
from flwr.common.config import flatten_dict, get_fused_config_from_dir, get_project_config, parse_config_args

from dirichlet_fl.client_plan import mechanism_spec, too_small_to_train
from dirichlet_fl.config import RunConfig, clients_per_round
from dirichlet_fl.config_groups import MAX_LOCAL_STEPS, SYNTHETIC
from privacy.accounting.analysis import UnreachableEpsilonError, epsilon_floor
from privacy.registry import mechanism_class

if TYPE_CHECKING:
    from dirichlet_fl.data.split import FederatedSplit

PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")
"""flwr.common.config.parse_config_args's own pattern for one KEY=VALUE pair."""


def parse_overrides(lines: list[str], app_dir: Path) -> dict[str, Any]:
    """--run-config arguments as `flwr run` reads them; ValueError naming what it would drop or reject."""
    if len(lines) == 1 and lines[0].endswith(".toml"):
        if not Path(lines[0]).is_file():
            raise ValueError(f"--run-config {lines[0]}: no such TOML file; give an existing file or KEY=VALUE pairs")
    else:
        _check_pairs(lines)
    try:
        overrides = parse_config_args(lines)
    except click.ClickException as error:
        raise ValueError(f"--run-config: {' '.join(error.message.split())}") from None
    known = set(flatten_dict(get_project_config(app_dir)["tool"]["flwr"]["app"]["config"]))
    for key in overrides:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; valid keys: {', '.join(sorted(known))}"
            raise ValueError(f"{key} is not a run-config key{hint}")
    return overrides


def _check_pairs(lines: list[str]) -> None:
    """Each KEY=VALUE pair readable as flwr reads it, and each key given once over all the lines."""
    seen: dict[str, str] = {}
    for line in lines:
        for token in PAIR.sub(" ", line).split():
            if token.endswith("="):
                key = token.rstrip("=")
                raise ValueError(f"{key}= has no value (flwr would drop it silently): give one, e.g. {key}=1.0")
            raise ValueError(f"--run-config: cannot read {token!r}: write KEY=VALUE pairs separated by spaces")
        for key, value in PAIR.findall(line):
            try:
                tomli.loads(f"{key} = {value}")
            except tomli.TOMLDecodeError:
                raise ValueError(
                    f"{key}={value} is invalid: a value is a number, true/false or a quoted string, "
                    f"e.g. {key}='{value}'"
                ) from None
            if key in seen:
                raise ValueError(f"{key} is given twice in --run-config ({key}={seen[key]} and {key}={value}; flwr "
                                 "would keep one silently): give each key once")
            seen[key] = value


def preflight(lines: list[str], num_clients: int, app_dir: Path) -> list[str]:
    """Check a run before it starts (see the module docstring); raises ValueError, FileNotFoundError or
    OSError with one line naming the key. Returns what was checked, one line each."""
    config = RunConfig.from_run_config(get_fused_config_from_dir(app_dir, parse_overrides(lines, app_dir)))
    if num_clients < 1:
        raise ValueError(f"num-supernodes={num_clients} (NUM_CLIENTS) is out of range: a federation needs at least "
                         "1 client")
    num_clients = config.num_clients or num_clients  # virtual clients: the population, not the SuperNodes
    config.privacy.target_epsilon_for(0, num_clients)  # client-epsilons: one entry per client
    client_level = config.client_level
    if client_level.mode == "adaptive":  # sigma_b from the first round's sample, as the strategy will
        first_sample = clients_per_round(num_clients, config.fraction_train, num_clients)
        client_level.adaptive_clipping(client_level.count_stddev(first_sample))
    from dirichlet_fl.device import resolve_device  # torch: only once the run config itself is valid

    device = resolve_device(config.device)
    _check_writable(Path(config.output.results_dir))
    if config.output.resume_from:
        _check_resume(config, num_clients)
    sizes, trainers = _shards(config, num_clients)
    floors = {client: _check_budget(config, client, sizes[client], num_clients) for client in trainers}
    out = len(sizes) - len(trainers)
    sitting_out = f"; {out} hold <= batch-size examples and sit out" if out else ""
    lines_out = [
        f"run config: {config.privacy.mechanism}, {config.data.dataset}, {config.num_server_rounds} rounds, "
        f"device {device}",
        f"data: {num_clients} shards of {min(sizes.values())}..{max(sizes.values())} training examples (batch-size "
        f"{config.local.batch_size})"
        + sitting_out,
        f"results: {Path(config.output.results_dir).resolve()} is writable"
        + (f"; resuming {config.output.resume_from}" if config.output.resume_from else ""),
    ]
    if mechanism_class(config.privacy.mechanism).has_epsilon_floor:
        worst = max(trainers, key=lambda c: floors[c] / config.privacy.target_epsilon_for(c, num_clients))
        lines_out.append(
            f"budgets: every client's eps is reachable (closest: client {worst}, floor {floors[worst]:.4g} "
            f"below its target {config.privacy.target_epsilon_for(worst, num_clients):g})"
        )
    return lines_out


def _check_resume(config: RunConfig, num_clients: int) -> None:
    """resume-from holds a checkpoint and a readable config.json of the same accounting and federation."""
    from dirichlet_fl.runs.reader import check_resumable, read_checkpoint, read_json

    directory = Path(config.output.resume_from)
    read_checkpoint(directory)
    stored = read_json(directory / "config.json")
    try:
        original, stored_clients = RunConfig.from_run_config(stored["run_config"]), int(stored["num_clients"])
    except (KeyError, TypeError, ValueError) as error:
        why = " ".join(str(error).split())
        raise ValueError(f"{directory / 'config.json'} is not a dirichlet-fl run config ({why}); resume-from needs "
                         "the folder of a run this app wrote") from None
    check_resumable(original, config)
    if stored_clients != num_clients:
        raise ValueError(f"resume-from={config.output.resume_from!r}: the run had {stored_clients} clients, not "
                         f"{num_clients}")


def _shards(config: RunConfig, num_clients: int) -> tuple[dict[int, int], list[int]]:
    """Each checked client's training examples, and the clients whose budget to check. dataset = "synthetic"
    gives every client the same shard: only the client with the smallest target is checked (its floor is
    every client's), so a population of 100,000 costs one check."""
    if config.data.dataset == SYNTHETIC:
        worst = min(range(num_clients), key=lambda client: config.privacy.target_epsilon_for(client, num_clients)) \
            if config.privacy.client_epsilons.strip() else 0
        return {worst: config.data.synthetic_examples}, [worst]
    split = split_of(config, num_clients)
    return dict(enumerate(len(part) for part in split.train_parts)), _trainers(config, split)


def split_of(config: RunConfig, num_clients: int) -> FederatedSplit:
    """The run's split; a missing file is blamed on the key that names it (site-file or data-root)."""
    from dirichlet_fl.data.split import federated_split

    data = config.data
    if data.partitioner == "natural" and not Path(data.site_file).is_file():
        raise FileNotFoundError(f"site-file={data.site_file!r} does not exist: give the CSV (columns index,site) "
                                "that assigns each training example to its site")
    try:
        return federated_split(config.split_spec(num_clients))
    except FileNotFoundError as error:
        raise FileNotFoundError(f"data-root={data.root!r}: {error}") from None


def _trainers(config: RunConfig, split: FederatedSplit) -> list[int]:
    """The clients that can train (shard > batch-size); the others sit out, as the server lets them.
    Raises naming batch-size when none can."""
    skipped = too_small_to_train(config, split)
    trainers = [client for client in range(len(split.train_parts)) if client not in skipped]
    if not trainers:
        largest = max(len(part) for part in split.train_parts)
        raise ValueError(f"batch-size={config.local.batch_size} is at least every client's number of training examples "
                         f"(the largest shard has {largest}), so no client could train: lower batch-size below "
                         f"{largest}")
    return trainers


def _check_budget(config: RunConfig, client: int, size: int, num_clients: int) -> float:
    """The client's floor eps; raises naming the key when its steps, delta or target cannot work."""
    target = config.privacy.target_epsilon_for(client, num_clients)
    spec = mechanism_spec(config, client, size, target)
    steps = spec.planned_steps // config.budget_rounds
    if steps > MAX_LOCAL_STEPS:
        raise ValueError(f"local-epochs={config.local.epochs:g} gives client {client} {steps:,} steps a round "
                         f"(local-epochs / q), above {MAX_LOCAL_STEPS:,}: lower local-epochs or set local-steps")
    mechanism = mechanism_class(config.privacy.mechanism)
    if not mechanism.private:
        return 0.0
    if config.privacy.delta >= 1 / size:
        raise ValueError(f"delta={config.privacy.delta:g} is too large for client {client} ({size} examples): it "
                         "must lie "
                         f"below 1/n = {1 / size:.3g}, since a delta of 1/n lets one example in n leak outright")
    if not mechanism.has_epsilon_floor:
        return 0.0
    floor = epsilon_floor(spec.sample_rate, spec.planned_steps, config.privacy.delta)
    if floor.epsilon >= target:
        key = f"client-epsilons[{client}]" if config.privacy.client_epsilons.strip() else "target-epsilon"
        error = UnreachableEpsilonError(target, floor, spec.sample_rate, spec.planned_steps, config.privacy.delta)
        raise ValueError(f"{key}: client {client} ({size} examples): {error}")
    return floor.epsilon


def _check_writable(results_dir: Path) -> None:
    """results-dir exists (or can be made) and takes a file; the run's own folder is not created here."""
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=results_dir):
            pass
    except OSError as error:
        raise OSError(f"results-dir={str(results_dir)!r} is not writable ({error.strerror or error}); choose another "
                      "folder") from None
