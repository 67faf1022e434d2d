"""Run a simulation and SIGKILL this process right after round K's checkpoint is on disk: the server
dies between two rounds, as a crash or an OOM kill would leave it (tests/test_faults.py resumes it).

Usage: python -m tests.kill_after_round '<overrides as JSON>' <num_supernodes> <K>
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from dirichlet_fl.runs import writer as run_writer
from dirichlet_fl.simulation import simulate


def main() -> None:
    overrides, supernodes, kill_round = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    record_round = run_writer.RunWriter.record_round

    def record_then_die(self: run_writer.RunWriter, record: run_writer.RoundRecord, *args: Any) -> dict[str, Any]:
        row = record_round(self, record, *args)
        if record.server_round == kill_round:
            os.kill(os.getpid(), signal.SIGKILL)
        return row

    run_writer.RunWriter.record_round = record_then_die  # type: ignore[method-assign]
    simulate(overrides, supernodes, ray_num_cpus=1)  # one actor: the kill is the server's, not an actor's


if __name__ == "__main__":
    main()
