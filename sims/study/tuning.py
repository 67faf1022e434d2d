"""Each mechanism's rate, tuned on the validation split before the cells run (never on the test split).

For every mechanism whose rate no flag gives, seed 0 of each (partition, mechanism, eps) trains once
per rate of its optimizer's grid (SGD: --rate-grid, effective rates, e.g. `none=0.02/0.05/0.1`; Adam:
--adam-rate-grid, Adam's own units) with a stratified 20 % of the training data held out as its
evaluation set (the split --validation uses); the test split is never read. Each optimizer and each
strategy has its own choice. A strategy with a server learning rate (FedAvgM and the adaptive ones:
plan.SERVER_RATE_STRATEGIES) trains once per pair of a client rate and a server rate of --server-rate-grid,
so its client and server rates are tuned together; where the server rate chosen is the only good one and at an end
of its grid, the tuner tries one more server step that way at the client rate chosen (extended_server_rates). The
rate chosen is, among the rates (pairs) whose
validation balanced accuracy is within one point (TOLERANCE) of the best, the smallest (the smallest
client rate, then the smallest server rate): a rate at the edge of divergence may fit one start and not
another. For the same reason a run that broke down (predicted fewer than half the classes) is not chosen, nor an
extension step beyond the grid whose next larger rate broke down (at_the_edge). Each run is a row of tuning.csv
(TUNING_COLUMNS).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from dirichlet_fl.models import recipes
from privacy.accounting.analysis import PAPER_DELTA
from privacy.registry import mechanism_class
from sims.audit.config import parse_named_values
from sims.fedavg_loop import run_fedavg
from sims.study.cell import final_metrics
from sims.study.plan import (
    MECHANISMS,
    SERVER_RATE_STRATEGIES,
    Cell,
    Study,
    cells,
    clients_of,
    given_rate,
    run_config,
    tuned_mechanisms,
)

DEFAULT_GRID: dict[str, tuple[float, ...]] = {name: mechanism_class(name).sgd_rate_grid for name in MECHANISMS}
"""SGD's rates tried per mechanism (the Dirichlet ones are effective rates: each client divides by its kappa)."""
ADAM_GRID: dict[str, tuple[float, ...]] = {mechanism: recipes.ADAM_GRID for mechanism in MECHANISMS}
"""Adam's rates tried per mechanism, in Adam's own units (no kappa: docs/learning-rates.md), where the network
declares none (its Recipe's adam_grid); 1e-3 is the paper's Appendix G rate."""
DEFAULT_GRIDS = {"sgd": DEFAULT_GRID, "adam": ADAM_GRID}
GRID_FLAGS = {"sgd": "--rate-grid", "adam": "--adam-rate-grid"}
"""Each optimizer's grid flag (and the Study field it fills: rate_grid, adam_rate_grid)."""
SERVER_GRID: dict[str, tuple[float, ...]] = {
    "fedavgm": (0.1, 0.3, 1.0), "fedadam": (0.003, 0.01, 0.03), "fedyogi": (0.003, 0.01, 0.03),
    "fedadagrad": (0.01, 0.03, 0.1)}
"""The server rates tried per strategy (--server-rate-grid). FedAvgM (momentum 0.9) steps by about 10x its rate, so
0.1 is Hsu et al.'s effective server rate 1; FedAdam's and FedYogi's grids surround 0.01, the adaptive rates of
Reddi et al. 2021 and Flower's FedYogi default; FedAdagrad's surround 0.03 and reach Flower's default 0.1."""
SERVER_GRID_FLAG = "--server-rate-grid"
MAX_EXTENSION_STEPS = 5
"""--rate-extension-steps must be at most this: each step is a whole tuning run per group."""
TOLERANCE = 0.01
"""One point of balanced accuracy: the rates this close to the best count as equally good."""
TUNING_SEED = 0
TUNING_COLUMNS = ["beta", "mechanism", "epsilon", "seed", "learning_rate", "status", "balanced_accuracy", "accuracy",
                  "macro_auc", "min_class_recall", "dead_classes", "evaluated_on", "seconds", "cpu_seconds",
                  "collapsed", "predicted_classes", "optimizer", "extension", "strategy", "server_learning_rate",
                  "server_extension"]
"""`extension`: 0 for a rate of the grid, -k / +k for the k-th step the tuner tried below / above it;
`server_learning_rate`: the strategy's server rate, empty for a strategy without one (fedavg, fedprox);
`server_extension`: as `extension`, for the server rate (empty in rows from before it: 0)."""


Group = tuple[str, str, float, str, str]
"""What one rate (pair) is tuned for: (partition, mechanism, eps, optimizer, strategy)."""
TuningKey = tuple[str, str, float, str, str, float, float]
"""A tuning run: its Group, its server rate (0: none) and its client rate."""


@dataclass(frozen=True)
class TuningRun:
    """One tuning run: seed 0 of a (partition, mechanism, eps) with one optimizer at one rate of its grid, and
    one strategy at one server rate of its grid (0: a strategy without one)."""

    partition: str
    mechanism: str
    epsilon: float
    rate: float
    optimizer: str = "sgd"
    extension: int = 0
    """0: a rate of the grid; -k / +k: the k-th geometric step below / above it (extended_rates)."""
    strategy: str = "fedavg"
    server_rate: float = 0.0
    server_extension: int = 0
    """0: a server rate of --server-rate-grid; -k / +k: the k-th step below / above it (extended_server_rates)."""

    @property
    def key(self) -> TuningKey:
        return (*self.group, self.server_rate, self.rate)

    @property
    def group(self) -> Group:
        return (self.partition, self.mechanism, self.epsilon, self.optimizer, self.strategy)


def parse_rate_grid(text: str, optimizer: str = "sgd",
                    base: dict[str, tuple[float, ...]] | None = None) -> dict[str, tuple[float, ...]]:
    """'none=0.02/0.05,dpsgd=0.1' over `base` (default: the optimizer's default grids; the mechanisms named get
    the rates given), each grid sorted; ValueError naming the optimizer's grid flag for an unknown mechanism, a
    non-numeric or non-positive rate."""
    flag, grid = GRID_FLAGS[optimizer], dict(DEFAULT_GRIDS[optimizer] if base is None else base)
    for name, rates in parse_named_values(flag, text):
        if name not in MECHANISMS:
            raise ValueError(f"{flag}: unknown mechanism {name!r}; valid: {', '.join(MECHANISMS)}")
        bad = [rate for rate in rates if not (rate > 0 and math.isfinite(rate))]
        if not rates or bad:
            example = "/".join(f"{r:g}" for r in DEFAULT_GRIDS[optimizer][name])
            raise ValueError(f"{flag} {name}={'/'.join(f'{r:g}' for r in rates)} is out of range: give one "
                             f"or more rates > 0 separated by '/', e.g. {name}={example}")
        grid[name] = tuple(sorted(set(rates)))
    return grid


def study_grids(study: Study) -> dict[str, dict[str, tuple[float, ...]]]:
    """Each optimizer of the study's rate grids per mechanism."""
    texts = {"sgd": study.rate_grid, "adam": study.adam_rate_grid}
    return {optimizer: parse_rate_grid(texts[optimizer], optimizer) for optimizer in study.optimizers}


def grid_text(grid: dict[str, tuple[float, ...]], mechanisms: tuple[str, ...]) -> str:
    """The canonical text of the grids of `mechanisms` (study.json's rate_grid)."""
    return ",".join(f"{m}={'/'.join(f'{rate:g}' for rate in grid[m])}" for m in MECHANISMS if m in mechanisms)


def parse_server_grid(text: str) -> dict[str, tuple[float, ...]]:
    """'fedadam=0.01/0.03,fedavgm=0.3' over SERVER_GRID (the strategies named get the rates given), each sorted;
    ValueError naming --server-rate-grid for a strategy without a server rate, a non-numeric or non-positive rate."""
    grid = dict(SERVER_GRID)
    for name, rates in parse_named_values(SERVER_GRID_FLAG, text):
        if name not in SERVER_RATE_STRATEGIES:
            raise ValueError(f"{SERVER_GRID_FLAG}: strategy {name!r} has no server learning rate; valid: "
                             f"{', '.join(SERVER_RATE_STRATEGIES)}")
        bad = [rate for rate in rates if not (rate > 0 and math.isfinite(rate))]
        if not rates or bad:
            example = "/".join(f"{r:g}" for r in SERVER_GRID[name])
            raise ValueError(f"{SERVER_GRID_FLAG} {name}={'/'.join(f'{r:g}' for r in rates)} is out of range: give "
                             f"one or more server rates > 0 separated by '/', e.g. {name}={example}")
        grid[name] = tuple(sorted(set(rates)))
    return grid


def server_grid_text(grid: dict[str, tuple[float, ...]], strategies: tuple[str, ...]) -> str:
    """The canonical text of the server grids of `strategies` (study.json's server_rate_grid)."""
    return ",".join(f"{s}={'/'.join(f'{rate:g}' for rate in grid[s])}" for s in SERVER_RATE_STRATEGIES
                    if s in strategies)


def server_rates(study: Study, strategy: str) -> tuple[float, ...]:
    """The server rates a strategy's cells are tuned over; (0,): a strategy without one."""
    return parse_server_grid(study.server_rate_grid)[strategy] if strategy in SERVER_RATE_STRATEGIES else (0.0,)


def tuned_cells(study: Study) -> list[Cell]:
    """The cells of seed 0 whose group tunes a rate: its mechanism's rate is not given, or its strategy has a
    server rate."""
    tuned = tuned_mechanisms(study)
    return [cell for cell in cells(study) if cell.seed == TUNING_SEED and
            (cell.mechanism in tuned or cell.strategy in SERVER_RATE_STRATEGIES)]


def client_rates(study: Study, cell: Cell) -> tuple[float, ...]:
    """The client rates a cell's group is tuned over: its optimizer's grid, or the one rate its flag gives."""
    given = given_rate(study, cell.mechanism)
    return study_grids(study)[cell.optimizer][cell.mechanism] if given is None else (given,)


def tuning_runs(study: Study, rows: list[dict[str, object]] | tuple = ()) -> list[TuningRun]:
    """Every tuning run of the study, in the order of its cells (the headline eps first): per group and server
    rate, the client rates of its grid, then the extensions beyond an edge that its finished `rows` at that
    server rate call for (extended_rates); then the server rates beyond an edge of the server grid that the
    group's finished rows call for (extended_server_rates)."""
    by_slice: dict[tuple[Group, float], dict[float, dict[str, object]]] = {}
    by_group: dict[Group, list[dict[str, object]]] = {}
    for row in rows:
        key = tuning_key(row)
        by_slice.setdefault((key[:5], key[5]), {}).setdefault(key[6], row)
        by_group.setdefault(key[:5], []).append(row)
    runs = []
    for cell in tuned_cells(study):
        grid, group = client_rates(study, cell), (cell.partition, cell.mechanism, cell.epsilon, cell.optimizer,
                                                  cell.strategy)
        here = (cell.partition, cell.mechanism, cell.epsilon)
        planned = []
        for server_rate in server_rates(study, cell.strategy):
            done = by_slice.get((group, server_rate), {})
            planned += [TuningRun(*here, rate, cell.optimizer, 0, cell.strategy, server_rate) for rate in grid]
            planned += [TuningRun(*here, rate, cell.optimizer, step, cell.strategy, server_rate) for step, rate in
                        extended_rates(grid, done, study.rate_extension_steps)]
        if cell.strategy in SERVER_RATE_STRATEGIES:
            planned += [TuningRun(*here, rate, cell.optimizer, 0, cell.strategy, server_rate, step)
                        for step, server_rate, rate in extended_server_rates(
                            server_rates(study, cell.strategy), planned, by_group.get(group, []),
                            study.server_rate_extension_steps)]
        runs += planned
    return runs


def next_step(rate: float, ratio: float) -> float:
    """`rate` times `ratio`, to two significant digits (a rate one geometric step of the grid beyond `rate`)."""
    return float(f"{rate * ratio:.2g}")


def extended_rates(
    grid: tuple[float, ...], done: dict[float, dict[str, object]], steps: int
) -> list[tuple[int, float]]:
    """The rates beyond `grid` the tuner tries, as (step, rate), step -k / +k the k-th below / above, given the
    group's finished rows by rate (`done`): while every rate tried so far has finished and the only good one
    (good_rates) is the lowest or the highest, one more step that way, a geometric step of the grid's own end
    (0.02/0.05/0.1: x 1/2.5 below, x 2 above), at most `steps` each way. A grid of one rate is not extended."""
    if len(grid) < 2 or steps < 1:
        return []
    tried, extra, below, above = list(grid), [], 0, 0
    while all(rate in done for rate in tried):
        try:
            good = good_rates([done[rate] for rate in tried])
        except ValueError:  # nothing finished: no rate to extend from
            break
        if len(good) != 1:
            break
        if good[0] == tried[0] and below < steps:
            below += 1
            tried.insert(0, next_step(tried[0], grid[0] / grid[1]))
            extra.append((-below, tried[0]))
        elif good[0] == tried[-1] and above < steps:
            above += 1
            tried.append(next_step(tried[-1], grid[-1] / grid[-2]))
            extra.append((above, tried[-1]))
        else:
            break
    return extra


def extended_server_rates(
    grid: tuple[float, ...], planned: list[TuningRun], rows: list[dict[str, object]], steps: int
) -> list[tuple[int, float, float]]:
    """The server rates beyond `grid` the tuner tries, as (step, server rate, client rate), given one group's
    `planned` runs on the grid and its finished `rows`: once every run planned and every step so far has finished,
    while the only good server rate at the client rate chosen (good_pairs, choose_rates) is the lowest or the
    highest tried there, one more geometric step of the grid's own end that way (as extended_rates), at that
    client rate, at most `steps` each way. A grid of one server rate is not extended."""
    if len(grid) < 2 or steps < 1:
        return []
    finished = {tuning_key(row)[5:]: row for row in rows}
    if any((run.server_rate, run.rate) not in finished for run in planned):
        return []
    extra: list[tuple[int, float, float]] = []
    below = above = 0
    while True:
        members = [finished[key] for key in {(run.server_rate, run.rate) for run in planned}]
        members += [finished[(server, rate)] for _, server, rate in extra]
        try:
            rate = choose_rates(members)[0]
        except ValueError:
            break
        at_rate = [row for row in members if float(str(row["learning_rate"])) == rate]
        good = sorted({server for _, server in good_pairs(at_rate)})
        tried = sorted({server_rate_of(row) for row in at_rate})
        if len(good) != 1 or len(tried) < 2:
            break
        if good[0] == tried[0] and below < steps:
            below += 1
            step = (-below, next_step(tried[0], grid[0] / grid[1]), rate)
        elif good[0] == tried[-1] and above < steps:
            above += 1
            step = (above, next_step(tried[-1], grid[-1] / grid[-2]), rate)
        else:
            break
        extra.append(step)
        if (step[1], rate) not in finished:
            break
    return extra


def run_tuning(study: Study, run: TuningRun) -> dict[str, object]:
    """Train seed 0 of the run's cell at its rate; evaluate on the validation split; its tuning.csv row."""
    start, cpu_start = time.perf_counter(), time.process_time()
    cell = Cell(run.partition, run.mechanism, run.epsilon, TUNING_SEED, run.optimizer, run.strategy)
    config = run_config(study, cell, run.rate, validation=True, server_rate=run.server_rate)
    result = run_fedavg(config, clients_of(study, run.partition))
    row: dict[str, object] = {"beta": run.partition, "mechanism": run.mechanism, "epsilon": run.epsilon,
                              "seed": TUNING_SEED, "learning_rate": run.rate, "evaluated_on": "validation",
                              "optimizer": run.optimizer, "extension": run.extension, "strategy": run.strategy,
                              "server_learning_rate": run.server_rate or "", "server_extension": run.server_extension}
    metrics = final_metrics(result.rounds[-1]) if result.rounds else {}
    return {**row, "status": "ok" if metrics else "no-rounds", **metrics,
            "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start}


def optimizer_of(row: dict[str, object]) -> str:
    """A tuning.csv or table.csv row's optimizer: rows from before the column ran SGD."""
    return str(row.get("optimizer") or "sgd")


def strategy_of(row: dict[str, object]) -> str:
    """A tuning.csv or table.csv row's strategy: rows from before the column ran fedavg."""
    return str(row.get("strategy") or "fedavg")


def server_rate_of(row: dict[str, object]) -> float:
    """A tuning.csv or table.csv row's server rate: 0 for a strategy without one (empty) or a row from before."""
    return float(str(row.get("server_learning_rate") or 0.0))


def tuning_key(row: dict[str, object]) -> TuningKey:
    return (str(row["beta"]), str(row["mechanism"]), float(str(row["epsilon"])), optimizer_of(row), strategy_of(row),
            server_rate_of(row), float(str(row["learning_rate"])))


Scored = dict[tuple[float, float], tuple[float, int, bool, bool]]
"""One group's finished tuning runs: (client rate, server rate) -> (validation balanced accuracy, number of
classes predicted (0: not recorded), whether the client rate lies beyond its grid (an extension step), whether the
server rate does)."""


def scored_pairs(rows: list[dict[str, object]]) -> Scored:
    """The finished runs of `rows` (one group's tuning rows): rows that did not finish, or have no number, do not
    count. A row from before the predicted_classes column records 0 classes, one from before an extension
    column lies on that grid."""
    return {(float(str(r["learning_rate"])), server_rate_of(r)):
            (float(str(r["balanced_accuracy"])), int(float(str(r.get("predicted_classes") or 0))),
             str(r.get("extension") or "0") != "0", str(r.get("server_extension") or "0") != "0")
            for r in rows if r["status"] == "ok" and str(r["balanced_accuracy"]) not in ("", "nan")}


def diverged(scored: Scored, pair: tuple[float, float]) -> bool:
    """Whether the run at `pair` broke down: it predicted fewer than half the classes that the group's best
    predicting run did (a collapse to one class among them)."""
    most = max(classes for _, classes, _, _ in scored.values())
    return 0 < scored[pair][1] and 2 * scored[pair][1] < most


def at_the_edge(scored: Scored) -> set[tuple[float, float]]:
    """The extension steps one step below a breakdown: the next larger client rate tried at the same server rate
    diverged (a client-rate step), or the next larger server rate tried at the same client rate did (a server-rate
    step). An extension is taken on seed 0's word alone, beyond the grid's measured range; one this close to
    breaking down may fit seed 0 and collapse on another start (docs/study.md, Tuning)."""
    edge = set()
    for server in {server for _, server in scored}:
        rates = sorted(rate for rate, s in scored if s == server)
        edge |= {(low, server) for low, high in zip(rates, rates[1:])
                 if scored[(low, server)][2] and diverged(scored, (high, server))}
    for rate in {rate for rate, _ in scored}:
        servers = sorted(s for r, s in scored if r == rate)
        edge |= {(rate, low) for low, high in zip(servers, servers[1:])
                 if scored[(rate, low)][3] and diverged(scored, (rate, high))}
    return edge


def good_pairs(rows: list[dict[str, object]]) -> list[tuple[float, float]]:
    """The (client rate, server rate) pairs of `rows` (one group's tuning rows) whose validation balanced accuracy
    is within TOLERANCE of the best, ascending, among the pairs that neither broke down (diverged) nor are an
    extension step one step below a breakdown (at_the_edge); all of them when every pair is one or the other.
    Rows that did not finish, or have no number, do not count (scored_pairs). ValueError when none counts."""
    scored = scored_pairs(rows)
    if not scored:
        raise ValueError(f"no tuning run finished for {len(rows)} rate(s); see tuning.csv")
    unstable = at_the_edge(scored) | {pair for pair in scored if diverged(scored, pair)}
    eligible = {pair: score for pair, (score, *_) in scored.items() if pair not in unstable}
    eligible = eligible or {pair: score for pair, (score, *_) in scored.items()}
    best = max(eligible.values())
    return sorted(pair for pair, score in eligible.items() if score >= best - TOLERANCE - 1e-12)


def good_rates(rows: list[dict[str, object]]) -> list[float]:
    """The client rates of the good pairs (good_pairs) of `rows`: one server rate's rows, or a strategy without."""
    return sorted({rate for rate, _ in good_pairs(rows)})


def choose_rates(rows: list[dict[str, object]]) -> tuple[float, float]:
    """The smallest good pair (good_pairs) of one group's tuning rows: its client rate and its server rate."""
    return good_pairs(rows)[0]


def choose_rate(rows: list[dict[str, object]]) -> float:
    """The client rate of the smallest good pair of one group's tuning rows (choose_rates)."""
    return choose_rates(rows)[0]


def tuning_groups(study: Study, rows: list[dict[str, object]]) -> dict[Group, list[dict[str, object]]]:
    """The study's tuning rows by (partition, mechanism, eps, optimizer, strategy), rows of other studies left
    out."""
    wanted = {run.key for run in tuning_runs(study, rows)}
    groups: dict[Group, list[dict[str, object]]] = {}
    for row in rows:
        key = tuning_key(row)
        if key in wanted:
            groups.setdefault(key[:5], []).append(row)
    return groups


def describe_group(group: Group) -> str:
    """'beta=0.3 dirichlet eps=1 adam fedadam': a tuned group in a line (the optimizer named when it is not SGD,
    the strategy when it is not fedavg)."""
    partition, mechanism, epsilon, optimizer, strategy = group
    return (f"beta={partition} {mechanism} eps={epsilon:g}" + ("" if optimizer == "sgd" else f" {optimizer}")
            + ("" if strategy == "fedavg" else f" {strategy}"))


def chosen_rates(study: Study, rows: list[dict[str, object]]) -> dict[Group, tuple[float, float]]:
    """The (client rate, server rate) chosen for every tuned (partition, mechanism, eps, optimizer, strategy) of
    the study, from its tuning rows (server rate 0: a strategy without one)."""
    chosen = {}
    for group, members in tuning_groups(study, rows).items():
        try:
            chosen[group] = choose_rates(members)
        except ValueError as error:
            raise ValueError(f"tuning {describe_group(group)}: {error}") from None
    return chosen


def edge_warnings(study: Study, rows: list[dict[str, object]]) -> list[str]:
    """One line per tuned group whose only good rate (good_rates) is still the lowest or the highest of the
    two or more rates tried once the grid has been extended as far as --rate-extension-steps allows: the best
    rate may lie beyond, so the cells may run at a worse one (the robustness grid of BENCHMARKS.md section
    11.2 found GroupNorm networks tuned to the grid's lowest rate, and collapsing). A tie with an inner rate is
    no warning: the best lies inside. The client rate is judged among the runs at the server rate chosen, the
    server rate among the runs at the client rate chosen, once --server-rate-grid has been extended as far as
    --server-rate-extension-steps allows."""
    lines = []
    for group, members in tuning_groups(study, rows).items():
        rate, server_rate = choose_rates(members)
        partition, mechanism, epsilon, optimizer, strategy = group
        grid = client_rates(study, Cell(partition, mechanism, epsilon, TUNING_SEED, optimizer, strategy))
        client_line = _client_edge(study, group, grid, [r for r in members if server_rate_of(r) == server_rate])
        lines += [client_line] if client_line else []
        if strategy in SERVER_RATE_STRATEGIES:
            at_rate = [r for r in members if float(str(r["learning_rate"])) == rate]
            server_line = _server_edge(study, group, server_rates(study, strategy), at_rate)
            lines += [server_line] if server_line else []
    return lines


def _client_edge(study: Study, group: Group, grid: tuple[float, ...], members: list[dict[str, object]]) -> str:
    """edge_warnings' line for the client rate of `group` over its runs `members` at one server rate ('': none)."""
    flag = GRID_FLAGS[group[3]]
    tried = sorted({float(str(r["learning_rate"])) for r in members})  # one: a server step, at one client rate
    return _edge_line(group, "rate", good_rates(members), tried, grid, f"{flag} {group[1]}", flag,
                      ("--rate-extension-steps", study.rate_extension_steps))


def _server_edge(study: Study, group: Group, grid: tuple[float, ...], members: list[dict[str, object]]) -> str:
    """edge_warnings' line for the server rate of `group` over its runs `members` at one client rate ('': none)."""
    good = sorted({server for _, server in good_pairs(members)})
    tried = sorted({server_rate_of(r) for r in members})
    return _edge_line(group, "server rate", good, tried, grid, f"{SERVER_GRID_FLAG} {group[4]}", SERVER_GRID_FLAG,
                      ("--server-rate-extension-steps", study.server_rate_extension_steps))


def _edge_line(group: Group, what: str, good: list[float], tried: list[float], grid: tuple[float, ...],
               grid_name: str, flag: str, bound: tuple[str, int]) -> str:
    """The warning for a `what` ("rate", "server rate") whose only good value is the lowest or highest of the two or
    more `tried` (grid and extension steps; the most the `bound` flag allows); '' when there is none."""
    if len(grid) < 2 or len(tried) < 2 or len(good) != 1 or good[0] not in (tried[0], tried[-1]):
        return ""
    edge, side = ("lowest", "below") if good[0] == tried[0] else ("highest", "above")
    beyond = [r for r in tried if (r < grid[0] if side == "below" else r > grid[-1])]
    grid_text_ = f"{grid_name}={'/'.join(f'{r:g}' for r in grid)}"
    where = (f"the {edge} of {grid_text_}" if not beyond else
             f"the {edge} of the {what}s tried ({grid_text_} and {len(beyond)} step{'s' * (len(beyond) > 1)} "
             f"{side} it, {'/'.join(f'{r:g}' for r in beyond)}: the most {bound[0]}={bound[1]} allows)")
    return (f"tuning {describe_group(group)}: the {what} chosen, {good[0]:g}, is {where} and the only one "
            f"within a point of the best; a better one may lie {side} it: widen {flag}")


def describe_choice(study: Study, rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each tuned group's choice and every rate it tried, grid and extensions, and every server rate (for the
    summary and strict JSON: eps infinity as 'inf'; a strategy without a server rate: server rate None)."""
    groups = tuning_groups(study, rows)
    choices: list[dict[str, object]] = []
    for (p, m, e, o, s), (rate, server_rate) in chosen_rates(study, rows).items():
        members = groups[(p, m, e, o, s)]
        choices.append({"beta": p, "mechanism": m, "epsilon": e if math.isfinite(e) else "inf",
                        "delta": PAPER_DELTA, "optimizer": o, "learning_rate": rate,
                        "tried": sorted({float(str(r["learning_rate"])) for r in members}), "strategy": s,
                        "server_learning_rate": server_rate or None,
                        "server_tried": sorted({server_rate_of(r) for r in members if server_rate_of(r)})})
    return choices
