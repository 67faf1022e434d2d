"""What the `flwr` CLI prints, read back: a run's id and the ServerApp's exit code from `flwr run`'s stream,
the JSON of `flwr list` and `flwr supernode` commands, what one `flwr run` did (RunOutcome), and why a
SuperNode exited before connecting. Measured against flwr 1.42.0, whose `flwr run` exits 0 even when the
ServerApp failed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from cli.deployment.processes import failure_reason

EXIT_CODE = re.compile(r"Exit Code: (\d+)")


RUN_ID = re.compile(r"Successfully (?:started|submitted) run (\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class RunOutcome:
    """What one ``flwr run`` did: its exit code, its output, and the ServerApp's verdict."""

    returncode: int
    output: str
    duration_s: float
    log_path: Path
    run_id: int | None = None
    server_exit_code: int | None = None
    status: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """True only if the CLI, the ServerApp and the run's recorded status all report success.

        ``flwr run`` returns 0 even when the ServerApp raised, so its exit code alone is not enough.
        """
        status_ok = self.status is None or "completed" in self.status
        return self.returncode == 0 and self.server_exit_code is None and not self.timed_out and status_ok


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str


def first_int(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return int(match.group(1)) if match else None


def json_text(stdout: str) -> str:
    """The JSON object in a CLI's stdout (Flower may print other lines before it)."""
    start = stdout.find("{")
    return stdout[start:] if start >= 0 else stdout


def json_field(stdout: str, key: str) -> object | None:
    try:
        payload = json.loads(json_text(stdout))
    except ValueError:
        return None
    return payload.get(key) if isinstance(payload, dict) else None


def node_list(stdout: str) -> list[dict[str, object]]:
    """The nodes `flwr supernode list --format json` printed (ValueError when the output is not JSON)."""
    payload = json.loads(json_text(stdout))
    return list(payload.get("nodes", []) if isinstance(payload, dict) else payload)


def run_status_of(stdout: str) -> str | None:
    """The status of the run `flwr list --run-id N --format json` printed (e.g. ``finished:completed``), or None."""
    try:
        runs = json.loads(json_text(stdout)).get("runs", [])
        return str(runs[0]["status"]) if runs else None
    except (ValueError, KeyError, IndexError, AttributeError):
        return None


def supernode_exit_reason(name: str, log: str, root_certificates: Path, public_key: Path) -> str:
    """One line on why SuperNode ``name`` exited before connecting, from its ``log``: a CA that did not verify the
    SuperLink's certificate, a key the SuperLink does not know, else the log's own failure line."""
    if re.search(r"certificate verify failed|CERTIFICATE_VERIFY_FAILED", log, re.I):
        return (f"{name}: --root-certificates {root_certificates} did not verify the SuperLink's TLS certificate "
                "(wrong CA?)")
    if re.search(r"\[code: 2004\]|Failed to activate SuperNode", log):
        return f"{name}: refused by the SuperLink: public key {public_key} is not registered (flwr supernode register)"
    return f"{name} exited before connecting: {failure_reason(log)}"
