"""A site's word on Flower's Deployment Engine, end to end (`dirichlet-fl pilot`: real SuperLink and
SuperNode processes, TLS, node auth): a request outside the site's default policy (`mechanism='none'`,
`delta=0.001`) is refused naming the key and writes nothing; an edited or deleted lifetime ledger is
refused before anything starts; what the site created is private to it. One site, one round each.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from cli.main import main

TEST_BUDGET_S = 900  # a hang guard; measured: 227 s wall, 27 s CPU (3 federations of one site, load ~13)
RUN = "local-steps=4 batch-size=8"

# hard_timeout: tests/conftest.py, with TEST_BUDGET_S
pytestmark = pytest.mark.usefixtures("hard_timeout")  # on free ports: runs beside the other tests


def pilot(capsys: pytest.CaptureFixture[str], workdir: Path, run_config: str) -> tuple[int, dict, str]:
    code = main(["pilot", "--sites", "1", "--rounds", "1", "--workdir", str(workdir), "--json",
                 "--run-config", run_config])
    captured = capsys.readouterr()
    out = captured.out.strip()
    return code, (json.loads(out) if out.startswith("{") else {}), captured.err


def test_a_site_refuses_a_weaker_guarantee_and_an_edited_or_deleted_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "consortium"
    code, first, err = pilot(capsys, workdir, RUN)
    assert code == 0 and first["sites"][0]["status"] == "trained", (first, err)
    ledger = Path(first["sites"][0]["ledger_file"])
    trained = ledger.read_bytes()
    site = workdir / "sites" / "site-0"
    for path in [site, *site.rglob("*")]:  # the node secret, the ledgers, the cached raw data
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path

    for run_config, key in ((f"{RUN} mechanism='none'", "allowed-mechanisms"), (f"{RUN} delta=0.001", "delta")):
        code, refused, err = pilot(capsys, workdir, run_config)
        entry = refused["sites"][0]
        assert entry["status"] == "refused", (refused, err)
        assert f"(node-config key {key})" in entry["reason"]
        assert ledger.read_bytes() == trained  # a refused request writes nothing
        assert entry["runs_in_ledger"] == 1

    stored = json.loads(trained)
    stored["delta"] = 0.5
    ledger.write_text(json.dumps(stored))
    code, _, err = pilot(capsys, workdir, RUN)
    assert code == 2 and err.count("\n") == 1
    assert f"ledger file {ledger} was changed by someone without this node's secret" in err
    ledger.unlink()
    code, _, err = pilot(capsys, workdir, RUN)
    assert code == 2 and err.count("\n") == 1 and f"ledger file {ledger} is missing" in err
