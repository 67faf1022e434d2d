"""`dirichlet-fl pilot`: a consortium rehearsal on Flower's Deployment Engine, on loopback, in one command.

It starts a `flower-superlink` (TLS, SuperNode authentication, reached by the sites only through a Fleet-only gateway,
cli/deployment/fleet_gateway.py) and one `flower-supernode` per site (cli/deployment/federation.py), each pinned to
the app's signing key (cli/deployment/app_signing.py) and with its own data, target and lifetime eps, ledger folder
and noise secret; it signs this app, serves it from a loopback Hub stand-in (cli/deployment/app_hub.py), submits it,
reports what each site did (cli/deployment/pilot_report.py) and stops every process it started, by PID. A second call
on the same --workdir (locked by pilot.lock) reuses the sites, so their lifetime spending continues. The workdir's
layout: docs/consortium.md; what this protects against whom: docs/pilot-security.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.deployment.pilot_sites import Site, lifetime_ledger_of, per_site, site_pin
from cli.deployment.site_executor import CLIENTAPP_EXECUTORS

if TYPE_CHECKING:  # Flower, torch and the app are imported when the command runs, not when it registers
    from cli.deployment.flwr_output import RunOutcome
    from dirichlet_fl.config import RunConfig

PROG = "dirichlet-fl pilot"
LIFETIME_FACTOR = 3.0
"""Default lifetime budget of a site: this many times the run's target eps."""
LOCK_FILE = "pilot.lock"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `pilot` subcommand, with `func=run`, on a subparsers object."""
    parser = subparsers.add_parser(
        "pilot",
        description="One SuperLink and N authenticated SuperNodes on 127.0.0.1, one run, then stop everything. "
        "Exit status: 0 a site trained, 1 the run failed, 2 bad input, 3 the run ended but no site trained.",
    )
    parser.add_argument("--sites", type=int, required=True, help="number of sites (SuperNodes), >= 1")
    parser.add_argument("--rounds", type=int, required=True, help="FedAvg rounds, >= 1")
    parser.add_argument("--workdir", type=_workdir_path, required=True,
                        help="folder for certificates, keys, ledgers, results")
    parser.add_argument(
        "--target-epsilon", default="1",
        help="each site's eps for this run: one number, or one per site 'e0,e1,...' (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--lifetime-epsilon", default="",
        help=f"each site's lifetime eps over all runs on its data, one number or one per site "
        f"(default {LIFETIME_FACTOR:g} x its --target-epsilon)",
    )  # fmt: skip
    parser.add_argument(
        "--data-files", default="", help="comma-separated .npz site files, one per site (default: partitions)"
    )
    parser.add_argument("--run-config", default="", help="extra run-config overrides, 'key=value ...' as for flwr run")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the run may take, > 0 (default 900)")
    parser.add_argument(
        "--compare-simulation", action="store_true",
        help="then run the same run config on the simulation engine and report both round times and accuracies",
    )  # fmt: skip
    parser.add_argument(
        "--clientapp-executor", choices=CLIENTAPP_EXECUTORS, default=CLIENTAPP_EXECUTORS[0],
        help="how a site runs each ClientApp: 'fork' from its warm `dirichlet-fl site-executor` (default), or "
        "'subprocess', Flower's fresh process per message",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


PILOT_OWNED_KEYS = {
    "num-server-rounds": "--rounds",
    "target-epsilon": "--target-epsilon",
    "results-dir": "--workdir (results go to <workdir>/results)",
    "run-name": "--workdir (each call is named pilot-<k>)",
}
"""Run-config keys that the pilot's own flags set: giving one in --run-config would be silently overridden
or would move what the report reads, so it is refused, naming the flag to use instead."""
_UNSAFE_PATH_CHARACTERS = ("'", '"', "\\", "\n", "\r")
"""Characters a workdir may not hold: its paths are written into TOML and run-config strings."""


def _workdir_path(text: str) -> Path:
    """--workdir as a Path; an empty text is refused (Path('') would silently be the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("--workdir is empty: give a folder path (it is created if absent)")
    return Path(text)


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _check_args(args: argparse.Namespace, app_dir: Path) -> str | None:
    """The first invalid argument as one line, or None. Nothing has started, nothing is written yet."""
    return (
        _check_numbers(args)
        or _check_workdir(args.workdir.resolve(), app_dir)
        or _check_files(args)
        or _check_run_config(args, app_dir)
    )


def _check_run_config(args: argparse.Namespace, app_dir: Path) -> str | None:
    """--run-config read as `flwr run` reads it (one line naming what it would drop, override or reject),
    no key that a pilot flag sets, and the fused config valid: before the workdir is locked or written."""
    try:
        run_config_of(args, "pilot-check", app_dir)
    except ValueError as error:
        return " ".join(str(error).split())
    return None


def _check_numbers(args: argparse.Namespace) -> str | None:
    if args.sites < 1:
        return f"--sites={args.sites} is out of range: it must be >= 1"
    if args.rounds < 1:
        return f"--rounds={args.rounds} is out of range: it must be >= 1"
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        return f"--timeout={args.timeout:g} is out of range: give the seconds the run may take, a finite number > 0"
    try:
        lifetimes(args)
    except ValueError as error:
        return str(error)
    return None


def lifetimes(args: argparse.Namespace) -> list[float]:
    """Each site's lifetime eps: --lifetime-epsilon, else LIFETIME_FACTOR x its --target-epsilon, which must
    stay finite (a default that overflows would be a value nobody gave)."""
    targets = per_site("--target-epsilon", args.target_epsilon, args.sites)
    if args.lifetime_epsilon:
        return per_site("--lifetime-epsilon", args.lifetime_epsilon, args.sites)
    if not all(math.isfinite(LIFETIME_FACTOR * target) for target in targets):
        raise ValueError(
            f"--target-epsilon={args.target_epsilon} is out of range: its default lifetime eps "
            f"({LIFETIME_FACTOR:g} x it) overflows; give a smaller --target-epsilon or a --lifetime-epsilon"
        )
    return [LIFETIME_FACTOR * target for target in targets]


def _check_workdir(workdir: Path, app_dir: Path) -> str | None:
    """--workdir must be (or be creatable as) a folder outside the app; whether it is writable is found
    when the call locks it (`workdir_lock`), still before anything starts."""
    if workdir == app_dir or app_dir in workdir.parents:
        return (
            f"--workdir {workdir} is inside the app folder {app_dir}, which flwr run bundles: "
            "choose a folder outside it"
        )
    unsafe = [char for char in _UNSAFE_PATH_CHARACTERS if char in str(workdir)]
    if unsafe:
        return (
            f"--workdir {str(workdir)!r} contains {unsafe[0]!r}, which the run config and Flower's config files "
            "cannot carry: choose a folder path without quotes, backslashes or line breaks"
        )
    existing = next(path for path in (workdir, *workdir.parents) if path.exists())
    if existing == workdir and not existing.is_dir():
        return f"--workdir {workdir} is a file: give a folder (it is created if absent)"
    if not existing.is_dir():
        return f"--workdir {workdir} lies under {existing}, which is a file: give a folder path"
    return None


def _check_files(args: argparse.Namespace) -> str | None:
    files = [item for item in args.data_files.split(",") if item.strip()]
    if files and args.compare_simulation:
        return (
            "--compare-simulation needs partition sites (no --data-files): the simulation engine cannot read site files"
        )
    if files and len(files) != args.sites:
        return f"--data-files names {len(files)} files for --sites={args.sites}: give one file per site"
    for item in files:
        if not Path(item).is_file():
            return f"--data-files: file not found: {item}"
    return None


class WorkdirUnavailable(Exception):
    """The workdir cannot be written, or another pilot holds it: one line naming --workdir and the fix."""


@contextlib.contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """Hold an exclusive lock on the workdir for the whole call (fcntl.flock on workdir/pilot.lock), so that
    two pilots never share its FLWR_HOME config, run names, logs or sites; a second one fails at once."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        handle = open(workdir / LOCK_FILE, "a+")
    except OSError as error:
        raise WorkdirUnavailable(
            f"--workdir {workdir} cannot be written ({error.strerror}): choose a folder you can write"
        ) from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise WorkdirUnavailable(
                f"--workdir {workdir} is in use by another pilot (PID {holder}): wait for it to end, "
                "or give another --workdir"
            ) from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield  # closing the file releases the lock, also when the process dies


def sites_for(args: argparse.Namespace) -> list[Site]:
    """Each site's node config; folders under --workdir, so that a second call reuses them."""
    files = [str(Path(item).resolve()) for item in args.data_files.split(",") if item.strip()]
    targets = per_site("--target-epsilon", args.target_epsilon, args.sites)
    lifetime = lifetimes(args)
    sites = []
    for site_id in range(args.sites):
        folder = args.workdir.resolve() / "sites" / f"site-{site_id}"
        config: dict[str, Any] = {
            "partition-id": site_id,
            "num-partitions": args.sites,
            "target-epsilon": targets[site_id],
            "lifetime-epsilon": lifetime[site_id],
            "ledger-dir": str(folder / "ledgers"),
            "secret-dir": str(folder / "secret"),
            "witness-dir": str(args.workdir.resolve() / "witness" / f"site-{site_id}"),
            "cache-dir": str(folder / "cache"),
        }
        if files:
            config["data-file"] = files[site_id]
        sites.append(Site(site_id, config))
    return sites


def _check_lifetime_ledgers(sites: list[Site], config: RunConfig) -> str | None:
    """Every site's ledger problem is an input error, found before anything starts."""
    for site in sites:
        try:
            lifetime_ledger_of(site, config)
        except (ValueError, OSError) as error:  # a missing data set is a FileNotFoundError
            return f"site {site.site_id}: {' '.join(str(error).split())}"
    return None


def _check_site_data(sites: list[Site], config: RunConfig) -> str | None:
    """A partition site splits the run's data set from its own data root: a set no site can load offline is
    an input error, found before anything starts (the ledger no longer reads it: its pool is fixed)."""
    from client.site import SitePolicy
    from dirichlet_fl.config_groups import SYNTHETIC
    from dirichlet_fl.preflight import split_of

    checked: set[str] = set()
    for site in sites:
        policy = SitePolicy.from_node_config(site.node_config, deployment=True)
        site_config = policy.site_config(config)
        if policy.path_refusal(config) is not None:
            continue  # the site refuses the run itself, and reports why
        if policy.data_file or config.data.dataset == SYNTHETIC or site_config.data.root in checked:
            continue
        checked.add(site_config.data.root)
        try:
            split_of(site_config, len(sites))
        except (ValueError, OSError) as error:
            return f"site {site.site_id}: dataset={config.data.dataset!r}: {' '.join(str(error).split())}"
    return None


def run_config_of(args: argparse.Namespace, run_name: str, app_dir: Path) -> dict[str, Any]:
    """The run's overrides: rounds, the results folder under --workdir, no client-side evaluation (the
    server evaluates centrally; each evaluation would start one more process per site and round), then
    --run-config, read and checked as `dirichlet-fl check` reads it. ValueError (one line) for a bad
    --run-config, a key a pilot flag sets, or a fused config that does not validate."""
    from flwr.common.config import get_fused_config_from_dir

    from dirichlet_fl.config import RunConfig
    from dirichlet_fl.preflight import parse_overrides

    given = parse_overrides([args.run_config], app_dir) if args.run_config.strip() else {}
    for key, flag in PILOT_OWNED_KEYS.items():
        if key in given:
            raise ValueError(f"--run-config: {key} is set by the pilot's {flag}: use that instead of {key}=...")
    config: dict[str, Any] = {
        "num-server-rounds": args.rounds,
        "target-epsilon": max(per_site("--target-epsilon", args.target_epsilon, args.sites)),
        "fraction-evaluate": 0.0,
        "results-dir": str(args.workdir.resolve() / "results"),
        "run-name": run_name,
        **given,
    }
    try:
        RunConfig.from_run_config(get_fused_config_from_dir(app_dir, config))
    except ValueError as error:
        raise ValueError(f"--run-config: {error}") from None
    return config


def _next_run_name(workdir: Path) -> str:
    """pilot-<k>, the first k for which neither a run folder nor a call's log folder exists."""
    folders = [workdir / "results", workdir / "logs"]
    taken = {path.name for folder in folders if folder.is_dir() for path in folder.iterdir()}
    index = 1
    while f"pilot-{index}" in taken:
        index += 1
    return f"pilot-{index}"


def run(args: argparse.Namespace) -> int:
    from dirichlet_fl.paths import APP_DIR

    problem = _check_args(args, APP_DIR.resolve())
    if problem is not None:
        return _fail(problem)
    workdir = args.workdir.resolve()
    folders_before = _folders(workdir)
    lock_before = (workdir / LOCK_FILE).exists()
    try:
        with workdir_lock(workdir):
            code = _run_locked(args, APP_DIR)
    except WorkdirUnavailable as error:
        return _fail(str(error))
    if code == 2:  # bad input: take back the lock file and the empty folders this call made
        _remove_what_was_made(workdir, folders_before, lock_before)
    return code


def _folders(root: Path) -> set[Path]:
    """Every folder under `root`, `root` included (empty when it does not exist)."""
    return {root, *(path for path in root.rglob("*") if path.is_dir())} if root.is_dir() else set()


def _remove_what_was_made(workdir: Path, folders_before: set[Path], lock_before: bool) -> None:
    """Remove pilot.lock if this call made it, then the folders it made that are empty, deepest first:
    a call refused for bad input leaves the workdir as it found it (files are never removed)."""
    if not lock_before:
        (workdir / LOCK_FILE).unlink(missing_ok=True)
    for folder in sorted(_folders(workdir) - folders_before, key=lambda path: len(path.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only an empty folder goes


def _run_locked(args: argparse.Namespace, app_dir: Path) -> int:
    """Check the config and every site's ledger, deploy, run, report: the call, under the workdir's lock."""
    from flwr.common.config import get_fused_config_from_dir

    from cli.deployment.processes import DeploymentError
    from dirichlet_fl.config import RunConfig

    sites = sites_for(args)
    run_name = _next_run_name(args.workdir.resolve())
    overrides = run_config_of(args, run_name, app_dir)  # checked before the lock: cannot fail here
    config = RunConfig.from_run_config(get_fused_config_from_dir(app_dir, overrides))
    problem = _check_site_data(sites, config) or _check_lifetime_ledgers(sites, config)
    if problem is not None:
        return _fail(problem)
    # One thread per process, as Ray gives a simulated client with num-cpus=1: torch's default (every
    # core) on tiny models spends more time synchronising threads than computing (docs/consortium.md).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        outcome = _deploy_and_run(args, sites, overrides, run_name, app_dir)
    except DeploymentError as error:
        return _fail(str(error))
    return _finish(args, sites, config, overrides, outcome, args.workdir.resolve() / "results" / run_name)


def _deploy_and_run(
    args: argparse.Namespace, sites: list[Site], overrides: dict[str, Any], run_name: str, app_dir: Path
) -> RunOutcome:
    """Sign the staged app, pin each site to the signing key, start the federation behind a Fleet-only
    gateway (this call's logs in logs/<run name>/), submit the signed app by its Hub spec, stop everything."""
    from cli.deployment.app_hub import AppHub, PublishedApp
    from cli.deployment.app_signing import build_fab, fab_identity, make_reviewer_key, sign_fab
    from cli.deployment.federation import Federation
    from cli.deployment.processes import exit_on_sigterm
    from dirichlet_fl.paths import stage_app

    workdir = args.workdir.resolve()
    configs = [site.node_config for site in sites]
    fab = build_fab(stage_app(app_dir, workdir / "app"))
    key = make_reviewer_key(workdir / "reviewer")
    pins = [site_pin(workdir, site.site_id, key) for site in sites]
    logs = workdir / "logs" / run_name
    with exit_on_sigterm(), AppHub() as hub:
        spec = hub.publish(PublishedApp(*fab_identity(fab), fab, [sign_fab(fab, key)]))
        federation = Federation(
            workdir, configs, name="pilot", log_dir=logs, hub_url=hub.url, trusted_entities=pins, fleet_gateway=True,
            clientapp_executor=args.clientapp_executor,
        )
        with federation as fed:
            return fed.run(spec, overrides, timeout=args.timeout)


def _unknown_status(outcome: RunOutcome) -> str:
    """The call's Flower status when the SuperLink gave none back: timed out, or unknown (never "failed" with an
    exit 0 beside it: the call then exits 1, and says why)."""
    if outcome.timed_out:
        return "timed out"
    run = "the run" if outcome.run_id is None else f"run {outcome.run_id}"
    return f"unknown (the SuperLink reported no status for {run}; flwr exit {outcome.returncode})"


def _finish(
    args: argparse.Namespace,
    sites: list[Site],
    config: RunConfig,
    overrides: dict[str, Any],
    outcome: RunOutcome,
    run_dir: Path,
) -> int:
    """Judge the call from its own output and run folder, print the report, return the exit status."""
    from cli.deployment.pilot_report import (
        EXIT_NO_SITE_TRAINED,
        app_refusals,
        compare_with_simulation,
        exit_status,
        print_report,
        report,
        run_ok,
        server_verdict,
        site_outcomes,
        with_app_refusals,
    )

    flower = outcome.status or _unknown_status(outcome)
    ids = [site.site_id for site in sites]
    verdict = server_verdict(outcome.output)
    outcomes, verdict = with_app_refusals(
        site_outcomes(run_dir, ids, f"Flower: {flower}; server: {verdict.status or 'no status'} ({verdict.reason})"),
        verdict,
        app_refusals(outcome.log_path.parent, ids),
    )
    why = f"Flower: {flower}; server: {verdict.status or 'no status'} ({verdict.reason})"
    # the SuperLink's own status must be known: a call that cannot read it back never reports success
    code = exit_status(run_ok(outcome.ok and outcome.status is not None, verdict), outcomes)
    call = {"status": flower, "server_status": verdict.status, "server_reason": verdict.reason, "ok": code == 0,
            "exit_status": code, "seconds": round(outcome.duration_s, 1), "log": str(outcome.log_path)}  # fmt: skip
    result = report(call, run_dir, sites, config, outcomes)
    if args.compare_simulation and code == 0:
        result["comparison"] = compare_with_simulation(overrides, args.sites, run_dir)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    if code:
        what = "no site trained in this call" if code == EXIT_NO_SITE_TRAINED else f"the run failed ({why})"
        print(f"{PROG}: {what}; see each site's reason and {outcome.log_path}", file=sys.stderr)
    return code
