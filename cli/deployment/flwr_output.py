"""What the `flwr` CLI prints, read back: a run's id and the ServerApp's exit code from `flwr run`'s stream,
the JSON of `flwr list` and `flwr supernode` commands, and what one `flwr run` did (RunOutcome). Measured
against flwr 1.42.0, whose `flwr run` exits 0 even when the ServerApp failed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

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
