"""A client's durable privacy ledger: one JSON file per client, so that its spending survives a
restart of the client, of its process or of the whole run (a resumed run continues it).

The file is written atomically and durably (dirichlet_fl.files: temporary file, fsync, os.replace)
with mode 0600: it is this client's record, nobody else's. A file that exists but cannot be read
or parsed raises LedgerFileError naming the file; it is never silently reset to an empty ledger,
which would let the client spend its budget twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dirichlet_fl.files import write_atomically

LEDGER_FILE_MODE = 0o600


class LedgerFileError(ValueError):
    """The ledger file exists but cannot be read back; its message names the file and the fix."""


class LedgerStore:
    """load() and save() one client's ledger state (a JSON object) at `path`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Any] | None:
        """The stored state, or None when no file exists yet (a client that never trained here)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise LedgerFileError(f"ledger file {self.path} cannot be read ({error}); restore it from a backup") from None
        try:
            state = json.loads(text)
        except json.JSONDecodeError as error:
            raise LedgerFileError(
                f"ledger file {self.path} is corrupt ({error.msg} at line {error.lineno}); restore it from a backup: "
                "the client will not train with an unknown ledger"
            ) from None
        if not isinstance(state, dict):
            raise LedgerFileError(f"ledger file {self.path} holds no JSON object; restore it from a backup")
        return state

    def save(self, state: dict[str, Any]) -> None:
        """Replace the stored state atomically (the folder is created if needed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, (json.dumps(state, allow_nan=False) + "\n").encode(), LEDGER_FILE_MODE)
