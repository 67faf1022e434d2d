"""Where a Deployment Engine round's time goes: measured from one `dirichlet-fl pilot` call's logs, rendered
into docs/consortium.md (block round-breakdown) from the committed docs/consortium/round-breakdown.json.

Run the pilot with FLWR_LOG_LEVEL=DEBUG (Flower then stamps every log line with its time), then, from the root:
  .venv/bin/python scripts/round_breakdown.py measure --label before --workdir W --note "load 10-13" \\
      --command "dirichlet-fl pilot --sites 2 --rounds 3 ..."
  .venv/bin/python scripts/render.py round-breakdown     # render the committed file again, without measuring

Each train message is followed through the logs: the ServerApp's push (SuperLink log `Runtime.PushMessages`),
the SuperNode's pull of it (`Receiving: train message`), the SuperExec's task poll that starts its ClientApp
(the first `Runtime.AcquireTask` after it), the ClientApp loaded (`Loading ClientApp`) and its reply handed
back (`Runtime.PushMessages`), the SuperNode's upload (`Sent successfully`), the ServerApp's pull of the
reply (the SuperLink's next `Runtime.ConfirmMessageReceived`). Each phase is the median over every train
message (sites x rounds); the round time is the median of rounds.csv's per-round seconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "docs" / "consortium" / "round-breakdown.json"
BLOCK = "round-breakdown"
"""The block rendered from RESULT: docs/consortium.md explains it, BENCHMARKS.md (section 6.7) lists it
(both registered in scripts/doc_blocks.py's RENDERERS)."""
_LINE = re.compile(r"^[A-Z]+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):\s+(.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
PHASES = (
    ("push_to_node", "ServerApp push -> SuperNode has the message (SuperNode's idle poll, 3 s in Flower 1.42)"),
    ("node_to_task", "-> SuperExec starts the ClientApp (FLWR_SUPEREXEC_TASK_POLL_INTERVAL)"),
    ("task_to_loaded", "-> ClientApp process up: Python, Flower, FAB install"),
    ("loaded_to_reply", "-> reply ready: the app's imports (torch) and the training"),
    ("reply_to_link", "-> reply at the SuperLink (SuperNode's 0.5 s reply poll, upload)"),
    ("link_to_server", "-> ServerApp has the reply (its pull interval: 3 s in Flower's send_and_receive)"),
)


def events(path: Path) -> list[tuple[float, str]]:
    """(seconds since the epoch, message) of every timestamped line of a Flower log."""
    found = []
    for line in _ANSI.sub("", path.read_text(errors="replace")).splitlines():
        if match := _LINE.match(line):
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append((stamp, match.group(2).strip()))
    return found


def _first_after(log: list[tuple[float, str]], start: float, text: str) -> float:
    return next(stamp for stamp, message in log if stamp >= start and message.startswith(text))


def _last_before(log: list[tuple[float, str]], end: float, text: str) -> float:
    return max(stamp for stamp, message in log if stamp <= end and message.startswith(text))


def train_messages(superlink: list[tuple[float, str]], node: list[tuple[float, str]]) -> list[dict[str, float]]:
    """The phases (PHASES) of every train message one SuperNode's log shows, in seconds."""
    phases = []
    for received, message in node:
        if not message.startswith("Receiving: train message"):
            continue
        pushed = _last_before(superlink, received, "Runtime.PushMessages")
        task = _first_after(node, received, "Runtime.AcquireTask")
        loaded = _first_after(node, task, "Loading ClientApp")
        reply = _first_after(node, loaded, "Runtime.PushMessages")
        sent = _first_after(node, reply, "Sent successfully")
        pulled = _first_after(superlink, sent, "Runtime.ConfirmMessageReceived")
        stamps = (pushed, received, task, loaded, reply, sent, pulled)
        phases.append({name: later - earlier for (name, _), earlier, later in zip(PHASES, stamps, stamps[1:])})
    return phases


def round_seconds(run_dir: Path) -> list[float]:
    """Each round's wall time from rounds.csv (its `seconds` column is cumulative)."""
    with open(run_dir / "rounds.csv", newline="") as handle:
        cumulative = [float(row["seconds"]) for row in csv.DictReader(handle)]
    return [round(later - earlier, 3) for earlier, later in zip([0.0, *cumulative], cumulative)]


def measure(workdir: Path, call: int = 1) -> dict[str, object]:
    """The breakdown of the `call`-th pilot call in `workdir` (its logs/pilot-<call>/ and results/pilot-<call>/)."""
    logs = workdir / "logs" / f"pilot-{call}"
    superlink = events(logs / "superlink.log")
    messages = [phase for node_log in sorted(logs.glob("supernode-*.log"))
                for phase in train_messages(superlink, events(node_log))]
    if not messages:
        raise ValueError(f"{logs}: no timestamped train message; run the pilot with FLWR_LOG_LEVEL=DEBUG")
    rounds = round_seconds(workdir / "results" / f"pilot-{call}")
    return {
        "round_seconds": rounds,
        "median_round_seconds": statistics.median(rounds),
        "median_phase_seconds": {name: round(statistics.median(m[name] for m in messages), 3) for name, _ in PHASES},
        "train_messages": len(messages),
    }


def rendered(result: Path = RESULT) -> str:
    """The markdown table of every measurement in `result`, one column each, in the file's order."""
    runs = json.loads(result.read_text())
    labels = list(runs)
    lines = ["| | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
    lines.append("| **median round** (rounds.csv) | " + " | ".join(
        f"**{runs[label]['median_round_seconds']:.1f} s**" for label in labels) + " |")
    for name, meaning in PHASES:
        lines.append(f"| {meaning} | " + " | ".join(
            f"{runs[label]['median_phase_seconds'][name]:.2f} s" for label in labels) + " |")
    lines.append("")
    for label in labels:
        run = runs[label]
        rounds = ", ".join(f"{seconds:.1f}" for seconds in run["round_seconds"])
        lines.append(f"- {label}: `{run['command']}`; rounds of {rounds} s; {run['train_messages']} train messages; "
                     f"{run['note']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """`measure`: add one pilot call's breakdown to RESULT under its label, then render BLOCK."""
    from dirichlet_fl.files import write_atomically
    from scripts.doc_blocks import render

    parser = argparse.ArgumentParser(prog="round_breakdown.py")
    parser.add_argument("action", choices=("measure",))
    parser.add_argument("--label", default="")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--command", default="")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    if not args.label or args.workdir is None:
        parser.error("measure needs --label and --workdir")
    runs = json.loads(RESULT.read_text()) if RESULT.is_file() else {}
    runs[args.label] = {"command": args.command, "note": args.note, **measure(args.workdir)}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(RESULT, (json.dumps(runs, indent=2) + "\n").encode())
    return render([BLOCK])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
