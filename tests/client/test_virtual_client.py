"""A SuperNode serving virtual clients (num-clients): each message names its client, and the node loads
THAT client's shard and ledger file, keeps nothing of it in its own state, and checks the server's code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord

import client.client_app as client_app
from dirichlet_fl.config import RunConfig
from dirichlet_fl.data.split import client_shard, federated_split
from dirichlet_fl.models.run_model import initial_model
from dirichlet_fl.protocol import CLIENT_ID_KEY, CODE_KEY, CODE_MISMATCH, RUN_DIR_KEY, SETUP_FAILED, code_fingerprint
from privacy.registry import restore_mechanism
from tests.helpers import client_context, train_message

CLIENTS = 6
OVERRIDES = {"num-server-rounds": 3, "local-steps": 4, "partitioner": "iid", "num-clients": CLIENTS}


def message(context, client: int, server_round: int, run_dir: Path, kind: str = "train", code: str = ""):
    config = RunConfig.from_run_config(context.run_config)
    arrays = ArrayRecord(initial_model(config, federated_split(config.split_spec(CLIENTS)).data).state_dict())
    msg = train_message(arrays, server_round, kind)
    msg.content["config"][CLIENT_ID_KEY] = client
    msg.content["config"][RUN_DIR_KEY] = str(run_dir)
    msg.content["config"][CODE_KEY] = code or code_fingerprint(client_app.APP_DIR)
    return msg


def test_the_node_trains_the_named_client_with_its_shard_and_its_ledger_file(tmp_path: Path) -> None:
    context = client_context(OVERRIDES, partition_id=0, num_partitions=2)  # the node's own partition is 0 of 2
    first = client_app.train(message(context, 4, 1, tmp_path), context).content["metrics"]
    config = RunConfig.from_run_config(context.run_config)
    shard = client_shard(config.split_spec(CLIENTS), 4, torch.device("cpu"))
    assert first["partition-id"] == 4 and first["num-examples"] == 10 * round(shard.num_examples / 10)
    assert first["sample-rate"] == float(f"{config.local.batch_size / shard.num_examples:.2g}")
    assert sorted(path.name for path in (tmp_path / "ledgers").glob("*.json")) == ["partition-4.json"]
    assert "privacy" not in context.state  # the node serves other clients: the ledger is the file alone
    client_app.train(message(context, 2, 1, tmp_path), context)  # another client on the same node
    second = client_app.train(message(context, 4, 2, tmp_path), context).content["metrics"]
    assert second["steps"] == 8  # client 4's own ledger, composed across rounds, not client 2's
    run_file = client_app.run_state_file(message(context, 4, 2, tmp_path), 4)
    assert run_file is not None and restore_mechanism(run_file.current() or {}).steps == 8


def test_evaluation_uses_the_named_clients_local_test_share(tmp_path: Path) -> None:
    context = client_context(OVERRIDES)
    config = RunConfig.from_run_config(context.run_config)
    sizes = {len(part) for part in federated_split(config.split_spec(CLIENTS)).test_parts}
    metrics = client_app.evaluate_locally(message(context, 5, 1, tmp_path, "evaluate"), context).content["metrics"]
    assert metrics["num-examples"] in {10 * round(size / 10) for size in sizes}
    assert 0 <= metrics["eval-accuracy"] <= 1


def test_a_client_id_outside_num_clients_is_a_setup_failure(tmp_path: Path) -> None:
    context = client_context(OVERRIDES)
    reply = client_app.train(message(context, CLIENTS, 1, tmp_path), context)
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert f"client-id={CLIENTS} is out of range" in reply.error.reason


def test_other_client_code_is_refused_on_the_first_message(tmp_path: Path) -> None:
    context = client_context(OVERRIDES)
    for kind, handler in (("train", client_app.train), ("evaluate", client_app.evaluate_locally)):
        reply = handler(message(context, 1, 1, tmp_path, kind, code="0" * 64), context)
        assert reply.has_error() and reply.error.code == CODE_MISMATCH
        assert "differs from the submitted app" in reply.error.reason
    assert not (tmp_path / "ledgers").exists()


@pytest.mark.usefixtures("on_a_supernode")
def test_a_site_refuses_a_message_for_a_virtual_client(tmp_path: Path) -> None:
    context = client_context(OVERRIDES | {"mechanism": "dirichlet"})
    context.node_config["insecure-noise"] = True
    reply = client_app.train(message(context, 1, 1, tmp_path), context)
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert "num-clients is for simulation only" in reply.error.reason
