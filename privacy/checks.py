"""Argument checks shared by every layer: each returns the value or raises a ValueError that names
the parameter, the value and the valid range, so that a user reads one line and knows the fix."""

from __future__ import annotations

import math
from collections.abc import Iterable


def check_positive(name: str, value: float) -> float:
    """value as float if it is finite and > 0."""
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} is out of range: it must be a finite number > 0")
    return value


def check_in_open_interval(name: str, value: float, low: float, high: float) -> float:
    """value as float if low < value < high."""
    value = float(value)
    if not (low < value < high):
        raise ValueError(f"{name}={value!r} is out of range: it must lie in ({low:g}, {high:g})")
    return value


def check_in_interval(name: str, value: float, low: float, high: float, *, open_low: bool = False) -> float:
    """value as float if low <= value <= high (low < value with open_low)."""
    value = float(value)
    if not ((low < value if open_low else low <= value) and value <= high):
        bracket = "(" if open_low else "["
        raise ValueError(f"{name}={value!r} is out of range: it must lie in {bracket}{low:g}, {high:g}]")
    return value


def check_integer(name: str, value: int, low: int) -> int:
    """value if it is an integer (not a bool) >= low."""
    if isinstance(value, bool) or int(value) != value or value < low:
        raise ValueError(f"{name}={value!r} is out of range: it must be an integer >= {low}")
    return int(value)


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    """value if it is one of choices."""
    options = tuple(choices)
    if value not in options:
        raise ValueError(f"{name}={value!r} is invalid: choose one of {', '.join(options)}")
    return value
