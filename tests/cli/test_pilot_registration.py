"""Joining is the operator's act alone: the sites' address serves the Fleet API only (cli/deployment/fleet_gateway.py).

An outsider holding ``ca.crt`` and the sites' address cannot register a key there (Flower 1.42's Control
API has no login, so it must not be reachable), and a SuperNode with a key the operator did not register is
refused. Real Flower processes on loopback; every process is stopped by PID and checked gone.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli.deployment.certificates import make_node_keys
from cli.deployment.federation import Federation
from cli.deployment.processes import DeploymentError, base_env, executable
from tests.cli.test_fleet_gateway import post_as_is

BYPASSES = ["/v1/fleet/../control/list-nodes", "/v1/fleet/%2e%2e/control/list-nodes",
            "/v1/fleet/..%2fcontrol/register-node", "/v1/fleet/register-node"]  # fmt: skip

TEST_BUDGET_S = 120
pytestmark = pytest.mark.usefixtures("hard_timeout")  # on free ports: runs beside the other tests


def outsider_register(home: Path, address: str, ca_cert: Path, public_key: Path) -> tuple[int, str]:
    """``flwr supernode register`` as an outsider would run it: its own FLWR_HOME, the CA and an address."""
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "{address}"\nroot-certificates = "{ca_cert}"\n'
    )
    argv = [executable("flwr"), "supernode", "register", str(public_key), "x", "--format", "json"]
    done = subprocess.run(argv, env=base_env(home), capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout + done.stderr


def test_outsider_cannot_register_or_join_through_the_sites_address(
    tmp_path: Path, federations: list[Federation]
) -> None:
    federation = Federation(tmp_path / "fed", [{"site": 0}], name="reg", fleet_gateway=True)
    federations.append(federation)
    with federation:
        assert federation.gateway is not None and federation.fleet_address != federation.address
        site_log = federation.nodes[0].process.log_path.read_text()
        assert "SuperNode ID:" in site_log  # the operator's site joined through the gateway
        rogue = make_node_keys(tmp_path / "rogue", site_id=9)
        code, output = outsider_register(tmp_path / "outsider", federation.fleet_address,
                                         federation.certs.ca_cert, rogue.public_key)  # fmt: skip
        answer = json.loads(output[output.find("{") : output.rfind("}") + 1])  # flwr exits 0 and says so in JSON
        assert answer["success"] is False and "node-id" not in answer, (code, output)
        assert "/v1/control/register-node: only the Fleet API is served here" in answer["error-message"]
        assert any(path.startswith("POST /v1/control/") for path in federation.gateway.refused)
        port = int(federation.fleet_address.rsplit(":", 1)[1])
        for target in BYPASSES:  # what `curl --path-as-is` sends: none reaches the SuperLink's Control API
            assert post_as_is(port, federation.certs.ca_cert, target) == 403, target
        with pytest.raises(DeploymentError, match="is not registered"):
            federation.add_node({"site": 9}, keys=rogue, register=False, site_id=9)
        nodes = federation.registered_nodes()  # the operator's own view, over the loopback Control API
        assert [int(str(node["node-id"])) for node in nodes] == [federation.nodes[0].node_id], nodes
