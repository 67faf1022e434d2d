"""Rendered blocks in the docs: text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` that a script
writes from a committed result file, so that a document cannot drift from its measurement (a test
compares the block with a fresh rendering)."""

from __future__ import annotations

from pathlib import Path

from dirichlet_fl.files import write_atomically


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def block(path: Path, name: str) -> str:
    """What `path` holds between the markers of `name` (ValueError naming both when they are missing)."""
    begin, end = markers(name)
    text = path.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{path}: no {begin} ... {end} block")
    return text[text.index(begin) + len(begin) : text.index(end)].strip("\n") + "\n"


def replace_block(path: Path, name: str, rendered: str) -> None:
    """Write `rendered` between the markers of `name` in `path`, atomically."""
    begin, end = markers(name)
    text = path.read_text()
    start, stop = text.index(begin) + len(begin), text.index(end)
    write_atomically(path, f"{text[:start]}\n{rendered.rstrip()}\n{text[stop:]}".encode())
