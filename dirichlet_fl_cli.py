"""Entry point of the `dirichlet-fl` command.

The project installs this one module (a name nobody else uses) and never its generic top-level
packages (client, server, strategies, privacy, sims, cli): Flower must run the app bundle's own copy
of those, and they must not collide with other installed packages of the same names. The command
puts this checkout on sys.path (and on PYTHONPATH, for the processes it starts), then runs cli.main.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def main() -> int:
    if not (ROOT / "cli" / "main.py").is_file():
        print(
            f"dirichlet-fl: error: no source tree next to {Path(__file__).name} in {ROOT}; install the project "
            "from its checkout with `pip install -e <checkout>` (scripts/setup.sh does)",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from cli.main import main as run

    return run()


if __name__ == "__main__":
    raise SystemExit(main())
