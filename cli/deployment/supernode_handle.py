"""One started SuperNode as the pilot holds it (cli/deployment/federation.py), and what its log says when it
exits before connecting."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cli.deployment.certificates import NodeKeys
from cli.deployment.processes import DeploymentError, ManagedProcess, failure_reason, read_log
from cli.deployment.staging import ConfigValue


@dataclass
class SuperNodeHandle:
    """One started SuperNode: its site id, keys, node config, ports and process."""

    site_id: int
    keys: NodeKeys
    node_config: dict[str, ConfigValue]
    port: int
    root_certificates: Path
    process: ManagedProcess
    node_id: int | None = None
    executor_secret: Path | None = None  # fork mode: the secret its site executor signs with (else None)
    executor: ManagedProcess | None = None  # that executor, started once the SuperNode's Runtime API listens


def node_failure(node: SuperNodeHandle) -> DeploymentError:
    """Turn a SuperNode's early exit into a one-line error naming the cause and the log."""
    text = read_log(node.process.log_path)
    where = f"(log: {node.process.log_path})"
    if re.search(r"certificate verify failed|CERTIFICATE_VERIFY_FAILED", text, re.I):
        return DeploymentError(
            f"{node.process.name}: --root-certificates {node.root_certificates} did not "
            f"verify the SuperLink's TLS certificate (wrong CA?) {where}"
        )
    if re.search(r"\[code: 2004\]|Failed to activate SuperNode", text):
        return DeploymentError(
            f"{node.process.name}: refused by the SuperLink: public key "
            f"{node.keys.public_key} is not registered (flwr supernode register) {where}"
        )
    return DeploymentError(f"{node.process.name} exited before connecting: {failure_reason(text)} {where}")
