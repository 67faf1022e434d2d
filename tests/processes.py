"""Process trees read from /proc, so a test signals only processes it started itself.

pytest-xdist's workers share one session, so "this session's processes" would include other workers' Ray
actors; a process's descendants are its own."""

from __future__ import annotations

import os


def descendants(roots: list[int]) -> set[int]:
    """`roots` and every process below them, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, pending = set(), list(roots)
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(children.get(pid, []))
    return found
