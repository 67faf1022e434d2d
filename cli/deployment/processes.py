"""Local processes for the Deployment Engine: start them in sessions of their own, stop them by PID tree.

Flower starts helpers of its own (the SuperLink's SuperExec, each run's app processes), some in new
sessions, so a signal to one process group misses them: every process started here records the PIDs
of its descendants (read from /proc) with their start times, and stopping signals exactly those, never
a PID the kernel has recycled. Also: free loopback ports, log reading, and the SIGTERM handler that
turns `kill` into a normal exit so that every `finally` runs. Linux only.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"
POLL_S = 0.1
"""Seconds between two polls of a port, a log or a process (never a fixed sleep for a readiness)."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class DeploymentError(ValueError):
    """A deployment step failed; the message names the file, flag or process (and its log)."""


def free_port(taken: Iterable[int] = ()) -> int:
    """A TCP port free on loopback now, and not among ``taken`` (ports already handed out)."""
    taken = set(taken)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            return port
    raise DeploymentError("no free loopback port found")


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat this module needs."""

    state: str
    ppid: int
    pgid: int
    start: int  # start time in clock ticks since boot: with the PID, a process's identity


def proc_stat(pid: int) -> ProcStat | None:
    """A PID's state, parent, process group and start time from /proc, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return ProcStat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))


def same_process(pid: int, start: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` and is not a zombie."""
    stat = proc_stat(pid)
    return stat is not None and stat.start == start and stat.state not in ("Z", "X")


def pid_alive(pid: int) -> bool:
    """Whether a PID is a live process (a zombie counts as gone: it runs nothing)."""
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


def descendants(roots: Iterable[int]) -> dict[int, int]:
    """All live descendants of ``roots`` (children, grandchildren, ...) with their start times."""
    stats = {
        int(entry.name): stat
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None
    }
    children: dict[int, list[int]] = {}
    for child, stat in stats.items():
        children.setdefault(stat.ppid, []).append(child)
    found: dict[int, int] = {}
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found[child] = stats[child].start
                stack.append(child)
    return found


@dataclass
class ManagedProcess:
    """A process this module started, in its own session (process group), logging to a file.

    ``seen`` maps every PID of it and of its descendants observed so far to that process's start
    time, so that a PID the kernel later recycles for an unrelated process is never signalled.
    """

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    seen: dict[int, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """The PID of the process itself (also its process-group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process itself is still running (reaps it if it has exited)."""
        return self.popen.poll() is None

    def refresh(self) -> None:
        """Record the current descendants of every recorded live process (they may outlive it)."""
        self.alive()
        roots = [pid for pid, start in self.seen.items() if same_process(pid, start)]
        self.seen.update(descendants(roots))

    def alive_pids(self) -> set[int]:
        """PIDs of this process and its recorded descendants that still run (zombies excluded)."""
        self.alive()
        return {pid for pid, start in self.seen.items() if same_process(pid, start)}


def require_file(path: Path, flag: str) -> Path:
    """Return ``path`` resolved, or raise a one-line error naming the file and the flag it feeds."""
    if not path.is_file():
        raise DeploymentError(f"{flag}: file not found: {path}")
    return path.resolve()


def read_log(path: Path, tail: int | None = None) -> str:
    """A log file's text without ANSI colours (empty if absent); the last ``tail`` chars if given."""
    try:
        text = _ANSI.sub("", path.read_text(errors="replace"))
    except OSError:
        return ""
    return text if tail is None else text[-tail:]


def failure_reason(text: str) -> str:
    """The gist of a Flower failure in a log: the lines after ``Exit Code``, or the last error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if "Exit Code:" in lines[i]:
            return " / ".join(lines[i : i + 3])
    errors = [line for line in lines if "error" in line.lower()]
    return errors[-1] if errors else (lines[-1] if lines else "no output")


def start_process(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    cwd: Path,
    env: Mapping[str, str],
    stdout_path: Path | None = None,
) -> ManagedProcess:
    """Start ``argv`` in a new session (its own process group), its output going to a log file.

    stdout and stderr both go to ``log_path``, unless ``stdout_path`` is given (for commands whose
    stdout is machine-readable, such as ``flwr ... --format json``). Each start writes fresh files,
    replacing an earlier process's log of the same name: what is read back is this process's output.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as files:
        log = files.enter_context(log_path.open("wb"))
        out = files.enter_context(stdout_path.open("wb")) if stdout_path else log
        popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=log if stdout_path else subprocess.STDOUT,
            start_new_session=True,
        )
    proc = ManagedProcess(name=name, popen=popen, log_path=log_path)
    if (stat := proc_stat(popen.pid)) is not None:
        proc.seen[popen.pid] = stat.start
    return proc


def _signal_tree(proc: ManagedProcess, sig: signal.Signals) -> None:
    """Send ``sig`` to the process's group and to each recorded process that still is itself.

    Only processes whose start time still matches are signalled (never a recycled PID), and only
    their groups, which the kernel does not recycle while a member is left.
    """
    own_group = os.getpgrp()
    groups = {proc.pid} if proc.alive() else set()
    for pid, start in proc.seen.items():
        stat = proc_stat(pid)
        if stat is not None and stat.start == start and stat.state not in ("Z", "X"):
            groups.add(stat.pgid)
            _kill(os.kill, pid, sig)
    for group in groups - {own_group}:
        _kill(os.killpg, group, sig)


def _kill(fn: Callable[[int, int], None], target: int, sig: signal.Signals) -> None:
    try:
        fn(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(processes: Sequence[ManagedProcess], deadline: float) -> set[int]:
    """Poll until every recorded process is gone or the deadline passes; return the survivors."""
    while True:
        for proc in processes:
            proc.refresh()
        alive = {pid for proc in processes for pid in proc.alive_pids()}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_S)


def stop_processes(processes: Sequence[ManagedProcess], grace_s: float) -> set[int]:
    """SIGTERM every process, its group and its descendants; SIGKILL what survives ``grace_s``.

    Descendants are collected first because Flower starts some children (the SuperLink's
    SuperExec) in sessions of their own, which a signal to the parent's group would miss.
    Returns the PIDs still alive at the end (normally none).
    """
    for proc in processes:
        proc.refresh()
    for proc in processes:
        _signal_tree(proc, signal.SIGTERM)
    alive = _wait_gone(processes, time.monotonic() + grace_s)
    if alive:
        for proc in processes:
            _signal_tree(proc, signal.SIGKILL)
        alive = _wait_gone(processes, time.monotonic() + 5.0)
    return alive



def wait_exit(proc: ManagedProcess, timeout: float) -> bool:
    """Wait for a process to exit; True if it was still running after ``timeout`` seconds."""
    try:
        proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return True
    return False



def executable(name: str) -> str:
    """A Flower executable from this interpreter's environment, else from PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise DeploymentError(f"executable not found: {name} (install flwr in this environment)")
    return found


def base_env(flwr_home: Path) -> dict[str, str]:
    """The environment for every Flower process: private FLWR_HOME, offline, no runtime installs.

    PATH starts with this interpreter's bin directory because Flower spawns its helpers
    (flower-superexec, flwr-serverapp, flwr-clientapp) by name.
    """
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PYTHONUNBUFFERED="1",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    return env



def _sigterm_to_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM raises SystemExit(143), so that `kill` unwinds the stack and every
    `finally` (stopping the processes started here) runs; the previous handler is restored after."""
    previous = signal.signal(signal.SIGTERM, _sigterm_to_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
