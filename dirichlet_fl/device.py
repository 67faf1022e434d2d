"""The torch device a run computes on, and waiting for it (for timers)."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """auto: the GPU when there is one (several clients may share it), else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} requested but no CUDA device is available; use device='auto' or 'cpu'")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that a timer measures the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
