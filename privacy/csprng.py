"""A cryptographically secure source for the privacy draws (run-config `secure-rng`).

A seeded PRNG is predictable to whoever learns its seed; `SecureRandom` reads the operating system's
CSPRNG (os.urandom) in large chunks and turns its bits into uniforms in (0, 1], Poisson masks, normals
and Gamma draws (with torch's own pathwise gradient wrt the shape), on the CPU in float64, moved to the
caller's device. Nothing is seeded and a forked child drops the buffer. How each draw is made:
docs/privacy.md ("How the numbers are computed", "Secure randomness").
"""

from __future__ import annotations

import math
import os
from typing import cast

import numpy as np
import torch
from torch import Tensor

CHUNK_WORDS = 1 << 17
"""64-bit words read per os.urandom call (1 MiB): few system calls per training step."""
_MANTISSA_SCALE = 2.0**-53


class SecureRandom:
    """Uniform, normal, Bernoulli and Gamma draws from the operating system's CSPRNG (module docstring)."""

    def __init__(self, chunk_words: int = CHUNK_WORDS) -> None:
        if chunk_words < 1:
            raise ValueError(f"chunk_words={chunk_words!r} is out of range: it must be >= 1")
        self._chunk_words = chunk_words
        self._buffer = np.empty(0, dtype=np.uint64)
        self._pid = os.getpid()

    def words(self, count: int) -> np.ndarray:
        """`count` fresh 64-bit words of OS entropy (each word is handed out once)."""
        if self._pid != os.getpid():  # a forked child must not replay its parent's buffer
            self._buffer, self._pid = np.empty(0, dtype=np.uint64), os.getpid()
        missing = count - self._buffer.size
        if missing > 0:
            fresh = np.frombuffer(os.urandom(8 * max(missing, self._chunk_words)), dtype=np.uint64)
            self._buffer = np.concatenate([self._buffer, fresh])
        taken, self._buffer = self._buffer[:count], self._buffer[count:]
        return taken

    def uniform64(self, count: int) -> np.ndarray:
        """`count` float64 uniforms on (0, 1], multiples of 2^-53."""
        return ((self.words(count) >> np.uint64(11)).astype(np.float64) + 1.0) * _MANTISSA_SCALE

    def normal64(self, count: int) -> np.ndarray:
        """`count` float64 standard normals (Box-Muller: both of each pair are used)."""
        pairs = (count + 1) // 2
        radius = np.sqrt(-2.0 * np.log(self.uniform64(pairs)))
        angle = 2.0 * math.pi * self.uniform64(pairs)
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]

    def uniform(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> Tensor:
        """Uniforms on (0, 1] of `shape`, on `device` in `dtype`."""
        return _tensor(self.uniform64(math.prod(shape)), shape, dtype, device)

    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> Tensor:
        """Standard normals of `shape`, on `device` in `dtype`."""
        return _tensor(self.normal64(math.prod(shape)), shape, dtype, device)

    def bernoulli_mask(self, count: int, rate: float, device: torch.device | str | None) -> Tensor:
        """A bool mask of `count` independent Bernoulli(rate) entries: U_i < rate (Poisson sampling)."""
        return torch.from_numpy(self.uniform64(count) < rate).to(device=device)

    def standard_gamma64(self, shape: np.ndarray) -> np.ndarray:
        """One Gamma(a, 1) draw per entry of `shape` (all > 0), in float64, no gradient."""
        a = np.asarray(shape, dtype=np.float64).ravel()
        if a.size and not np.all(a > 0):
            raise ValueError("Gamma shape parameters must all be > 0")
        boosted = np.where(a < 1.0, a + 1.0, a)
        out = self._marsaglia_tsang(boosted)
        small = a < 1.0
        if np.any(small):
            out[small] *= self.uniform64(int(small.sum())) ** (1.0 / a[small])
        return out.reshape(np.shape(shape))

    def _marsaglia_tsang(self, a: np.ndarray) -> np.ndarray:
        """Gamma(a) for a >= 1: x = d v, v = (1 + c z)^3, accepted iff log U < z^2/2 + d - d v + d log v."""
        d = a - 1.0 / 3.0
        c = 1.0 / np.sqrt(9.0 * d)
        out = np.empty_like(a)
        pending = np.arange(a.size)
        while pending.size:
            z = self.normal64(pending.size)
            v = (1.0 + c[pending] * z) ** 3
            positive = v > 0
            log_v = np.log(np.where(positive, v, 1.0))
            bound = 0.5 * z * z + d[pending] * (1.0 - v + log_v)
            accepted = positive & (np.log(self.uniform64(pending.size)) < bound)
            out[pending[accepted]] = d[pending[accepted]] * v[accepted]
            pending = pending[~accepted]
        return out


def _tensor(values: np.ndarray, shape: torch.Size | tuple[int, ...], dtype: torch.dtype,
            device: torch.device | str | None) -> Tensor:
    return torch.from_numpy(values.reshape(tuple(shape))).to(device=device, dtype=dtype)


class _SecureStandardGamma(torch.autograd.Function):
    """Gamma(shape) drawn by SecureRandom, with torch's implicit pathwise gradient wrt shape."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, shape: Tensor, rng: SecureRandom) -> Tensor:
        draws = rng.standard_gamma64(shape.detach().to(device="cpu", dtype=torch.float64).numpy())
        sample = _tensor(draws, shape.shape, shape.dtype, shape.device)
        ctx.save_for_backward(shape, sample)
        return sample

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        shape, sample = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad * torch._standard_gamma_grad(shape, sample), None


def secure_standard_gamma(shape: Tensor, rng: SecureRandom) -> Tensor:
    """Gamma(shape, 1) draws from `rng`, differentiable in `shape` like torch._standard_gamma."""
    return cast(Tensor, _SecureStandardGamma.apply(shape, rng))
