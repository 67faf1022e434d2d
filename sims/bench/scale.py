"""`bench scale`: how a round's cost, the start-up and the memory grow with the number of clients.

The app runs on Flower's simulation engine (one fresh child per population, measured by
sims.bench.simulation.measure_run) with the same work per round at every population: a fixed number of
sampled clients, local steps and batch size, on MNIST t10k. The report gives each population's steady
seconds per round, start-up seconds and peak memory, and their ratios to the smallest population.
`--num-supernodes N` measures virtual clients instead: N SuperNodes serve every population (num-clients
= the population), `--dataset synthetic` generates each sampled client's examples (dirichlet_fl.data.synthetic,
model logreg), and `--flwr-run` runs each population through `flwr run` with a SuperLink of its own
(sims.bench.simulation.measure_flwr_run); each row also checks every client's eps against its target and
that the ledger files are exactly the trained clients'.
`--profile-linkstate` also times the per-0.1 s sweep of Flower 1.42's in-memory LinkState, which costs
nodes x stored messages. BENCHMARKS.md, section 6.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from dirichlet_fl.runs.reader import read_rows, read_summary
from sims.bench.simulation import measure_flwr_run, measure_run, parse_overrides, steady_and_fixed

MAX_TIME_RATIO = 2.0
MAX_MEMORY_RATIO = 1.5


def population_overrides(args: argparse.Namespace, population: int) -> dict[str, Any]:
    """The run config of one population: the same sampled clients and local work at every size."""
    fraction = args.sampled / population
    data = ({"dataset": "synthetic", "model": "logreg"} if args.dataset == "synthetic" else
            {"dataset": "mnist-idx", "data-root": str(Path(args.data_root).resolve()), "partitioner": "iid"})
    base = data | {
        "num-server-rounds": args.rounds,
        "local-steps": args.local_steps,
        "batch-size": args.batch_size,
        "fraction-train": fraction,
        "fraction-evaluate": fraction,
        "num-clients": population if args.num_supernodes else 0,
    }
    return base | parse_overrides(args.run_config)


def ledger_check(run_dir: Path) -> dict[str, Any]:
    """Whether every client's eps stayed within its target, and whether the ledger files are exactly the
    clients that trained (ledger.csv's `trained` rows)."""
    summary = read_summary(run_dir)
    over = [client["id"] for client in summary["clients"]
            if client["epsilon"] is not None and client["epsilon"] > client["target_epsilon"]]
    trained = {int(row["client"]) for row in read_rows(run_dir / "ledger.csv") if row["status"] == "trained"}
    files = {int(path.stem.split("-")[1]) for path in (run_dir / "ledgers").glob("partition-*.json")}
    return {"clients_over_budget": over, "trained_clients": len(trained), "ledger_files": len(files),
            "ledgers_match_trained": files == trained, "max_epsilon": summary["max_epsilon"]}


def _populations(text: str, sampled: int) -> list[int]:
    try:
        populations = sorted({int(item) for item in text.split(",") if item.strip()})
    except ValueError:
        raise ValueError(f"--populations={text!r}: give comma-separated integers, e.g. 10,100,1000") from None
    if not populations or populations[0] < sampled:
        raise ValueError(f"--populations={text!r}: every population must be >= --sampled={sampled}")
    return populations


def sweep_seconds(nodes: int, stored_messages: int, repeats: int = 3) -> float:
    """Median seconds of one sweep of Flower's simulation message extractor over `nodes` registered
    nodes while `stored_messages` messages wait in the in-memory LinkState (vce_api.add_messages_to_queue
    calls get_message_ins(node, limit=1) for every node, every 0.1 s)."""
    from flwr.app import Message, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.federation import NoOpFederationManager

    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    state = factory.state()
    run = Run.create_empty(run_id=1)
    run.federation_id = NOOP_FEDERATION_ID
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run.run_id, SUPERLINK_NODE_ID
    state.run_ids[run.run_id] = RunRecord(run=run)  # as flwr.simulation.run_simulation registers its run
    mapping = _register_nodes(nodes, factory)
    targets = set(list(mapping)[nodes - stored_messages:])
    for node in targets:  # the last nodes hold the messages: every other node's scan reads them all
        message = Message(RecordDict(), dst_node_id=node, message_type="query")
        message.metadata.__dict__.update(_run_id=run.run_id, _src_node_id=SUPERLINK_NODE_ID,
                                         _message_id=str(node), _ttl=3600.0)
        state.message_ins_store[str(node)] = message
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for node in mapping:
            if node not in targets:
                state.get_message_ins(node_id=node, limit=1)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    """One Flower run per population, smallest first; ratios against the smallest."""
    for name in ("sampled", "rounds", "local_steps", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.rounds < 2:
        raise ValueError(f"--rounds={args.rounds} must be >= 2 (round 1 also calibrates every client)")
    if args.num_supernodes < 0:
        raise ValueError(f"--num-supernodes={args.num_supernodes} must be >= 0 (0: one SuperNode per client)")
    if args.dataset not in ("mnist-idx", "synthetic"):
        raise ValueError(f"--dataset={args.dataset!r} is invalid: choose mnist-idx or synthetic")
    data_root = Path(args.data_root)
    mnist_files = (data_root / "t10k-images-idx3-ubyte.gz", data_root / "t10k-images-idx3-ubyte")
    if args.dataset == "mnist-idx" and not any(path.is_file() for path in mnist_files):
        raise FileNotFoundError(
            f"--data-root={args.data_root!r} holds no t10k-images-idx3-ubyte[.gz] (MNIST IDX files)"
        )
    populations = _populations(args.populations, args.sampled)
    for population in populations:
        _validate(population_overrides(args, population))
    rows = []
    for population in populations:
        out, nodes = out_dir / f"clients-{population}", args.num_supernodes or population
        if args.flwr_run:
            result = measure_flwr_run(population_overrides(args, population), nodes, out, args.ray_worker_niceness)
        else:
            result = measure_run("flower", population_overrides(args, population), nodes, out,
                                 args.ray_worker_niceness)
        steady, fixed = steady_and_fixed(result)
        rows.append({"clients": population, "steady_seconds_per_round": steady, "startup_seconds": fixed,
                     "round_seconds": result["round_seconds"], "wall_seconds": result["wall_seconds"],
                     "peak_rss_bytes": result["peak_rss_bytes"], "peak_pss_bytes": result["peak_pss_bytes"],
                     "processes_at_peak": result["processes_at_peak"], "final_accuracy": result["final_accuracy"],
                     "failed_client_rounds": result["failed_client_rounds"], "supernodes": nodes,
                     **ledger_check(out / "run")})
    base = rows[0]
    for row in rows:
        row["time_ratio"] = row["steady_seconds_per_round"] / base["steady_seconds_per_round"]
        row["memory_ratio"] = row["peak_rss_bytes"] / base["peak_rss_bytes"]
        if args.profile_linkstate:
            row["linkstate_sweep_seconds"] = {str(m): sweep_seconds(row["clients"], m) for m in (0, args.sampled)}
    largest = rows[-1]
    return {
        "populations": rows,
        "targets": {
            "time_ratio": {"target": f"<= {MAX_TIME_RATIO} at {largest['clients']} vs {base['clients']} clients",
                           "met": largest["time_ratio"] <= MAX_TIME_RATIO},
            "memory_ratio": {"target": f"<= {MAX_MEMORY_RATIO} at {largest['clients']} vs {base['clients']} clients",
                             "met": largest["memory_ratio"] <= MAX_MEMORY_RATIO},
        },
        "config": {"sampled": args.sampled, "rounds": args.rounds, "local_steps": args.local_steps,
                   "batch_size": args.batch_size, "data_root": args.data_root, "run_config": args.run_config,
                   "ray_worker_niceness": args.ray_worker_niceness, "num_supernodes": args.num_supernodes,
                   "dataset": args.dataset, "flwr_run": args.flwr_run},
    }


def _validate(overrides: dict[str, Any]) -> None:
    """Validate one population's run config before anything expensive runs (raises ValueError)."""
    from flwr.common.config import get_fused_config_from_dir

    from dirichlet_fl.config import RunConfig
    from dirichlet_fl.paths import APP_DIR

    RunConfig.from_run_config(get_fused_config_from_dir(APP_DIR, overrides))


def summary_lines(report: dict[str, Any]) -> list[str]:
    """One line per population, then the targets."""
    config = report["config"]
    lines = [f"{config['sampled']} clients sampled per round, {config['local_steps']} local steps of batch "
             f"{config['batch_size']}, {config['rounds']} rounds:"]
    for row in report["populations"]:
        sweep = row.get("linkstate_sweep_seconds")
        extra = f"  LinkState sweep {sweep[str(config['sampled'])] * 1000:.1f} ms" if sweep else ""
        lines.append(
            f"  {row['clients']:>6} clients  start-up {row['startup_seconds']:7.1f} s  "
            f"{row['steady_seconds_per_round']:6.2f} s/round (x{row['time_ratio']:.2f})  "
            f"peak RSS {row['peak_rss_bytes'] / 1024**3:5.2f} GB (x{row['memory_ratio']:.2f}), "
            f"PSS {row['peak_pss_bytes'] / 1024**3:4.2f} GB{extra}"
        )
        if "ledgers_match_trained" in row:
            lines.append(f"         {row['trained_clients']} clients trained, max eps {row['max_epsilon']:.4f}, "
                         f"over budget: {len(row['clients_over_budget'])}, ledger files match: "
                         f"{row['ledgers_match_trained']}")
    for key, target in report["targets"].items():
        lines.append(f"  {key}: target {target['target']}: {'met' if target['met'] else 'MISSED'}")
    return lines
