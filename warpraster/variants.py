"""Kernel variants: one factory per kernel family, cached by its configuration key.

A kernel that reads ``perspective_correct``, ``clip_barycentric_coords`` or
"blur > 0" at run time keeps registers for every path; compiled in as
constants, the dead paths drop out (docs/PERF.md: the register queue went from
84 to 63 registers per thread on an H200). On CUDA each flag set in use gets
its own kernel; on the CPU one generic kernel per family is kept by default,
since each variant is a separate compile (seconds with Warp's bundled clang).
Whether variants are made is the workspace's :attr:`Tuning.specialize
<warpraster.settings.Tuning>`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import warp as wp

__all__ = [
    "device_flags",
    "kernel_family",
    "kernel_for",
    "same_struct",
    "struct_ints",
    "variant_kernel",
    "variant_name",
    "variants_on",
    "want_pin",
]


class _KernelFamily:
    """``build(*config)`` -> ``wp.Kernel``, built once per configuration."""

    def __init__(self, build: Callable[..., wp.Kernel]):
        self.build = build
        self.__doc__ = build.__doc__
        self._cache: dict[tuple, wp.Kernel] = {}

    def __call__(self, *config) -> wp.Kernel:
        kernel = self._cache.get(config)
        if kernel is None:
            kernel = self._cache[config] = self.build(*config)
        return kernel


def kernel_family(build: Callable[..., wp.Kernel]) -> _KernelFamily:
    """Decorator: a kernel factory whose results are cached by its arguments (all
    hashable: flags tuples, ints, None). The factory names each variant with
    :func:`variant_name` (``wp.kernel(name=...)``)."""
    return _KernelFamily(build)


def variants_on(device, specialize: bool | None) -> bool:
    """Whether kernel variants are wanted on ``device`` (``specialize`` None: on CUDA)."""
    return wp.get_device(device).is_cuda if specialize is None else bool(specialize)


def device_flags(device, flags: tuple, specialize: bool | None) -> tuple[int, ...] | None:
    """``flags`` as ints when variants are wanted on ``device``, else None (generic)."""
    return tuple(int(f) for f in flags) if variants_on(device, specialize) else None


def kernel_for(
    name: str, factory: Callable, device, flags: tuple, *args, specialize: bool | None = None
) -> wp.Kernel:
    """``factory(*args, flags or None)`` for this device, cached (see :func:`device_flags`)."""
    family = _FAMILIES.get((name, factory))
    if family is None:
        family = _FAMILIES[(name, factory)] = _KernelFamily(factory)
    return family(*args, device_flags(device, flags, specialize))


_FAMILIES: dict[tuple, _KernelFamily] = {}


def variant_kernel(
    fn: Callable,
    base: str,
    flags: tuple | None,
    max_registers: int | None = None,
    max_unroll: int | None = None,
) -> wp.Kernel:
    """``fn`` as the kernel variant ``base_<flags>``: in a module of its own, without
    a generated adjoint and without FMA contraction (PyTorch3D's float32 rounding).
    ``max_unroll``: Warp unrolls constant loops up to this many steps (its default
    16 otherwise; a longer one becomes a run-time loop)."""
    options = {"fuse_fp": False}
    if max_unroll is not None:
        options["max_unroll"] = int(max_unroll)
    return wp.kernel(
        fn,
        name=variant_name(base, flags),
        enable_backward=False,
        module="unique",
        module_options=options,
        cuda_max_registers=max_registers,
    )


def variant_name(base: str, flags: tuple | None) -> str:
    """Kernel name of a variant: ``base`` or ``base_<flag digits>``."""
    return base if flags is None else base + "_" + "".join(str(int(f)) for f in flags)


def struct_ints(fields: Callable, struct) -> tuple[int, ...]:
    """The int fields of a Warp struct instance that ``fields`` (an
    ``operator.attrgetter`` of two or more names, dotted for nested structs) reads:
    from the struct's ctypes fields where Warp keeps them (~1 us for a dozen, against
    ~1 us each through the struct's own attributes, which convert on the way)."""
    try:
        return fields(struct._ctype)  # ints already
    except AttributeError:  # (another Warp layout: the plain attributes)
        return tuple(int(v) for v in fields(struct))


# A kernel body written once starts with ``a = wp.static(pin)(a)``: ``pin`` sets some
# fields of its argument struct to a variant's constants (the compiler then drops the
# paths they rule out), or is the identity in the generic kernel. Warp functions
# built per struct type and value (their annotations set here: the type is a value).
@functools.cache
def same_struct(struct_type) -> wp.Function:
    """The identity on ``struct_type`` as a Warp function (a generic kernel's pin)."""

    def same(s):
        return s

    same.__annotations__ = {"s": struct_type}
    return wp.func(same, name=f"same_{struct_type.key}", module="unique")


@functools.cache
def want_pin(struct_type, want: int | None) -> wp.Function:
    """``pin(g) -> g`` with ``g.want`` (the requested-gradient bits of an adjoint's
    gradient struct) set to the constant ``want``: a variant writes only the
    gradients asked for. None: :func:`same_struct`."""
    if want is None:
        return same_struct(struct_type)
    bits = int(want)

    def pin(g):
        g.want = bits
        return g

    pin.__annotations__ = {"g": struct_type}
    return wp.func(pin, name=variant_name(f"want_{struct_type.key}", (bits,)), module="unique")
