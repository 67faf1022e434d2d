"""`dirichlet-fl site-executor`: run a site's ClientApp tasks from a warm process (cli/deployment/site_executor.py).

The partner of a ``flower-supernode --isolation process``: point it at the SuperNode's Runtime API (its
``--host``:``--port``) and, if the SuperNode was given ``--superexec-auth-secret-file``, at the same file.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from cli.deployment.processes import exit_on_sigterm
from cli.deployment.site_executor import TASK_POLL_ENV, TASK_POLL_S, serve

PROG = "dirichlet-fl site-executor"
POLL_RANGE = (0.01, 60.0)
"""Flower's own range for a SuperExec's task poll (FLWR_SUPEREXEC_TASK_POLL_INTERVAL)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "site-executor",
        description="Ask a SuperNode (--isolation process) for ClientApp tasks and run each in a child forked "
        "from this warm process.",
    )
    parser.add_argument("--runtime-api-address", required=True,
                        help="the SuperNode's Runtime API, HOST:PORT (its --host and --port)")
    parser.add_argument("--superexec-auth-secret-file", type=Path, default=None,
                        help="the file the SuperNode was given with the same flag (raw bytes, not empty)")
    parser.add_argument("--poll-interval", type=float, default=None,
                        help=f"seconds between task requests, {POLL_RANGE[0]}-{POLL_RANGE[1]:g} (default: "
                        f"${TASK_POLL_ENV} if set, else {TASK_POLL_S})")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the SuperNode) ends")
    parser.set_defaults(func=run)


def poll_interval(args: argparse.Namespace) -> float | str:
    """The task poll in seconds (--poll-interval, else $FLWR_SUPEREXEC_TASK_POLL_INTERVAL, else the default), or
    a one-line message naming where an invalid value came from."""
    source, text = (("--poll-interval", str(args.poll_interval)) if args.poll_interval is not None
                    else (TASK_POLL_ENV, os.environ.get(TASK_POLL_ENV, str(TASK_POLL_S))))
    low, high = POLL_RANGE
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and low <= seconds <= high):
        return f"{source}={text!r} is out of range: it must be a number of seconds in [{low}, {high:g}]"
    return seconds


def check(args: argparse.Namespace) -> str | None:
    """The first invalid argument as a one-line message, or None."""
    if isinstance(message := poll_interval(args), str):
        return message
    host, _, port = args.runtime_api_address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"--runtime-api-address={args.runtime_api_address!r} is not HOST:PORT with a port in 1-65535"
    secret = args.superexec_auth_secret_file
    if secret is not None and (not secret.is_file() or secret.stat().st_size == 0):
        return f"--superexec-auth-secret-file={secret}: not a non-empty file (give the SuperNode's secret file)"
    if args.parent_pid is not None and args.parent_pid < 1:
        return f"--parent-pid={args.parent_pid} is out of range: it must be a PID >= 1"
    return None


def run(args: argparse.Namespace) -> int:
    if (problem := check(args)) is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    secret = args.superexec_auth_secret_file.read_bytes() if args.superexec_auth_secret_file else None
    print(f"{PROG}: serving {args.runtime_api_address}", flush=True)
    with exit_on_sigterm():
        try:
            serve(args.runtime_api_address, auth_secret=secret, poll_s=float(poll_interval(args)),
                  parent_pid=args.parent_pid)
        except KeyboardInterrupt:
            return 130
    return 0
