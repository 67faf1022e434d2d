"""A site's word against the coordinator and an old copy of its own files, end to end (`dirichlet-fl pilot`:
real SuperLink and SuperNode processes, TLS, node auth, one site, one round per call; issue 29 items 2 and 3).

- `seed=7 beta=0.1` on a second call continues the site's lifetime ledger (the same file, two runs);
- a run config whose `site-file` is, from the site's folder, its node secret (the ServerApp, in another
  folder, reads a valid map under the same relative name) is refused by the site naming the key, and no
  4-byte window of the secret reaches anything the coordinator holds: the report, the run folder, the
  `flwr run` output;
- the whole site folder restored from a backup taken after the first call stops the next call with one
  line, because the witness (`WORKDIR/witness/site-0`) recorded the later writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dirichlet_fl.data.loaders import load_dataset
from tests.cli.test_pilot import processes_mentioning
from tests.client.test_site_on_supernodes import pilot
from tests.helpers import leaks

TEST_BUDGET_S = 900  # a hang guard: three federations of one site and a refused call
RUN = "local-steps=4 batch-size=8"
MAP = "site-map.csv"

# hard_timeout: tests/conftest.py, with TEST_BUDGET_S
pytestmark = pytest.mark.usefixtures("hard_timeout")  # on free ports: runs beside the other tests


def coordinator_holds(report: dict, workdir: Path) -> str:
    """What the coordinator received or wrote: the report, every results file, the flwr run output."""
    texts = [json.dumps(report)]
    for folder in (workdir / "results" / Path(report["run_dir"]).name, Path(report["log"]).parent):
        texts += [path.read_text(errors="surrogateescape") for path in folder.rglob("*") if path.is_file()
                  and not path.name.startswith("supernode-")]  # the site's own logs are the site's
    return "\n".join(texts)


def test_a_coordinator_can_neither_read_a_sites_secret_nor_reset_its_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "consortium"
    code, first, err = pilot(capsys, workdir, RUN)
    assert code == 0 and first["sites"][0]["status"] == "trained", (first, err)
    assert first["sites"][0]["runs_in_ledger"] == 1
    site, backup = workdir / "sites" / "site-0", tmp_path / "backup"
    shutil.copytree(site, backup)

    code, second, err = pilot(capsys, workdir, f"{RUN} seed=7 beta=0.1")
    assert code == 0, (second, err)
    assert second["sites"][0]["ledger_file"] == first["sites"][0]["ledger_file"]
    assert second["sites"][0]["runs_in_ledger"] == 2

    secret = bytes.fromhex((site / "secret" / "node-secret").read_text().strip())
    rows = len(load_dataset("digits").train_y)
    (workdir / "superlink" / MAP).write_text("index,site\n" + "".join(f"{i},0\n" for i in range(rows)))
    (workdir / "supernode-0" / MAP).symlink_to(site / "secret" / "node-secret")
    code, third, err = pilot(capsys, workdir, f"{RUN} partitioner='natural' site-file='{MAP}'")
    entry = third["sites"][0]
    assert code == 3 and entry["status"] == "refused", (third, err)
    assert "the run config sets site-file" in entry["reason"] and entry["runs_in_ledger"] == 2
    assert not leaks(secret, coordinator_holds(third, workdir))

    shutil.rmtree(site)
    shutil.copytree(backup, site)
    code, _, err = pilot(capsys, workdir, RUN)
    assert code == 2 and err.count("\n") == 1, err
    assert "is not the one this node last wrote" in err and "ledger-witness.json records write" in err
    assert not processes_mentioning(str(workdir))
