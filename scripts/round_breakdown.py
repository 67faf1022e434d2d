"""Where a Deployment Engine round's time goes: measured from one `dirichlet-fl pilot` call's logs, rendered
into docs/consortium.md (block round-breakdown) from the committed docs/consortium/round-breakdown.json, and
(block executor-breakdown, `measure --block executor-breakdown`) from docs/consortium/executor-breakdown.json.

Run the pilot with FLWR_LOG_LEVEL=DEBUG (Flower then stamps every log line with its time), then, from the root:
  .venv/bin/python scripts/round_breakdown.py measure --label before --workdir W --note "load 10-13" \\
      --command "dirichlet-fl pilot --sites 2 --rounds 3 ..."
  .venv/bin/python scripts/render.py round-breakdown     # render the committed file again, without measuring

Each train message is followed through the logs: the ServerApp's push (SuperLink log `Runtime.PushMessages`),
the SuperNode's pull of it (`Receiving: train message`), the SuperExec's task poll that starts its ClientApp
(the first `Runtime.AcquireTask` after it), the ClientApp loaded (`Loading ClientApp`) and its reply handed
back (`Runtime.PushMessages`), the SuperNode's upload (`Sent successfully`), the ServerApp's pull of the
reply (the SuperLink's next `Runtime.ConfirmMessageReceived`). Each phase is the median over every train
message (sites x rounds); the round time is the median of rounds.csv's per-round seconds. A call made with
--compare-simulation also records the simulated run's median round, from the same call.
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
RESULTS = {BLOCK: RESULT, "executor-breakdown": ROOT / "docs" / "consortium" / "executor-breakdown.json"}
"""Each block and the result file it is rendered from: `measure --block NAME` adds a call to that file.
"executor-breakdown" compares the site executors (`dirichlet-fl pilot --clientapp-executor`)."""
_LINE = re.compile(r"^[A-Z]+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):\s+(.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
PHASES = (
    ("push_to_node", "ServerApp push -> SuperNode has the message (SuperNode's idle poll, 3 s in Flower 1.42)"),
    ("node_to_task", "-> SuperExec starts the ClientApp (FLWR_SUPEREXEC_TASK_POLL_INTERVAL)"),
    ("task_to_loaded", "-> ClientApp loaded: its process up (Python, Flower), the message pulled, the FAB installed"),
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
    found = next((stamp for stamp, message in log if stamp >= start and message.startswith(text)), None)
    if found is None:
        raise ValueError(f"no log line {text!r} after {datetime.fromtimestamp(start)}")
    return found


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


def site_events(node_log: Path) -> list[tuple[float, str]]:
    """A site's events in time order: its SuperNode's log, with its site executor's (where its ClientApps log
    under `--clientapp-executor fork`) if there is one."""
    executor_log = node_log.with_name(node_log.name.replace("supernode-", "site-executor-"))
    merged = events(node_log) + (events(executor_log) if executor_log.is_file() else [])
    return sorted(merged, key=lambda event: event[0])


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
                for phase in train_messages(superlink, site_events(node_log))]
    if not messages:
        raise ValueError(f"{logs}: no timestamped train message; run the pilot with FLWR_LOG_LEVEL=DEBUG")
    rounds = round_seconds(workdir / "results" / f"pilot-{call}")
    found: dict[str, object] = {
        "round_seconds": rounds,
        "median_round_seconds": statistics.median(rounds),
        "median_phase_seconds": {name: round(statistics.median(m[name] for m in messages), 3) for name, _ in PHASES},
        "train_messages": len(messages),
    }
    simulated = workdir / "results" / f"pilot-{call}-simulation"
    if simulated.is_dir():  # the call ran with --compare-simulation
        found["simulated_median_round_seconds"] = statistics.median(round_seconds(simulated))
    return found


def rendered(result: Path | str = RESULT) -> str:
    """The markdown table of every measurement in `result` (relative to the root, or absolute), one column each,
    in the file's order."""
    runs = json.loads((ROOT / result).read_text())
    labels = list(runs)
    lines = ["| | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
    lines.append("| **median round** (rounds.csv) | " + " | ".join(
        f"**{runs[label]['median_round_seconds']:.1f} s**" for label in labels) + " |")
    if any("simulated_median_round_seconds" in run for run in runs.values()):
        lines.append("| the same config simulated, in the same call (median round; ratio) | " + " | ".join(
            _simulated(runs[label]) for label in labels) + " |")
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


def _simulated(run: dict[str, object]) -> str:
    """A call's simulated median round and the deployed round's ratio to it, or "-" without --compare-simulation."""
    if "simulated_median_round_seconds" not in run:
        return "-"
    simulated = float(run["simulated_median_round_seconds"])  # type: ignore[arg-type]
    return f"{simulated:.2f} s; {float(run['median_round_seconds']) / simulated:.1f}x"  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    """`measure`: add one pilot call's breakdown to RESULT under its label, then render BLOCK."""
    from dirichlet_fl.files import write_atomically
    from scripts.doc_blocks import render

    parser = argparse.ArgumentParser(prog="round_breakdown.py")
    parser.add_argument("action", choices=("measure",))
    parser.add_argument("--block", choices=sorted(RESULTS), default=BLOCK)
    parser.add_argument("--label", default="")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--command", default="")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    if not args.label or args.workdir is None:
        parser.error("measure needs --label and --workdir")
    result = RESULTS[args.block]
    runs = json.loads(result.read_text()) if result.is_file() else {}
    runs[args.label] = {"command": args.command, "note": args.note, **measure(args.workdir)}
    result.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(result, (json.dumps(runs, indent=2) + "\n").encode())
    return render([args.block])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
