"""Kernel variants with the render flags compiled in.

A kernel that reads ``perspective_correct``, ``clip_barycentric_coords`` or
"blur > 0" at run time keeps registers for every path; compiled in as
constants, the dead paths drop out. Measured on an H200 (ico5 x8 512², K=8):
the register-queue kernel went from 84 to 63 registers per thread (occupancy
31% -> 50%) and the forward from 0.71 to 0.65 ms.

On CUDA each flag set in use gets its own kernel; on the CPU one generic
kernel per function is kept, since each variant is a separate compile
(seconds each with Warp's bundled clang).
"""

from __future__ import annotations

from collections.abc import Callable

import warp as wp

#: None = variants on CUDA only; True = on every device (tests); False = nowhere.
SPECIALIZE: bool | None = None

_CACHE: dict[tuple, wp.Kernel] = {}


def kernel_for(name: str, factory: Callable, device, flags: tuple, *args) -> wp.Kernel:
    """``factory(*args, flags)`` for this device: ``flags`` (a tuple of ints) when
    variants are wanted there, else None (the generic kernel). Cached."""
    specialize = wp.get_device(device).is_cuda if SPECIALIZE is None else SPECIALIZE
    key = (name, *args, tuple(int(f) for f in flags) if specialize else None)
    if key not in _CACHE:
        _CACHE[key] = factory(*args, key[-1])
    return _CACHE[key]


def variant_name(base: str, flags: tuple | None) -> str:
    """Kernel name of a variant: ``base`` or ``base_<flag digits>``."""
    return base if flags is None else base + "_" + "".join(str(int(f)) for f in flags)
