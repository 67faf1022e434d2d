"""scripts/round_breakdown.py reads each train message's phases off Flower's DEBUG log lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.round_breakdown import PHASES, measure, rendered

SUPERLINK = """\x1b[94mDEBUG 2026-12-01 17:00:10,000\x1b[0m:     Runtime.PushMessages
INFO 2026-12-01 17:00:10,500:      [Fleet.PushMessages] Push replies from node_id=7
DEBUG 2026-12-01 17:00:19,250:     Runtime.ConfirmMessageReceived
DEBUG 2026-12-01 17:00:30,000:     Runtime.PushMessages
DEBUG 2026-12-01 17:00:41,000:     Runtime.ConfirmMessageReceived
"""
SUPERNODE = """DEBUG 2026-12-01 17:00:09,900:     Runtime.AcquireTask
INFO 2026-12-01 17:00:11,000:      Receiving: train message (ID: ab)
INFO:     127.0.0.1:57260 - "POST /v1/runtime/acquire-task HTTP/1.1" 200 OK
DEBUG 2026-12-01 17:00:11,200:     Runtime.AcquireTask
DEBUG 2026-12-01 17:00:13,200:     Loading ClientApp `client.client_app:app`
DEBUG 2026-12-01 17:00:18,000:     Runtime.PushMessages
INFO 2026-12-01 17:00:19,000:      Sent successfully
INFO 2026-12-01 17:00:30,500:      Receiving: train message (ID: cd)
DEBUG 2026-12-01 17:00:31,000:     Runtime.AcquireTask
DEBUG 2026-12-01 17:00:33,000:     Loading ClientApp `client.client_app:app`
DEBUG 2026-12-01 17:00:39,000:     Runtime.PushMessages
INFO 2026-12-01 17:00:40,000:      Sent successfully
"""


def test_each_train_message_is_split_at_its_log_lines(tmp_path: Path) -> None:
    logs, run = tmp_path / "logs" / "pilot-1", tmp_path / "results" / "pilot-1"
    logs.mkdir(parents=True)
    run.mkdir(parents=True)
    (logs / "superlink.log").write_text(SUPERLINK)
    (logs / "supernode-0.log").write_text(SUPERNODE)
    (run / "rounds.csv").write_text("round,seconds\n1,10.5\n2,21.5\n3,34.0\n")
    result = measure(tmp_path)
    assert result["round_seconds"] == [10.5, 11.0, 12.5] and result["median_round_seconds"] == 11.0
    first = (1.0, 0.2, 2.0, 4.8, 1.0, 0.25)
    second = (0.5, 0.5, 2.0, 6.0, 1.0, 1.0)
    expected = {name: (a + b) / 2 for (name, _), a, b in zip(PHASES, first, second)}
    assert result["median_phase_seconds"] == pytest.approx(expected) and result["train_messages"] == 2


def test_a_site_executors_log_is_read_with_its_supernodes(tmp_path: Path) -> None:
    logs, run = tmp_path / "logs" / "pilot-1", tmp_path / "results" / "pilot-1"
    logs.mkdir(parents=True)
    run.mkdir(parents=True)
    (logs / "superlink.log").write_text(SUPERLINK)
    loading = [line for line in SUPERNODE.splitlines() if "Loading ClientApp" in line]
    (logs / "supernode-0.log").write_text("\n".join(line for line in SUPERNODE.splitlines() if line not in loading))
    (logs / "site-executor-0.log").write_text("\n".join(loading) + "\n")
    (run / "rounds.csv").write_text("round,seconds\n1,10.5\n2,21.5\n3,34.0\n")
    assert measure(tmp_path)["median_phase_seconds"]["task_to_loaded"] == pytest.approx(2.0)
    (logs / "site-executor-0.log").unlink()
    with pytest.raises(ValueError, match="no log line 'Loading ClientApp'"):  # without it, none ever loaded
        measure(tmp_path)


def test_a_call_with_its_simulation_records_and_renders_the_ratio(tmp_path: Path) -> None:
    logs, run, simulated = (tmp_path / "logs" / "pilot-1", tmp_path / "results" / "pilot-1",
                            tmp_path / "results" / "pilot-1-simulation")
    for folder in (logs, run, simulated):
        folder.mkdir(parents=True)
    (logs / "superlink.log").write_text(SUPERLINK)
    (logs / "supernode-0.log").write_text(SUPERNODE)
    (run / "rounds.csv").write_text("round,seconds\n1,10.5\n2,21.5\n3,34.0\n")
    (simulated / "rounds.csv").write_text("round,seconds\n1,0.5\n2,1.5\n3,2.0\n")
    result = measure(tmp_path)
    assert result["simulated_median_round_seconds"] == 0.5
    without = measure(tmp_path) | {}
    del without["simulated_median_round_seconds"]
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"a": result | {"command": "c", "note": "n"},
                                "b": without | {"command": "c", "note": "n"}}))
    assert "| the same config simulated, in the same call (median round; ratio) | 0.50 s; 22.0x | - |" in rendered(path)


def test_a_log_without_timestamps_is_named(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "pilot-1"
    logs.mkdir(parents=True)
    (logs / "superlink.log").write_text("INFO :      Starting Flower SuperLink\n")
    (logs / "supernode-0.log").write_text("INFO :      Receiving: train message (ID: ab)\n")
    with pytest.raises(ValueError, match="FLWR_LOG_LEVEL=DEBUG"):
        measure(tmp_path)
