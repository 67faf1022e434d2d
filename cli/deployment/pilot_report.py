"""What one `dirichlet-fl pilot` call reports, and its exit status, read from this call's own records.

Flower's verdict (`flwr run` and the SuperLink's run status) says only that the ServerApp ended, not
that anybody trained: a run in which every site refused ends `finished:completed`. So the report also
reads the ServerApp's own status line from this call's output and every site's rows in this call's
run folder (ledger.csv), and a call in which no site trained exits non-zero (docs/consortium.md,
"Pilot report and exit status").
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.deployment.pilot_sites import Site, lifetime_position

if TYPE_CHECKING:
    from dirichlet_fl.config import RunConfig

STATUS_LINE = "dirichlet-fl run status:"
"""The ServerApp's last line starts with this (server/server_app.py's STATUS_LINE; scripts/run.sh reads it too)."""
FINISHED = ("completed", "stopped-no-client-can-train")
"""The ServerApp's statuses for a run that ended without an error (dirichlet_fl/runs/writer.py)."""
EXIT_RUN_FAILED = 1
EXIT_NO_SITE_TRAINED = 3
"""scripts/run.sh's code for "no client could train" (README, "Exit codes"), used by the pilot too."""
_VERDICT = re.compile(rf"{re.escape(STATUS_LINE)} ([a-z-]+)(?: \((.*?)\)(?:; results in .*)?)?\s*$", re.MULTILINE)
_REFUSED = ("refused", "spent", "skipped")
"""ledger.csv statuses that mean the site (or the server, on the site's budget) declined to train."""


@dataclass(frozen=True)
class Verdict:
    """The ServerApp's own last word in a call's output: its status (None if it printed none) and reason."""

    status: str | None
    reason: str


@dataclass(frozen=True)
class SiteOutcome:
    """What a site did in this call: `trained`, `lost` (it trained, then failed: its SuperNode died or went
    away), `refused` or `failed`, and why, in one line."""

    status: str
    reason: str


def server_verdict(output: str) -> Verdict:
    """The last status line of the ServerApp in this call's `flwr run --stream` output."""
    matches = _VERDICT.findall(output)
    if not matches:
        return Verdict(None, "the ServerApp printed no status line")
    status, reason = matches[-1]
    return Verdict(status, one_line(reason))


def one_line(text: str) -> str:
    """Whitespace (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def ledger_rows(run_dir: Path) -> list[dict[str, str]] | None:
    """The rows of this call's run-folder ledger.csv, or None if the run wrote none."""
    path = run_dir / "ledger.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def site_outcome(rows: list[dict[str, str]] | None, site_id: int, why_none: str) -> SiteOutcome:
    """A site's outcome from the run's ledger rows: trained if it trained in any round, else refused if
    it refused (or sat out on its budget), else failed; `why_none` explains a run that wrote no rows."""
    if rows is None:
        return SiteOutcome("failed", f"the run wrote no ledger.csv ({why_none})")
    mine = [row for row in rows if int(row["client"]) == site_id]
    trained = [row for row in mine if row["status"] == "trained"]
    if trained:
        later = [row for row in mine if row["status"] != "trained" and int(row["round"]) > int(trained[-1]["round"])]
        done = f"trained in {len(trained)} round(s)"
        if later and later[0]["status"] == "failed":  # not its own refusal: it was lost mid-run
            return SiteOutcome("lost", one_line(f"{done}; lost in round {later[0]['round']}: {later[0]['reason']}"))
        tail = f"; then {later[0]['status']} in round {later[0]['round']}: {later[0]['reason']}" if later else ""
        return SiteOutcome("trained", one_line(f"{done}{tail}"))
    for status, matching in (("refused", _REFUSED), ("failed", ("failed", "excluded"))):
        first = next((row for row in mine if row["status"] in matching), None)
        if first is not None:
            return SiteOutcome(status, one_line(f"{first['status']} in round {first['round']}: {first['reason']}"))
    return SiteOutcome("failed", f"no row for this site in the run's ledger.csv ({why_none})")


def site_outcomes(run_dir: Path, site_ids: list[int], why_none: str) -> dict[int, SiteOutcome]:
    """Every site's outcome in this call (see `site_outcome`)."""
    rows = ledger_rows(run_dir)
    return {site_id: site_outcome(rows, site_id, why_none) for site_id in site_ids}


def run_ok(flower_ok: bool, verdict: Verdict) -> bool:
    """Whether the run ended without an error: Flower says so and so does the ServerApp itself (which
    returns normally, and Flower reports `completed`, after some failures it records)."""
    return flower_ok and verdict.status in FINISHED


def exit_status(ok: bool, outcomes: dict[int, SiteOutcome]) -> int:
    """0 if the run ended well and a site trained to its end, 1 if the run failed (or lost every site that
    trained), 3 if it ended but no site trained."""
    statuses = {outcome.status for outcome in outcomes.values()}
    if not ok or ("lost" in statuses and "trained" not in statuses):
        return EXIT_RUN_FAILED
    if "trained" not in statuses:
        return EXIT_NO_SITE_TRAINED
    return 0


FAB_REFUSED = re.compile(r"FAB verification failed|The FAB could not be verified")
"""What a pinned SuperNode logs when it refuses a run's app (flwr/supernode/start_client_internal.py)."""


def app_refusals(log_dir: Path, site_ids: list[int]) -> dict[int, str]:
    """The sites whose SuperNode refused this call's app (its log in `log_dir`, supernode-<i>.log), with why:
    Flower replies only "The FAB could not be verified." to the ServerApp, which may then print no status."""
    refusals = {}
    for site_id in site_ids:
        try:
            text = (log_dir / f"supernode-{site_id}.log").read_text(errors="replace")
        except OSError:
            continue
        match = FAB_REFUSED.search(text)
        if match:
            refusals[site_id] = (
                f"refused the app: {match.group(0)} (the app's signer is not a key its trusted-entities.yaml "
                f"trusts; its SuperNode log: {log_dir / f'supernode-{site_id}.log'})"
            )
    return refusals


def with_app_refusals(
    outcomes: dict[int, SiteOutcome], verdict: Verdict, refusals: dict[int, str]
) -> tuple[dict[int, SiteOutcome], Verdict]:
    """A site that refused the app and trained nothing is `refused` with that reason; the server's reason
    names the first such site when the ServerApp printed no status line of its own."""
    if not refusals:
        return outcomes, verdict
    outcomes = {site_id: SiteOutcome("refused", refusals[site_id])
                if site_id in refusals and outcome.status != "trained" else outcome
                for site_id, outcome in outcomes.items()}  # fmt: skip
    if verdict.status is None:
        site_id = min(refusals)
        verdict = Verdict(None, f"{verdict.reason}; site {site_id} {refusals[site_id]}")
    return outcomes, verdict


def read_summary(run_dir: Path) -> dict[str, Any]:
    """summary.json of the run folder, or {} if the run wrote none (or an unreadable one)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def print_report(result: dict[str, Any]) -> None:
    """The human-readable form of the --json object: the run, then one line per site."""
    accuracy = result["final_accuracy"]
    accuracy_text = "n/a" if accuracy is None else f"{accuracy:.4f}"
    print(
        f"pilot: {result['status']}, server status {result['server_status']} in {result['seconds']} s "
        f"(TLS, authenticated SuperNodes), {result['rounds']} rounds, final accuracy {accuracy_text}; "
        f"results in {result['run_dir']}"
    )
    for site in result["sites"]:
        spent = site["lifetime_epsilon_spent"]
        spent_text = "inf" if spent is None else f"{spent:.4f}"
        print(
            f"site {site['id']}: {site['status']} ({site['reason']}); lifetime eps {spent_text} of "
            f"{site['lifetime_epsilon']:g}; ledger {site['ledger_file']}"
        )
    if "comparison" in result:
        comparison = result["comparison"]
        medians, accuracies = comparison["median_round_seconds"], comparison["final_accuracy"]
        print(
            f"median round: deployment {medians['deployment']:.2f} s, simulation {medians['simulation']:.2f} s "
            f"(ratio {comparison['round_time_ratio']:.2f}); final accuracy: deployment "
            f"{accuracies['deployment']:.4f}, simulation {accuracies['simulation']:.4f}"
        )


def report(
    call: dict[str, Any], run_dir: Path, sites: list[Site], config: RunConfig, outcomes: dict[int, SiteOutcome]
) -> dict[str, Any]:
    """The object --json prints: this call's verdict (`call`), the run folder's summary, and each site's
    status and reason in this call with its lifetime position."""
    summary = read_summary(run_dir)
    entries = [
        {"id": site.site_id, **lifetime_position(site, config), "status": outcomes[site.site_id].status,
         "reason": outcomes[site.site_id].reason}
        for site in sites
    ]  # fmt: skip
    return {
        "tls": True,
        "authenticated": True,
        "app_signed": True,
        "fleet_only_gateway": True,
        **call,
        "run_dir": str(run_dir),
        "rounds": summary.get("rounds"),
        "final_accuracy": summary.get("final_accuracy"),
        "noise": summary.get("noise"),
        "sites": entries,
    }


def round_seconds(run_dir: Path) -> list[float]:
    """Each round's wall time from a run folder's rounds.csv (its `seconds` column is cumulative)."""
    import csv

    with open(run_dir / "rounds.csv", newline="") as handle:
        cumulative = [float(row["seconds"]) for row in csv.DictReader(handle)]
    return [later - earlier for earlier, later in zip([0.0, *cumulative], cumulative)]


def compare_with_simulation(overrides: dict[str, Any], sites: int, run_dir: Path) -> dict[str, Any]:
    """The same run config on Flower's simulation engine (one CPU per client, as Ray gives it), right
    after the deployment run: median round times (the first round excluded: it pays start-up on both
    engines), their ratio, and both final accuracies. Only meaningful for partition sites."""
    import statistics

    from dirichlet_fl.simulation import simulate

    simulated = run_dir.with_name(f"{run_dir.name}-simulation")
    simulate(overrides | {"run-name": simulated.name}, num_supernodes=sites)
    steady = {name: round_seconds(folder)[1:] or round_seconds(folder) for name, folder in
              (("deployment", run_dir), ("simulation", simulated))}  # fmt: skip
    medians = {name: statistics.median(times) for name, times in steady.items()}
    accuracy = {
        name: json.loads((folder / "summary.json").read_text())["final_accuracy"]
        for name, folder in (("deployment", run_dir), ("simulation", simulated))
    }
    return {
        "median_round_seconds": medians,
        "round_time_ratio": medians["deployment"] / medians["simulation"],
        "final_accuracy": accuracy,
        "simulation_run_dir": str(simulated),
    }
