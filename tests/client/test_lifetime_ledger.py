"""A site's lifetime ledger under concurrency, tampering and a kill mid-round (issue 24, items 4, 5, 7).

Two processes writing one ledger lose no step; an edited, stripped, deleted or rolled-back ledger is
refused with one line naming the file; a round killed mid-way is composed once, with exactly the
steps it ran, in the site's lifetime ledger and in a simulated run's ledger file alike.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

import client.client_app as client_app
from client.durable.lifetime_ledger import LifetimeLedger
from client.durable.locked_json import LockedJsonError, LockedJsonFile
from client.durable.secret_store import LifetimeLedgerIndex, lifetime_ledger_key, stored_secret
from dirichlet_fl.protocol import SETUP_FAILED
from privacy.mechanisms import MechanismSpec
from privacy.registry import build_mechanism, restore_mechanism
from tests.client.ledger_rounds import FINGERPRINT, STEPS, after, one_round, writer
from tests.helpers import client_context, train_message


def base_state() -> dict[str, Any]:
    return build_mechanism(MechanismSpec("dirichlet", 1.0, 1e-5, 0.05, 200)).state_dict()


def steps_of(state: dict[str, Any] | None) -> int:
    return 0 if state is None else restore_mechanism(state).steps


def test_two_writers_at_once_lose_no_step(tmp_path: Path) -> None:
    """Two runs at one site (two processes) each compose 25 rounds on the same ledger at the same time."""
    spawn = multiprocessing.get_context("spawn")  # writer: tests/client/ledger_rounds.py, no torch to import
    barrier, base, rounds = spawn.Barrier(2), base_state(), 25
    processes = [spawn.Process(target=writer, args=(str(tmp_path), key, base, rounds, barrier)) for key in "AB"]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=240)
        assert process.exitcode == 0
    ledger = LifetimeLedger(tmp_path, FINGERPRINT, 1e-5, None, tmp_path)
    assert {key: steps_of(ledger.current(key)) for key in "AB"} == {"A": rounds * STEPS, "B": rounds * STEPS}
    assert ledger.writes == 2 * 2 * rounds  # every write-ahead and every commit
    assert not list(tmp_path.glob("*.progress"))


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """A ledger with two completed rounds of run "1"."""
    base = base_state()
    one_round(tmp_path, "1", base, 1)
    one_round(tmp_path, "1", base, 2)
    return next(tmp_path.glob("ledger-*.json"))


def edit(path: Path, change: Any) -> None:
    stored = json.loads(path.read_text())
    change(stored)
    path.write_text(json.dumps(stored))


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update(runs={}),
        lambda s: s["runs"]["1"]["state"]["ledger"]["compositions"][0].update(count=1),
        lambda s: s.update(delta=0.5),
        lambda s: s.pop("hmac"),
        lambda s: s.update(schema=1, hmac=None) or s.pop("hmac"),
    ],
    ids=["runs-emptied", "count-lowered", "delta-raised", "hmac-stripped", "posing-as-unsigned"],
)
def test_an_edited_ledger_is_refused_naming_the_file(written: Path, change: Any) -> None:
    edit(written, change)
    with pytest.raises(LockedJsonError) as refused:
        LifetimeLedger(written.parent, FINGERPRINT, 1e-5, None, written.parent)
    message = str(refused.value)
    assert f"ledger file {written} " in message and "\n" not in message
    assert "changed by someone without this node's secret" in message or "not the one this node last wrote" in message


def test_a_deleted_ledger_is_not_a_fresh_budget(written: Path) -> None:
    written.unlink()
    with pytest.raises(LockedJsonError, match=f"ledger file {written} is missing, but .* records 4 writes"):
        LifetimeLedger(written.parent, FINGERPRINT, 1e-5, None, written.parent)


def test_an_older_copy_put_back_is_refused(written: Path) -> None:
    older = written.with_name("older.json")
    shutil.copy(written, older)
    one_round(written.parent, "1", base_state(), 3)
    shutil.copy(older, written)
    with pytest.raises(LockedJsonError, match="not the one this node last wrote \\(write 4, .* records write 6\\)"):
        LifetimeLedger(written.parent, FINGERPRINT, 1e-5, None, written.parent)


def test_a_ledger_from_before_signing_is_read_once_then_signed(tmp_path: Path) -> None:
    state = after(base_state(), 5)
    path = tmp_path / f"ledger-{'cd' * 8}.json"
    unsigned = {"schema": 1, "data_fingerprint": "cd" * 32, "delta": 1e-5, "runs": {"7": {"state": state}}}
    path.write_text(json.dumps(unsigned))
    ledger = LifetimeLedger(tmp_path, FINGERPRINT, 1e-5, None, tmp_path)
    assert steps_of(ledger.current("7")) == 5
    ledger.commit("7", after(state, 1))
    stored = json.loads(ledger.store.path.read_text())
    assert stored["schema"] == 3 and "hmac" in stored and stored["migrated_from"] == {"cd" * 32: 0}
    del stored["hmac"]  # its own file unsigned: an edit
    ledger.store.path.write_text(json.dumps(stored))
    with pytest.raises(LockedJsonError, match="changed by someone without this node's secret"):
        LifetimeLedger(tmp_path, FINGERPRINT, 1e-5, None, tmp_path)


def old_ledger(folder: Path, fingerprint: str, runs: dict[str, Any], writes: int = 3) -> Path:
    """A signed ledger as the code before issue 29 wrote it (schema 2, keyed by the data fingerprint), with the
    node's record of its last write."""
    secret = stored_secret(folder)
    store = LockedJsonFile(folder / f"ledger-{fingerprint[:16]}.json", lifetime_ledger_key(secret))
    mac = store.save({"schema": 2, "data_fingerprint": fingerprint, "delta": 1e-5, "lifetime_epsilon": None,
                      "lifetime_epsilon_spent": 0.5, "writes": writes, "runs": runs})
    LifetimeLedgerIndex(folder, secret).wrote(fingerprint, writes, str(mac), keyed=False)
    return store.path


def test_a_ledger_under_the_old_key_is_found_and_continued_never_dropped(tmp_path: Path) -> None:
    """Before issue 29 a site's ledger was keyed by the fingerprint of the partition it trained (one per seed,
    beta, ...). The site's ledger under its new key takes in every such ledger of the node, each run once."""
    state = after(base_state(), 5)
    old_ledger(tmp_path, "cd" * 32, {"7": {"state": state, "complete": True, "nonce": "00" * 16}})
    old_ledger(tmp_path, "ef" * 32, {"7": {"state": after(state, 1), "complete": True, "nonce": "11" * 16}})
    ledger = LifetimeLedger(tmp_path, FINGERPRINT, 1e-5, None, tmp_path)
    assert sorted(steps_of(state) for state in ledger.prior("new")) == [5, 6]
    ledger.commit("8", after(base_state(), 2))
    reopened = LifetimeLedger(tmp_path, FINGERPRINT, 1e-5, None, tmp_path)
    assert sorted(steps_of(state) for state in reopened.prior("new")) == [2, 5, 6]
    assert reopened.spent() > LifetimeLedger(tmp_path / "fresh", FINGERPRINT, 1e-5, None, tmp_path / "fresh").spent()

    gone = tmp_path / "gone"
    old_ledger(gone, "cd" * 32, {"7": {"state": state, "complete": True}}).unlink()
    with pytest.raises(LockedJsonError, match="is missing, but .* records 3 writes"):
        LifetimeLedger(gone, FINGERPRINT, 1e-5, None, gone)


def test_a_restored_site_folder_is_refused_where_a_witness_is_kept(tmp_path: Path) -> None:
    """Issue 29 item 3: the whole site folder (ledger, secret, record of writes) restored from a backup after run
    1 was accepted at run 3. The witness (node-config witness-dir, outside the site's folder) records each
    write too: a restored folder, a deleted ledger and record, or a replaced secret is refused."""
    site, witness, backup = tmp_path / "site", tmp_path / "witness", tmp_path / "backup"
    base = base_state()
    one_round(site, "1", base, 1, witness)
    shutil.copytree(site, backup)
    one_round(site, "2", base, 1, witness)
    shutil.rmtree(site)
    shutil.copytree(backup, site)
    assert len(LifetimeLedger(site, FINGERPRINT, 1e-5, None, site).runs) == 1  # without the witness: unnoticed
    with pytest.raises(LockedJsonError, match=r"not the one this node last wrote \(write 2, .*ledger-witness.json "
                                              r"records write 4\)"):
        LifetimeLedger(site, FINGERPRINT, 1e-5, None, site, witness)
    next(site.glob("ledger-*.json")).unlink()
    (site / "written-ledgers.json").unlink()
    with pytest.raises(LockedJsonError, match="is missing, but .*ledger-witness.json records 4 writes"):
        LifetimeLedger(site, FINGERPRINT, 1e-5, None, site, witness)
    (site / "node-secret").unlink()
    with pytest.raises(LockedJsonError, match="witness file .*ledger-witness.json was not written with this node's "
                                              "secret"):
        LifetimeLedger(site, FINGERPRINT, 1e-5, None, site, witness)



def test_a_round_that_may_still_run_keeps_its_plan(tmp_path: Path) -> None:
    base = base_state()
    ledger = LifetimeLedger(tmp_path, FINGERPRINT, 1e-5, None, tmp_path)
    progress = ledger.reserve("1", base, after(base, 10), 1, "00" * 16)
    progress(2)
    reader = LifetimeLedger(tmp_path, FINGERPRINT, 1e-5, None, tmp_path)
    assert steps_of(reader.current("1")) == 10  # its process holds the progress file: the plan stands
    progress.finish()  # the file is gone without a commit: the count is unknown, the plan still stands
    assert steps_of(LifetimeLedger(tmp_path, FINGERPRINT, 1e-5, None, tmp_path).current("1")) == 10


def test_an_edited_ledger_stops_the_client_with_one_line(tmp_path: Path) -> None:
    context = client_context({"local-steps": 4, "partitioner": "iid"})
    context.node_config["ledger-dir"] = str(tmp_path)
    assert not client_app.train(train_message(arrays(context), 1), context).has_error()
    ledger_file = next(tmp_path.glob("ledger-*.json"))
    edit(ledger_file, lambda s: s.update(delta=0.5))
    reply = client_app.train(train_message(arrays(context), 2), context)
    assert reply.has_error() and reply.error.code == SETUP_FAILED
    assert f"ledger file {ledger_file} was changed by someone without this node's secret" in reply.error.reason


def arrays(context: Any) -> Any:
    from flwr.app import ArrayRecord

    from dirichlet_fl.config import RunConfig
    from dirichlet_fl.data.split import federated_split
    from dirichlet_fl.models.run_model import initial_model

    config = RunConfig.from_run_config(context.run_config)
    return ArrayRecord(initial_model(config, federated_split(config.split_spec(2)).data).state_dict())


KILL_OVERRIDES = {"local-steps": 4, "partitioner": "iid", "num-server-rounds": 3}


@pytest.fixture(scope="module")
def clientapp_processes() -> Any:
    """New processes in which nothing has run yet, as Flower starts one per message, forked from one server
    process that imported the ClientApp (and torch's optimizer machinery) once for every test here."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "torch._dynamo"])
    return context


def train_and_die(node_config: dict[str, Any], run_dir: str, die_at: int) -> None:
    """A ClientApp process SIGKILLed during step `die_at` of round 1 (spawn target)."""
    import client.training

    original, calls = client.training.poisson_sample, {"n": 0}

    def dying_sample(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    client.training.poisson_sample = dying_sample  # type: ignore[assignment]
    client_app.train(message(run_dir), fresh(node_config))


def fresh(node_config: dict[str, Any]) -> Any:
    """A new ClientApp process's context: empty state, the node's config."""
    context = client_context(KILL_OVERRIDES)
    context.node_config.update(node_config)
    return context


def message(run_dir: str) -> Any:
    msg = train_message(arrays(client_context(KILL_OVERRIDES)), 1)
    if run_dir:
        msg.content["config"]["run-dir"] = run_dir
    return msg


def ledger_entry(folder: Path, simulated: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the record holding run 1's state, that state) of the ledger file in `folder`."""
    if simulated:
        stored = json.loads((folder / "partition-0.json").read_text())
        return stored, stored["mechanism"]
    entry = json.loads(next(folder.glob("ledger-*.json")).read_text())["runs"]["1"]
    return entry, entry["state"]


@pytest.mark.parametrize("where", ["site-ledger", "run-ledger"])
def test_a_round_killed_mid_way_is_composed_once_with_the_steps_it_ran(
    tmp_path: Path, where: str, clientapp_processes: Any
) -> None:
    """Killed during step 3 of 4, then resumed: 3 + 4 steps, not the interrupted plan plus the rerun (8)."""
    node_config = {"ledger-dir": str(tmp_path / "site")} if where == "site-ledger" else {}
    run_dir = "" if where == "site-ledger" else str(tmp_path / "run")
    process = clientapp_processes.Process(target=train_and_die, args=(node_config, run_dir, 3))
    process.start()
    process.join(timeout=240)
    assert process.exitcode == -signal.SIGKILL
    simulated = where == "run-ledger"
    folder = tmp_path / "run" / "ledgers" if simulated else tmp_path / "site"
    assert steps_of(ledger_entry(folder, simulated)[1]) == 4  # what the killed process left: its plan (safe side)
    assert len(list(folder.glob("*.progress"))) == 1
    reply = client_app.train(message(run_dir), fresh(node_config))  # the round again, in a new process
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert reply.content["metrics"]["steps"] == 3 + 4
    record, state = ledger_entry(folder, simulated)
    assert steps_of(state) == 7 and record["complete"] is True and "in_flight" not in record
    assert not list(folder.glob("*.progress"))
