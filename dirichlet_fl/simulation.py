"""Run this Flower app on Flower's Ray simulation engine from Python, with run-config overrides.

`flwr run .` is the way to run the app; this is the same engine in-process (what `flwr run` does
inside its simulation process: fuse pyproject's config with the overrides, hand both apps the fused
run config), for tests and benchmarks that need many runs without a detached SuperLink. It relies
on flwr 1.42's `_run_simulation`, which is why flwr is pinned.
"""

from __future__ import annotations

import os
from typing import Any

from flwr.app import Context, RecordDict
from flwr.common.config import get_fused_config_from_dir
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.simulation.run_simulation import _run_simulation
from flwr.supercore.constant import NOOP_FEDERATION_ID
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.supercore.telemetry import EventType

from dirichlet_fl.paths import APP_DIR


def simulate(
    overrides: dict[str, Any],
    num_supernodes: int,
    num_cpus_per_client: float = 1.0,
    num_gpus_per_client: float = 0.0,
    ray_address: str | None = None,
    ray_num_cpus: int | None = None,
) -> None:
    """Run one federation of `num_supernodes` clients with run-config `overrides` (kebab-case keys).

    Clients run as Ray actors of `num_cpus_per_client` CPUs and `num_gpus_per_client` GPUs each (0.25:
    four share a GPU). `ray_address` ("127.0.0.1:6379", or "auto") joins a running Ray cluster (`ray start
    --head` plus `ray start --address` on each machine) instead of starting a private one; the actors
    then spread over every node of the cluster. Without it the run starts a private Ray instance (Ray's
    address "local") even where a `ray start` cluster or $RAY_ADDRESS is about, which a plain
    `ray.init()` would join silently. `ray_num_cpus` caps the CPUs that private instance may use (None: every
    core), and with them the actors: 1 runs one actor, which serves every client in turn (each actor is a process
    that imports torch and the app, seconds of CPU before its first message). A private instance prestarts none of
    Ray's task workers (one per CPU otherwise, each a process that imports Ray), which actors never use. Ray's
    dashboard is off (nothing here reads it); Ray 2.55 still starts a minimal API server and a dashboard agent per
    node (BENCHMARKS.md, section 6.1)."""
    if ray_address is not None and ray_num_cpus is not None:
        raise ValueError(f"ray_num_cpus={ray_num_cpus} with ray_address={ray_address!r}: a running Ray cluster has "
                         "its own CPUs; give one of the two")
    if ray_num_cpus is not None and (isinstance(ray_num_cpus, bool) or not isinstance(ray_num_cpus, int)
                                     or ray_num_cpus < 1):
        raise ValueError(f"ray_num_cpus={ray_num_cpus!r} is out of range: give an integer >= 1, or None for every core")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    run = Run.create_empty(run_id=1)
    run.override_config = dict(overrides)
    run.primary_task_id = 1
    run.federation_id = NOOP_FEDERATION_ID
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run.run_id, SUPERLINK_NODE_ID
    run_config = get_fused_config_from_dir(APP_DIR, run.override_config)
    context = Context(run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    init_args: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": True, "include_dashboard": False,
                                 "address": "local" if ray_address is None else ray_address}
    if ray_address is None:  # Flower's clients are actors: a private instance needs none of Ray's pooled task workers
        init_args["_system_config"] = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
    if ray_num_cpus is not None:
        init_args["num_cpus"] = ray_num_cpus
    backend_config: dict[str, dict[str, Any]] = {
        "client_resources": {"num_cpus": num_cpus_per_client, "num_gpus": num_gpus_per_client},
        "init_args": init_args,
    }
    _run_simulation(
        num_supernodes=num_supernodes,
        exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
        server_app_attr="server.server_app:app",
        client_app_attr="client.client_app:app",
        backend_config=backend_config,
        app_dir=str(APP_DIR),
        run=run,
        server_app_context=context,
        is_app=True,
    )
