"""App pinning: a site that trusts one reviewer key runs only apps that key signed, and refuses any other
before a line of its ClientApp runs (Flower 1.42's ``--trusted-entities`` FAB verification,
cli/deployment/app_signing.py).

The end-to-end test starts a real SuperLink and a pinned SuperNode and submits a tiny app whose ClientApp
writes a marker file when its code runs: the signed app leaves the marker, a modified app (from a folder,
or served with the honest app's signature) leaves none and the ServerApp gets Flower's FAB verification
error. Every process is stopped by PID and checked gone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.deployment.app_hub import AppHub, PublishedApp
from cli.deployment.app_signing import (
    build_fab,
    check_trusted_entities,
    make_reviewer_key,
    sign_fab,
    write_trusted_entities,
)
from cli.deployment.federation import Federation
from cli.deployment.processes import DeploymentError

TEST_BUDGET_S = 150  # the e2e test: one federation, three runs of about 17 s each on 2 shared cores
pytestmark = pytest.mark.usefixtures("hard_timeout")  # on free ports: runs beside the other tests

APP_ID, VERSION = "@pilot-test/probe", "1.0.0"
FAB_VERIFICATION_ERROR = 7  # the code of the SuperNode's FAB_VERIFICATION_ERROR reply (checked below)

_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "probe"
version = "1.0.0"
dependencies = []

[tool.flwr.app]
publisher = "pilot-test"

[tool.flwr.app.components]
serverapp = "probe.server:app"
clientapp = "probe.client:app"

[tool.flwr.app.config]
marker-dir = ""
"""

_SERVER = """from pathlib import Path
import json
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    nodes = list(grid.get_node_ids())
    query = [Message(RecordDict({"q": ConfigRecord({"x": 1})}), dst_node_id=n, message_type="query") for n in nodes]
    replies = grid.send_and_receive(query, timeout=60)
    out = {str(r.metadata.src_node_id): (r.error.code if r.has_error() else "ok") for r in replies}
    Path(str(context.run_config["marker-dir"]), "server.json").write_text(json.dumps(out))
"""

_CLIENT = """from pathlib import Path
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    Path(str(context.run_config["marker-dir"]), "client-ran").write_text("VARIANT")
    return Message(RecordDict({"r": ConfigRecord({"ok": 1})}), reply_to=msg)
"""


def write_probe_app(folder: Path, variant: str) -> Path:
    """A minimal Flower app whose ClientApp writes ``variant`` into marker-dir/client-ran when it runs."""
    (folder / "probe").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(_PYPROJECT)
    (folder / "probe" / "__init__.py").write_text("")
    (folder / "probe" / "server.py").write_text(_SERVER)
    (folder / "probe" / "client.py").write_text(_CLIENT.replace("VARIANT", variant))
    return folder


def test_error_code_is_flowers_fab_verification_error() -> None:
    from flwr.supernode.start_client_internal import FAB_VERIFICATION_ERROR as REPLY

    assert REPLY.code == FAB_VERIFICATION_ERROR and REPLY.reason == "The FAB could not be verified."


def test_signature_passes_flowers_own_check_and_fails_for_other_fab_or_key(tmp_path: Path) -> None:
    """The SuperNode's `_verify_fab` accepts the signed FAB only, and only for the pinned key."""
    from flwr.supercore.fab import Fab
    from flwr.supernode.start_client_internal import _verify_fab

    key, other = make_reviewer_key(tmp_path / "reviewer"), make_reviewer_key(tmp_path / "other")
    good = build_fab(write_probe_app(tmp_path / "good", "honest"))
    evil = build_fab(write_probe_app(tmp_path / "evil", "leak"))
    trusted = {key.key_id: key.public_line}

    def verified(fab: bytes, signed_by: list[tuple[bytes, object]]) -> bool:
        records = {}
        for signed_fab, signer in signed_by:
            record = sign_fab(signed_fab, signer)  # type: ignore[arg-type]
            records[record.public_key_id] = json.dumps({"signature": record.signature, "signed_at": record.signed_at})
        return _verify_fab(Fab("h", fab, {**records, "valid_license": "Valid"}), trusted)

    assert verified(good, [(good, key)])
    assert not verified(evil, [(good, key)])  # the honest app's signature does not cover another FAB
    assert not verified(evil, [(evil, other)])  # a key the site does not trust
    assert not verified(good, [])


def test_reviewer_key_is_reused_and_private_half_is_0600(tmp_path: Path) -> None:
    key = make_reviewer_key(tmp_path / "k")
    again = make_reviewer_key(tmp_path / "k")
    assert again.key_id == key.key_id and key.public_line.startswith("ssh-ed25519 ")
    assert key.private_key.stat().st_mode & 0o777 == 0o600
    pin = write_trusted_entities(tmp_path / "site" / "trusted.yaml", [key])
    assert pin.read_text() == f"{key.key_id}: '{key.public_line}'\n"
    with pytest.raises(DeploymentError, match="at least one reviewer key"):
        write_trusted_entities(tmp_path / "none.yaml", [])


@pytest.mark.parametrize("content", ["{}\n", "", "[]\n", "not: [valid\n"])
def test_a_pin_that_trusts_no_key_refuses_every_app_loudly(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29 item 4: a trusted-entities.yaml holding `{}` turned Flower's app verification off (`if
    trusted_entities:`), and that site ran an unsigned app. Such a pin is refused before any process starts:
    the pilot stops with one line naming the file, and so does any Federation given that pin."""
    from cli.main import main

    pin = tmp_path / "w" / "sites" / "site-0" / "trusted-entities.yaml"
    pin.parent.mkdir(parents=True)
    pin.write_text(content)
    with pytest.raises(DeploymentError, match=f"--trusted-entities {pin} (trusts no key|is unreadable)"):
        check_trusted_entities(pin)
    with pytest.raises(DeploymentError, match="trusts no key|is unreadable"):
        Federation(tmp_path / "fed", []).supernode_argv(None, pin, 1, "", pin)  # type: ignore[arg-type]
    if content != "{}\n":
        return
    code = main(["pilot", "--sites", "1", "--rounds", "1", "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"--trusted-entities {pin} trusts no key" in err
    assert not (tmp_path / "w" / "superlink").exists()  # nothing started


def test_pinned_site_runs_only_the_signed_app(tmp_path: Path, federations: list[Federation]) -> None:
    key = make_reviewer_key(tmp_path / "reviewer")
    pin = write_trusted_entities(tmp_path / "site-0" / "trusted-entities.yaml", [key])
    honest = build_fab(write_probe_app(tmp_path / "honest", "honest"))
    evil_dir = write_probe_app(tmp_path / "evil", "leak")
    evil = build_fab(evil_dir)
    marks = tmp_path / "marks"
    marks.mkdir()

    def submit(fed: Federation, app: Path | str) -> tuple[dict[str, object], str | None]:
        outcome = fed.run(app, {"marker-dir": str(marks)}, timeout=80)
        assert outcome.ok, outcome.output[-2000:]
        replies = json.loads((marks / "server.json").read_text())
        ran = (marks / "client-ran").read_text() if (marks / "client-ran").exists() else None
        for path in marks.iterdir():
            path.unlink()
        return replies, ran

    with AppHub() as hub:
        federation = Federation(tmp_path / "fed", [{"site": 0}], name="pin", hub_url=hub.url, trusted_entities=[pin])
        federations.append(federation)
        with federation:
            replies, ran = submit(
                federation, hub.publish(PublishedApp(APP_ID, VERSION, honest, [sign_fab(honest, key)]))
            )
            assert list(replies.values()) == ["ok"] and ran == "honest"
            # A modified app submitted from a folder: no signature at all.
            replies, ran = submit(federation, evil_dir)
            assert list(replies.values()) == [FAB_VERIFICATION_ERROR] and ran is None
            # The modified app served with the honest app's signature (a coordinator swapping the FAB).
            replies, ran = submit(federation, hub.publish(PublishedApp(APP_ID, VERSION, evil, [sign_fab(honest, key)])))
            assert list(replies.values()) == [FAB_VERIFICATION_ERROR] and ran is None
        log = federation.nodes[0].process.log_path.read_text()
        assert log.count("FAB verification failed") == 1 and "App verification is not supported" in log
