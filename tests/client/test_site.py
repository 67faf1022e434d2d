"""A site's own word: node-config policy, a noise secret that never leaves the node, its own data file,
a lifetime ledger across runs, and what the coordinator receives."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, RecordDict
from flwr.common.config import get_fused_config_from_dir

import client.client_app as client_app
from client.durable.lifetime_ledger import LifetimeLedger
from client.site import SitePolicy, node_secret, open_lifetime_ledger, public_reason
from dirichlet_fl.config import RunConfig
from dirichlet_fl.config_groups import PrivacyConfig
from dirichlet_fl.data.data_file import write_site_file
from dirichlet_fl.data.loaders import load_dataset
from dirichlet_fl.data.split import federated_split
from dirichlet_fl.models.run_model import initial_model
from dirichlet_fl.protocol import BUDGET_EXHAUSTED, POLICY_REFUSED, SETUP_FAILED
from dirichlet_fl.simulation import APP_DIR
from tests.helpers import leaks, set_task_identity, train_message

RUN = {"num-server-rounds": 2, "local-steps": 4, "partitioner": "iid"}


def context(node: dict[str, Any], run: dict[str, Any] | None = None, run_id: int = 1) -> Context:
    set_task_identity()
    run_config = get_fused_config_from_dir(APP_DIR, RUN | (run or {}))
    node_config = {"partition-id": 0, "num-partitions": 2} | node
    return Context(run_id=run_id, node_id=7, node_config=node_config, state=RecordDict(), run_config=run_config)


def arrays(ctx: Context) -> ArrayRecord:
    config = RunConfig.from_run_config(ctx.run_config)
    return ArrayRecord(initial_model(config, federated_split(config.split_spec(2)).data).state_dict())


def train(ctx: Context, server_round: int = 1):
    return client_app.train(train_message(arrays(ctx), server_round), ctx)


def weights(reply) -> dict[str, torch.Tensor]:
    return reply.content["arrays"].to_torch_state_dict()


def same(first, second) -> bool:
    return all(torch.equal(a, b) for a, b in zip(weights(first).values(), weights(second).values()))


def test_two_nodes_with_the_same_run_config_draw_different_noise(tmp_path: Path) -> None:
    first = train(context({"secret-dir": str(tmp_path / "a")}))
    second = train(context({"secret-dir": str(tmp_path / "b")}))
    assert not same(first, second)
    assert first.content["metrics"]["node-secret"] == 1
    secret = tmp_path / "a" / "node-secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    before = secret.read_text()
    train(context({"secret-dir": str(tmp_path / "a")}))
    assert secret.read_text() == before  # the same node keeps its secret


def test_the_same_node_never_repeats_its_noise_in_another_run(tmp_path: Path) -> None:
    """Without ledger-dir the run id, round and steps are the same in every run: the nonce the site draws
    per run (kept in the node's state) is what keeps the noise fresh."""
    node = {"secret-dir": str(tmp_path)}
    first_run, second_run = context(node, run_id=1), context(node, run_id=1)  # two runs, same everything
    first, second = train(first_run), train(second_run)
    assert not same(first, second)
    nonce = first_run.state["site-noise"]["1"]
    assert len(str(nonce)) == 32 and nonce != second_run.state["site-noise"]["1"]
    again = context(node, run_id=1)
    again.state["site-noise"] = first_run.state["site-noise"]  # the same run, a later process
    assert same(train(again), first)


def test_without_a_secret_the_seed_reproduces_a_round_exactly_and_secure_noise_does_not() -> None:
    first, second = train(context({})), train(context({}))
    assert all(torch.equal(a, b) for a, b in zip(weights(first).values(), weights(second).values()))
    assert first.content["metrics"]["node-secret"] == 0
    secure = [train(context({}, {"secure-noise": True})) for _ in range(2)]
    assert secure[0].content["metrics"]["node-secret"] == 1
    assert not all(torch.equal(a, b) for a, b in zip(weights(secure[0]).values(), weights(secure[1]).values()))


def test_a_corrupt_secret_is_named_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "node-secret").write_text("not hex\n")
    policy = SitePolicy.from_node_config({"partition-id": 0, "num-partitions": 1, "secret-dir": str(tmp_path)})
    with pytest.raises(ValueError, match=f"node secret {tmp_path}/node-secret is unreadable"):
        node_secret(policy, RunConfig())


@pytest.mark.parametrize(
    ("node", "run", "match"),
    [
        ({"max-target-epsilon": 2.0}, {"target-epsilon": 1e9},
         "target-epsilon=1e+09 above this site's max-target-epsilon=2"),
        ({"delta": 1e-6}, {}, "delta=1e-05 above this site's delta=1e-06 (node-config key delta)"),
        ({"alpha": 2.0}, {}, "alpha=3; this site trains with alpha=2 only"),
        ({"allowed-mechanisms": "dpsgd"}, {}, "mechanism='dirichlet'; this site trains with dpsgd only "
                                             "(node-config key allowed-mechanisms)"),
    ],
)
def test_a_run_asking_more_than_the_site_allows_is_refused(node: dict, run: dict, match: str) -> None:
    reply = train(context(node, run))
    assert reply.has_error() and reply.error.code == POLICY_REFUSED
    assert reply.error.reason.startswith("client 0: site policy:")
    assert match in reply.error.reason


@pytest.mark.parametrize(
    ("run", "match"),
    [
        ({"delta": 0.001}, "the run asks delta=0.001 above this site's delta=1e-05 (node-config key delta)"),
        ({"mechanism": "none"}, "mechanism='none'; this site trains with dirichlet,dpsgd only "
                                "(node-config key allowed-mechanisms)"),
    ],
)
def test_a_site_that_sets_no_policy_still_refuses_a_weaker_guarantee(
    tmp_path: Path, on_a_supernode: None, run: dict, match: str
) -> None:
    """On the Deployment Engine a site's defaults hold: delta <= 1e-5, private mechanisms only; the refused
    request writes nothing to the lifetime ledger."""
    node = {"ledger-dir": str(tmp_path / "ledgers"), "lifetime-epsilon": 3.0}
    assert not train(context(node, run_id=1)).has_error()
    ledger_file = next((tmp_path / "ledgers").glob("ledger-*.json"))
    before = ledger_file.read_bytes()
    reply = train(context(node, run, run_id=2))
    assert reply.has_error() and reply.error.code == POLICY_REFUSED and match in reply.error.reason
    assert ledger_file.read_bytes() == before


def test_in_simulation_the_node_config_is_flowers_and_sets_no_policy() -> None:
    policy = SitePolicy.from_node_config({"partition-id": 0, "num-partitions": 2})
    assert policy.refusal(RunConfig(privacy=PrivacyConfig(mechanism="none", delta=0.001)), 1.0) is None


def test_a_supernode_without_a_secret_dir_is_refused_unless_it_opts_out(on_a_supernode: None) -> None:
    reply = train(context({}))
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert "secret-dir is not set" in reply.error.reason and "insecure-noise=true" in reply.error.reason
    insecure = train(context({"insecure-noise": True}))
    assert not insecure.has_error() and insecure.content["metrics"]["node-secret"] == 0


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("allowed-mechanisms", "dirichlet,nope", "allowed-mechanisms='dirichlet,nope' is invalid"),
        ("allowed-mechanisms", "", "allowed-mechanisms='' is invalid"),
        ("insecure-noise", "yes", "insecure-noise='yes' is invalid: it must be true or false"),
    ],
)
def test_bad_policy_keys_are_named(key: str, value: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SitePolicy.from_node_config({"partition-id": 0, "num-partitions": 1, key: value})


def test_the_sites_target_wins_and_the_coordinator_cannot_raise_it() -> None:
    metrics = train(context({"target-epsilon": 0.8}, {"target-epsilon": 1e9})).content["metrics"]
    assert metrics["target-epsilon"] == 0.8 and metrics["epsilon"] <= 0.8


def test_unknown_node_config_keys_are_named() -> None:
    reply = train(context({"target-epsilom": 1.0}))
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert "unknown node-config keys ['target-epsilom']" in reply.error.reason


def test_metrics_send_no_exact_count_and_no_traceback() -> None:
    metrics = train(context({})).content["metrics"]
    assert metrics["num-examples"] % 10 == 0
    assert set(metrics) >= {"epsilon", "delta", "steps", "sample-rate", "target-epsilon", "can-continue", "train-loss"}
    weighted = train(context({"aggregation-weight": 3.0})).content["metrics"]
    assert weighted["num-examples"] == 3.0


def site_file(tmp_path: Path, name: str = "site.npz", examples: int = 300) -> Path:
    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    return write_site_file(tmp_path / name, data, rng.choice(len(data.train_y), examples, replace=False), np.arange(50))


def test_a_site_trains_on_its_own_data_file(tmp_path: Path) -> None:
    reply = train(context({"data-file": str(site_file(tmp_path))}))
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert reply.content["metrics"]["num-examples"] == 300


@pytest.mark.parametrize("problem", ["missing", "not-npz", "no-labels"])
def test_a_missing_or_malformed_data_file_is_named(tmp_path: Path, problem: str) -> None:
    path = tmp_path / "site.npz"
    if problem == "not-npz":
        path.write_text("hello")
    elif problem == "no-labels":
        np.savez(path, train_images=np.zeros((4, 8, 8), np.uint8))
    reply = train(context({"data-file": str(path)}))
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert f"data-file {path}" in reply.error.reason and "\n" not in reply.error.reason


def test_a_site_tells_the_coordinator_neither_its_paths_nor_its_exact_counts(
    tmp_path: Path, on_a_supernode: None, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "private" / "site.npz"
    reply = train(context({"data-file": str(path), "secret-dir": str(tmp_path / "secret")}))
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert str(tmp_path) not in reply.error.reason and "its data could not be read (ValueError)" in reply.error.reason
    assert f"data-file {path}: file not found" in capfd.readouterr().err  # the site's own log has the whole line
    small = site_file(tmp_path, "small.npz", examples=5)
    reply = train(context({"data-file": str(small), "secret-dir": str(tmp_path / "secret")}, {"batch-size": 8}))
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert "has <10 examples" in reply.error.reason and " 5 " not in reply.error.reason + " "


def test_public_reasons_keep_the_key_and_the_ledger_summary() -> None:
    policy = SitePolicy.from_node_config({"partition-id": 1, "num-partitions": 2, "cache-dir": "/srv/site/cache"})
    reason = ("client 1: batch-size=8 needs ..., but client 1 has 5 examples: lower batch-size below 5; "
              "cache /srv/site/cache/shard-1.pt, data /home/x/y.npz (1234 training examples)"
              ' ledger={"steps": 5}')
    assert public_reason(reason, policy) == (
        "client 1: batch-size=8 needs ..., but client 1 has <10 examples: lower batch-size below <10; "
        'cache <cache-dir>/shard-1.pt, data <path> (~1230 training examples) ledger={"steps": 5}'
    )


def test_a_site_does_not_send_its_test_confidence_as_an_adaptive_learning_rate(
    tmp_path: Path, on_a_supernode: None
) -> None:
    node = {"secret-dir": str(tmp_path)}
    adaptive_paper = {"learning-rate-mode": "adaptive", "dirichlet-weighting": "paper"}
    adaptive = train(context(node, adaptive_paper)).content["metrics"]
    effective = train(context(node, {"learning-rate-mode": "effective"})).content["metrics"]
    assert "learning-rate" not in adaptive and effective["learning-rate"] > 0


def test_everything_a_site_creates_is_private_to_it(tmp_path: Path, on_a_supernode: None) -> None:
    site = tmp_path / "site"
    node = {"ledger-dir": str(site / "ledgers"), "secret-dir": str(site / "secret"), "cache-dir": str(site / "cache")}
    assert not train(context(node)).has_error()
    created = [path for path in site.rglob("*")]
    assert any(path.name.startswith("shard-") for path in created)
    for path in created:
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    assert stat.S_IMODE(site.stat().st_mode) == 0o700


def test_the_lifetime_ledger_continues_across_runs_and_refuses_when_spent(tmp_path: Path) -> None:
    node = {"ledger-dir": str(tmp_path), "lifetime-epsilon": 1.6, "data-file": str(site_file(tmp_path))}
    first = train(context(node, run_id=11))
    assert not first.has_error(), first.error.reason if first.has_error() else ""
    ledger_file = next(tmp_path.glob("ledger-*.json"))
    assert stat.S_IMODE(ledger_file.stat().st_mode) == 0o600
    stored = json.loads(ledger_file.read_text())
    assert list(stored["runs"]) == ["11"] and stored["runs"]["11"]["complete"]
    one_run = stored["lifetime_epsilon_spent"]
    second = train(context(node | {"lifetime-epsilon": one_run * 1.3}, run_id=12))
    assert not second.has_error()
    stored = json.loads(ledger_file.read_text())
    assert list(stored["runs"]) == ["11", "12"]
    assert one_run < stored["lifetime_epsilon_spent"] <= one_run * 1.3
    spent = node | {"lifetime-epsilon": stored["lifetime_epsilon_spent"] * 1.0001}
    third = train(context(spent, run_id=13))
    assert third.has_error() and third.error.code == BUDGET_EXHAUSTED
    assert "lifetime budget spent" in third.error.reason


def test_bad_ledger_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    node = {"ledger-dir": str(tmp_path), "data-file": str(site_file(tmp_path))}
    assert not train(context(node, run_id=1)).has_error()
    ledger_file = next(tmp_path.glob("ledger-*.json"))
    spent = json.loads(ledger_file.read_text())["lifetime_epsilon_spent"]
    too_low = train(context(node | {"lifetime-epsilon": spent / 2}, run_id=2))
    assert too_low.has_error() and too_low.error.code == SETUP_FAILED
    assert "is below what this site already spent" in too_low.error.reason and str(ledger_file) in too_low.error.reason
    stored = json.loads(ledger_file.read_text())
    other = tmp_path / "other"
    LifetimeLedger(other, "f" * 64, 1e-5, None, tmp_path).commit("1", stored["runs"]["1"]["state"])
    [written] = other.glob("ledger-*.json")
    moved = LifetimeLedger(other, "0" * 64, 1e-5, None, tmp_path).store.path  # another pool's file name
    written.rename(moved)
    with pytest.raises(ValueError, match="belongs to another data set"):
        LifetimeLedger(other, "0" * 64, 1e-5, None, tmp_path)
    ledger_file.write_text("{broken")
    corrupt = train(context(node, run_id=3))
    assert corrupt.has_error() and corrupt.error.code == SETUP_FAILED
    assert f"ledger file {ledger_file} is corrupt" in corrupt.error.reason


def received(reply) -> str:
    """Everything a reply carries to the coordinator, as text: the error reason, or every record's values."""
    if reply.has_error():
        return reply.error.reason
    return repr({key: dict(record) for key, record in reply.content.metric_records.items()}) + repr(
        {key: dict(record) for key, record in reply.content.config_records.items()})


@pytest.mark.parametrize(
    ("key", "run"),
    [
        ("site-file", {"partitioner": "natural", "site-file": "SECRET"}),
        ("data-path", {"dataset": "npz", "data-path": "SECRET"}),
        ("data-root", {"data-root": "SECRET_DIR", "dataset": "mnist-idx"}),
    ],
)
def test_a_site_opens_no_path_the_coordinator_names_and_sends_no_byte_of_its_secret(
    tmp_path: Path, on_a_supernode: None, capfd: pytest.CaptureFixture[str], key: str, run: dict
) -> None:
    """Issue 29 item 2: `partitioner='natural' site-file='<secret-dir>/node-secret'` made the site's error
    reason quote the secret. Every run-config key naming a path a client opens is the site's own (its node
    config): the site refuses it by policy, naming the key, before it opens anything."""
    secret_dir = tmp_path / "secret"
    node = {"secret-dir": str(secret_dir), "ledger-dir": str(tmp_path / "ledgers"), "lifetime-epsilon": 3.0}
    secret = node_secret(SitePolicy.from_node_config({"partition-id": 0, "num-partitions": 2} | node), RunConfig())
    assert secret is not None
    named = {"SECRET": str(secret_dir / "node-secret"), "SECRET_DIR": str(secret_dir)}
    asked = {name: named.get(value, value) for name, value in run.items()}
    ledger_csv_like = []
    for message_type in ("train", "evaluate"):
        ctx = context(node, asked)
        handler = client_app.train if message_type == "train" else client_app.evaluate_locally
        reply = handler(train_message(arrays(context(node)), 1, message_type), ctx)
        assert reply.has_error() and reply.error.code == POLICY_REFUSED, received(reply)
        assert f"the run config sets {key}" in reply.error.reason and "node config" in reply.error.reason
        ledger_csv_like.append(received(reply))
    assert not leaks(secret, " ".join(ledger_csv_like))
    assert not list((tmp_path / "ledgers").glob("ledger-*.json"))  # refused before anything was opened
    capfd.readouterr()


def test_a_site_writes_nothing_where_the_coordinator_points(tmp_path: Path, on_a_supernode: None) -> None:
    """The train message's run folder (RUN_DIR_KEY) is the coordinator's: a site keeps its ledger in its
    own ledger-dir (or its state), never in a folder the message names."""
    ctx = context({"secret-dir": str(tmp_path / "secret")})
    msg = train_message(arrays(ctx), 1)
    msg.content["config"]["run-dir"] = str(tmp_path / "coordinator-chose-this")
    reply = client_app.train(msg, ctx)
    assert not reply.has_error(), received(reply)
    assert not (tmp_path / "coordinator-chose-this").exists()


def test_a_site_sends_no_text_derived_from_its_files_contents(
    tmp_path: Path, on_a_supernode: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """A malformed data file: the coordinator reads what failed and the exception's type, never a value read
    from the file (here a label); the site's own log has the whole line."""
    path = tmp_path / "site.npz"
    labels = np.full((20, 1), 123456789, np.int64)
    np.savez(path, train_images=np.zeros((20, 8, 8), np.uint8), train_labels=labels,
             test_images=np.zeros((4, 8, 8), np.uint8), test_labels=labels[:4])
    node = {"data-file": str(path), "secret-dir": str(tmp_path / "secret")}
    reply = train(context(node))
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert "123456789" not in reply.error.reason and "(ValueError)" in reply.error.reason
    assert "its data" in reply.error.reason
    assert "123456789" in capfd.readouterr().err


def test_the_coordinator_cannot_reset_a_sites_lifetime_ledger(tmp_path: Path, on_a_supernode: None) -> None:
    """Issue 29 item 3: seed, partitioner, beta and validation-fraction reached the fingerprint that keyed the
    ledger, so a second run with `seed=7` started a fresh one. The key is the site's own: its node secret and
    its data pool (a partition site's: every partition it is handed), nothing the run config sets."""
    node = {"ledger-dir": str(tmp_path / "ledgers"), "secret-dir": str(tmp_path / "secret"), "lifetime-epsilon": 3.0}
    assert not train(context(node, run_id=1)).has_error()
    [ledger_file] = (tmp_path / "ledgers").glob("ledger-*.json")
    policy = SitePolicy.from_node_config({"partition-id": 0, "num-partitions": 2} | node, deployment=True)
    for run in ({"seed": 7}, {"partitioner": "dirichlet", "beta": 0.1}, {"partitioner": "pathological"},
                {"validation-fraction": 0.2}):
        ledger = open_lifetime_ledger(policy, RunConfig.from_run_config(context(node, run).run_config))
        assert (ledger.store.path, len(ledger.runs)) == (ledger_file, 1), run
    assert not train(context(node, {"seed": 7}, run_id=2)).has_error()
    assert list((tmp_path / "ledgers").glob("ledger-*.json")) == [ledger_file]
    assert list(json.loads(ledger_file.read_text())["runs"]) == ["1", "2"]


def test_a_data_file_re_exported_in_another_order_keeps_its_ledger(tmp_path: Path) -> None:
    """The same examples in another order (and the test split reversed) are the same people: the same ledger.
    One example fewer is another pool."""
    data = load_dataset("digits")
    chosen = np.random.default_rng(0).choice(len(data.train_y), 150, replace=False)
    first = write_site_file(tmp_path / "a.npz", data, chosen, np.arange(50))
    shuffled = write_site_file(tmp_path / "b.npz", data, chosen[::-1].copy(), np.arange(50)[::-1].copy())
    fewer = write_site_file(tmp_path / "c.npz", data, chosen[1:], np.arange(50))
    node = {"ledger-dir": str(tmp_path / "ledgers"), "partition-id": 0, "num-partitions": 2}
    config = RunConfig.from_run_config(context({}).run_config)

    def ledger_of(path: Path) -> LifetimeLedger:
        return open_lifetime_ledger(SitePolicy.from_node_config(node | {"data-file": str(path)}), config)

    ledger_of(first).commit("1", after_steps(ledger_of(first), 3))
    assert len(ledger_of(shuffled).runs) == 1 and ledger_of(shuffled).store.path == ledger_of(first).store.path
    assert ledger_of(fewer).store.path != ledger_of(first).store.path


def after_steps(ledger: LifetimeLedger, steps: int) -> dict[str, Any]:
    from privacy.mechanisms import MechanismSpec
    from privacy.registry import build_mechanism

    return build_mechanism(MechanismSpec("dirichlet", 1.0, ledger.delta, 0.05, 200)).after(steps).state_dict()


def test_a_site_refuses_batch_norm_unless_it_allows_it_and_then_records_no_eps(
    tmp_path: Path, on_a_supernode: None
) -> None:
    """Issue 29 item 4: `allow-batch-norm=true` was accepted (the summary said the eps does not apply), and
    the lifetime ledger counted the run as an ordinary one. Refused unless the site's node config allows it;
    a site that does records the run's eps as not applying: its lifetime eps is infinite from then on."""
    node = {"ledger-dir": str(tmp_path / "ledgers"), "secret-dir": str(tmp_path / "secret")}
    reply = train(context(node, {"allow-batch-norm": True}))
    assert reply.has_error() and reply.error.code == POLICY_REFUSED
    assert "allow-batch-norm=true" in reply.error.reason and "(node-config key allow-batch-norm)" in reply.error.reason
    assert not list((tmp_path / "ledgers").glob("ledger-*.json"))
    allowed = train(context(node | {"allow-batch-norm": True}, {"allow-batch-norm": True}))
    assert not allowed.has_error(), received(allowed)
    [ledger_file] = (tmp_path / "ledgers").glob("ledger-*.json")
    stored = json.loads(ledger_file.read_text())
    assert stored["runs"]["1"]["eps_applies"] is False and stored["lifetime_epsilon_spent"] is None


def test_what_a_site_reports_follows_from_its_rounded_example_count(tmp_path: Path, on_a_supernode: None) -> None:
    """Issue 29 item 4: with `batch-size=1 local-epochs=1` the steps a site reported were its exact example
    count. A site samples at batch-size / (its count rounded down to its count-rounding, 10 by default), so
    every number it sends (steps, q, r, eps, weight) is the same for 151 and 159 examples."""
    data = load_dataset("digits")
    order = np.random.default_rng(1).permutation(len(data.train_y))
    reported = []
    for examples in (151, 159):
        path = write_site_file(tmp_path / f"site-{examples}.npz", data, order[:examples], np.arange(40))
        node = {"data-file": str(path), "secret-dir": str(tmp_path / "secret")}
        reply = train(context(node, {"batch-size": 1, "local-epochs": 1.0, "local-steps": 0}))
        assert not reply.has_error(), received(reply)
        metrics = dict(reply.content["metrics"])
        reported.append({key: value for key, value in metrics.items() if key not in ("train-loss",)})
    assert reported[0] == reported[1]
    assert reported[0]["steps"] == 150 and reported[0]["num-examples"] == 150


def test_a_site_draws_its_privacy_randomness_from_the_csprng_by_default(tmp_path: Path, on_a_supernode: None) -> None:
    """Issue 29 item 4: `secure-rng` was off unless the coordinator turned it on. At a site the OS's CSPRNG is
    the default whatever the run config says; `insecure-noise=true` (the site's own opt-out) keeps the seed."""
    metrics = train(context({"secret-dir": str(tmp_path)}, {"secure-rng": False})).content["metrics"]
    assert metrics["secure-rng"] == 1 and metrics["node-secret"] == 1
    opted_out = train(context({"insecure-noise": True})).content["metrics"]
    assert opted_out["secure-rng"] == 0
