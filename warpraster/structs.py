"""Kernel argument structs (``@wp.struct``) built on the host, and kept between calls.

:func:`new_struct` makes a struct whose array fields the caller leaves out hold a
one-element :func:`placeholder` (made once per dtype, dimension and device);
:class:`StructCache` keeps the structs a long-lived object (a render's buffers,
a texture, the clip buffers) passes call after call, so that their fields are
set again only when an argument changed.
"""

from __future__ import annotations

import warp as wp

__all__ = ["StructCache", "fill_placeholders", "new_struct", "placeholder"]

_PLACEHOLDERS: dict = {}  # (dtype, ndim, device) -> a one-element array (allocated once)


def new_struct(cls, device, **fields):
    """An instance of the ``@wp.struct`` ``cls`` with ``fields`` set and every other
    array field a one-element placeholder on ``device`` (Warp's tape walks every
    array field of a struct it differentiates; kernels test them with their flags)."""
    a = cls()
    dev = wp.get_device(device)
    for name, var in cls.vars.items():
        t = var.type
        value = fields.get(name)
        if value is None and wp.types.is_array(t):
            value = placeholder(t.dtype, t.ndim, dev)
        if value is not None:
            setattr(a, name, value)
    return a


def placeholder(dtype, ndim: int, device) -> wp.array:
    """A one-element ``ndim``-d array of ``dtype`` on ``device``, made once (for
    kernel arguments a launch does not read: no allocation per call)."""
    key = (dtype, ndim, wp.get_device(device).alias)
    if key not in _PLACEHOLDERS:
        _PLACEHOLDERS[key] = wp.zeros((1,) * ndim, dtype=dtype, device=device)
    return _PLACEHOLDERS[key]


def fill_placeholders(instance, cls, device) -> None:
    """Sets every array field of ``instance``, a ``cls`` struct (a nested one: in
    place), to a one-element placeholder on ``device``."""
    for name, var in cls.vars.items():
        if wp.types.is_array(var.type):
            setattr(instance, name, placeholder(var.type.dtype, var.type.ndim, device))


def _same(a: tuple, b: tuple) -> bool:
    """Whether two struct keys match: the same arrays (identity) and equal numbers."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x is y:
            continue
        if isinstance(x, wp.array) or isinstance(y, wp.array) or type(x) is not type(y) or x != y:
            return False
    return True


class StructCache:
    """Kernel argument structs kept between calls (held by a long-lived buffer object).

    Warp sets every array field of a struct through ctypes (several microseconds
    each); a render call's structs are the same call after call, so :meth:`get`
    rebuilds one only when a part of its key changed: another array object
    (values written into the same array are seen, as with plain arguments) or
    another number.
    """

    def __init__(self):
        self._slots: dict = {}

    def get(self, slot, key: tuple, build):
        """The struct of ``slot`` (a name) for ``key`` (arrays and ints/floats/None),
        made by ``build()`` when the key differs from the last one."""
        hit = self._slots.get(slot)
        if hit is not None and _same(hit[0], key):
            return hit[1]
        value = build()
        self._slots[slot] = (key, value)
        return value

    def new(self, cls, device, **fields):
        """``new_struct(cls, device, **fields)``, or the last one of ``cls`` again while
        the device and every field are the same (arrays: the same object). An
        instance once made is never changed, so each launch recorded on a tape
        keeps its own."""
        key = (wp.get_device(device), *fields.keys(), *fields.values())
        return self.get(cls, key, lambda: new_struct(cls, device, **fields))
