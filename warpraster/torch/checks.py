"""Input checks shared by every torch entry point (one validation path).

Each public torch function (``rasterize_meshes``, ``rasterize_mesh_list``,
``MeshRasterizer``, ``MeshRenderer``, the functional ops, the texture holders)
checks its tensors here, before any kernel runs, and raises ``TypeError`` (wrong
type or dtype) or ``ValueError`` (wrong shape, device, or values) naming the
argument. Two kinds of check:

* structure (type, dtype, shape, device): metadata only, so they run always,
  also while ``torch.compile`` traces;
* values (index ranges, per-mesh face ranges that add up, int32 fit): a host
  read of the tensors. The wrappers run them in eager mode; the custom ops run
  :func:`check_packed_values` again inside their implementation (which runs
  eagerly even in a compiled graph) so that no index reaches a kernel unchecked.

Index tensors must have an integer dtype: a float tensor (or a sequence holding
a float) is refused, never truncated, and int64 values outside int32 are refused,
never wrapped.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections.abc import Sequence

import torch

__all__ = [
    "check_index_bounds",
    "check_index_range",
    "check_packed",
    "check_packed_values",
    "eager",
    "float_tensor",
    "index_arg",
    "index_bounds",
    "int_tensor",
    "same_device",
    "tensor",
    "to_int32",
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def eager() -> bool:
    """Whether host reads (value checks) are allowed: not while ``torch.compile`` traces."""
    return not torch.compiler.is_compiling()


def tensor(x, name: str) -> torch.Tensor:
    """``x`` itself; TypeError naming ``name`` unless it is a torch.Tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _is_integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def float_tensor(x, name: str, ndim: int, trailing: tuple = (), dims: str | None = None
                 ) -> torch.Tensor:  # fmt: skip
    """Checks a floating-point tensor of ``ndim`` dims whose last dims are ``trailing``
    (an int: that size; None: any size >= 1); ``dims`` names the shape in the message."""
    tensor(x, name)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    lead = ndim - len(trailing)
    ok = x.ndim == ndim and all(
        x.shape[lead + i] == s if s is not None else x.shape[lead + i] >= 1
        for i, s in enumerate(trailing)
    )
    if not ok:
        if dims is None:
            named = ["*"] * lead + ["D" if s is None else str(s) for s in trailing]
            dims = f"({', '.join(named)})" + (" (D >= 1)" if None in trailing else "")
        raise ValueError(f"{name} must have shape {dims}, got {tuple(x.shape)}")
    return x


def int_tensor(x, name: str, ndim: int, width: int | None = None) -> torch.Tensor:
    """Checks an integer index tensor of ``ndim`` dims (last dim ``width`` if given)."""
    tensor(x, name)
    if x.requires_grad:  # (only a float tensor can: said first, as the likelier mistake)
        raise ValueError(f"{name} must not require grad: it holds indices")
    if not _is_integer(x):
        raise TypeError(f"{name} must be an integer tensor, got dtype {x.dtype}")
    if x.ndim != ndim or (width is not None and x.shape[-1] != width):
        want = "(F, 3)" if width == 3 else "(N, H, W, K)" if ndim == 4 else f"{ndim} dims"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    return x


def index_arg(x, name: str, device: torch.device) -> torch.Tensor:
    """A 1-D integer tensor from a tensor or a sequence of ints (on ``device`` if a
    sequence). Floats are refused, not truncated: ``[0.5]`` raises TypeError."""
    if not isinstance(x, torch.Tensor):
        listy = isinstance(x, Sequence) or hasattr(x, "__array__")
        if isinstance(x, (str, bytes)) or not listy:
            raise TypeError(
                f"{name} must be an integer tensor or a sequence of ints, got {type(x).__name__}"
            )
        try:
            x = torch.as_tensor(x, device=device)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"{name} must be an integer tensor or a sequence of ints, got {type(x).__name__}"
            ) from None
        if x.numel() == 0 and x.is_floating_point():
            x = x.to(torch.int64)  # an empty list is float32 to torch
    if not _is_integer(x):
        raise TypeError(f"{name} must be an integer tensor, got dtype {x.dtype}")
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    return x


def same_device(device: torch.device, reference: str, /, **tensors) -> None:
    """ValueError naming the first of ``tensors`` (None skipped) not on ``device``,
    the device of the argument named ``reference``."""
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device}, but {reference} is on {device}")


def _bounds(idx: torch.Tensor) -> tuple[int, int]:
    return int(idx.min()), int(idx.max())


def check_index_range(idx: torch.Tensor, name: str, rows: int, what: str, *,
                      allow: int | None = None, kind: str = "indices") -> None:  # fmt: skip
    """Every index of ``idx`` in [0, rows) (or equal to ``allow``, e.g. -1 for "none"),
    ``kind`` naming them in the message. A host read; skipped while compiling."""
    if not eager() or idx.numel() == 0:
        return
    if allow is not None:
        idx = idx[idx != allow]
        if idx.numel() == 0:
            return
    lo, hi = _bounds(idx)
    if lo < INT32_MIN or hi > INT32_MAX:
        raise ValueError(f"{name} has values that do not fit in int32 (in [{lo}, {hi}])")
    if lo < 0 or hi >= rows:
        extra = "" if allow is None else f" (or {allow})"
        raise ValueError(
            f"{name} has {kind} in [{lo}, {hi}], outside [0, {rows - 1}]{extra} for {rows} {what}"
        )


def to_int32(t: torch.Tensor) -> torch.Tensor:
    """int32 contiguous (shared when it already is). Call after the range checks:
    wider values would wrap."""
    return t.to(torch.int32).contiguous()


def check_packed(verts, faces, first, count, neighbor=None, *, names: Sequence[str] = (
        "verts", "faces", "mesh_to_face_first_idx", "num_faces_per_mesh",
        "clipped_faces_neighbor_idx")):  # fmt: skip
    """Structure checks of a packed batch; returns (verts, faces, first, count, neighbor)
    with ``first``/``count``/``neighbor`` as 1-D integer tensors on the vertices' device.

    verts (V, 3) floating point; faces (F, 3) integer; first and count (N,) integer,
    N >= 1; neighbor None or (F,) integer; all on one device. No host read.
    """
    nv, nf, nfirst, ncount, nnb = names
    float_tensor(verts, nv, 2, (3,), "(V, 3)")
    int_tensor(faces, nf, 2, 3)
    device = verts.device
    first = index_arg(first, nfirst, device)
    count = index_arg(count, ncount, device)
    if neighbor is not None:
        neighbor = index_arg(neighbor, nnb, device)
        if neighbor.shape[0] != faces.shape[0]:
            raise ValueError(f"{nnb} must have length F={faces.shape[0]}, got {neighbor.shape[0]}")
    same_device(device, nv, **{nf: faces, nfirst: first, ncount: count, nnb: neighbor})
    if first.shape[0] < 1:
        raise ValueError(f"{nfirst} must name at least one mesh")
    if count.shape[0] != first.shape[0]:
        raise ValueError(f"{ncount} has {count.shape[0]} entries, {nfirst} has {first.shape[0]}")
    return verts, faces, first, count, neighbor


def check_packed_values(num_verts: int, faces, first, count, neighbor=None, *,
                        names: Sequence[str] = ("verts", "faces", "mesh_to_face_first_idx",
                                                "num_faces_per_mesh",
                                                "clipped_faces_neighbor_idx")) -> None:  # fmt: skip
    """Value checks of a packed batch (a host read; skipped while compiling): faces in
    [0, V); counts >= 0; ``first`` the running sum of ``count``; counts adding up to F;
    neighbours -1 or a face index. Arguments already passed :func:`check_packed`."""
    if not eager():
        return
    tensors = (faces, first, count, neighbor)
    key = (int(num_verts), *(_tensor_key(t) for t in tensors))
    with _CHECKED_LOCK:  # (the torch ops run from several threads)
        refs = _CHECKED.get(key)
        if refs is not None and all(
            (r is None and t is None) or (r is not None and r() is t)
            for r, t in zip(refs, tensors, strict=True)
        ):
            # the very same tensor objects, unchanged (their memory may not be reused
            # by another tensor while they live)
            _CHECKED.move_to_end(key)
            return
    nv, nf, nfirst, ncount, nnb = names
    check_index_range(faces, nf, num_verts, f"vertices in {nv}", kind="vertex indices")
    c = count.detach().to("cpu", torch.int64)
    fi = first.detach().to("cpu", torch.int64)
    if bool((c < 0).any()):
        raise ValueError(f"{ncount} must be >= 0, got {c.tolist()}")
    expected = torch.cumsum(c, 0) - c
    if not torch.equal(fi, expected):
        raise ValueError(
            f"{nfirst} must be the running sum of {ncount} "
            f"(expected {expected.tolist()}, got {fi.tolist()})"
        )
    if int(c.sum()) != faces.shape[0]:
        raise ValueError(f"{ncount} adds up to {int(c.sum())} faces, but {nf} has {faces.shape[0]}")
    if neighbor is not None:
        check_index_range(neighbor, nnb, faces.shape[0], "faces", allow=-1)
    with _CHECKED_LOCK:
        _CHECKED[key] = tuple(None if t is None else weakref.ref(t) for t in tensors)
        while len(_CHECKED) > 64:
            _CHECKED.popitem(last=False)


#: Topologies whose values passed :func:`check_packed_values`, by their tensors'
#: memory, shape and torch version counter (bumped by every in-place change made
#: through torch), with weak references to the very tensor objects (an address
#: reused by a new tensor is not a hit): a repeated call with the same, unchanged
#: index tensors reads
#: nothing back (each read is a device synchronisation on CUDA). Writes that
#: bypass torch's counter (a Warp kernel writing into the tensor's memory) are not
#: seen: check such tensors yourself.
_CHECKED: collections.OrderedDict = collections.OrderedDict()
_CHECKED_LOCK = threading.Lock()


#: stands in for the version of a tensor that has none (made under
#: ``torch.inference_mode``): never the same twice, so such a tensor is never a hit
_UNVERSIONED = itertools.count()


def _tensor_key(t) -> tuple | None:
    if t is None:
        return None
    try:
        version = t._version
    except RuntimeError:  # an inference tensor: no version counter (read it again)
        version = ("unversioned", next(_UNVERSIONED))
    # (torch.Size and torch.device hash and compare by value: no conversions)
    return (t.data_ptr(), t.shape, t.dtype, t.device, version)


# ----------------------------------------------------------------------------- read once
class ReadOnce:
    """Values read back from tensors (a host read each: on CUDA a synchronisation),
    kept per unchanged tensor: by its :func:`_tensor_key` (memory, shape, dtype,
    device, torch version counter) with a weak reference to the very tensor object
    (a new tensor at a reused address is not a hit), the ``capacity`` used last.
    A tensor without a version counter (made under ``torch.inference_mode``) is read
    every time. Writes that bypass torch's counter (a Warp kernel writing into the
    tensor's memory) are not seen: check such tensors yourself. Thread-safe."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._kept: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, t: torch.Tensor, read, fresh: bool = False) -> tuple[object, bool]:
        """(``read(t)``, whether it was kept: no read); ``fresh``: read it again."""
        key = _tensor_key(t)
        if not fresh:
            with self._lock:
                hit = self._kept.get(key)
                if hit is not None and hit[0]() is t:
                    self._kept.move_to_end(key)
                    return hit[1], True
        value = read(t)
        with self._lock:
            self._kept[key] = (weakref.ref(t), value)
            self._kept.move_to_end(key)
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)
        return value, False


#: Index tensors' (min, max) already read back (:class:`ReadOnce`), the bounds
#: rather than a verdict (:data:`_CHECKED`), so one read serves every row count the
#: tensor is checked against (the faces of ``interpolate_vertex_attributes`` against
#: the attributes and ``verts_ndc``; one ``pix_to_face`` against the faces of each op
#: it feeds). Bounds kept that fail a check are read again before anything is raised
#: (they may predate a write torch did not count), so a kept entry can never make a
#: good tensor fail.
_BOUNDS = ReadOnce(256)


def _read_bounds(idx: torch.Tensor) -> tuple[int, int]:
    """(min, max) of a non-empty integer tensor: one host read (one transfer of two
    scalars; on CUDA one synchronisation)."""
    lo, hi = torch.aminmax(idx.detach())
    lo, hi = torch.stack((lo, hi)).tolist()
    return lo, hi


def _kept_bounds(idx: torch.Tensor, fresh: bool) -> tuple[tuple[int, int], bool]:
    """((min, max) of non-empty ``idx``, whether they were kept (no read))."""
    return _BOUNDS.get(idx, lambda t: _read_bounds(t), fresh)  # (patched in tests)


def index_bounds(idx: torch.Tensor, ok=None) -> tuple[int, int] | None:
    """(min, max) of the integer tensor ``idx`` (None when empty), read back once per
    unchanged tensor (see :data:`_BOUNDS`): a repeated call with the same tensor
    object, not changed in place since, reads nothing. ``ok(lo, hi)``: the check
    the caller makes; kept bounds failing it are read again (and returned fresh)."""
    if idx.numel() == 0:
        return None
    bounds, kept = _kept_bounds(idx, False)
    if kept and ok is not None and not ok(*bounds):
        bounds = _kept_bounds(idx, True)[0]
    return bounds


def check_index_bounds(idx: torch.Tensor, name: str, rows: int, what: str, *,
                       allow: int | None = None, kind: str = "indices") -> None:  # fmt: skip
    """:func:`check_index_range`'s check (same errors), reading ``idx`` back once per
    unchanged tensor (:func:`index_bounds`) where that one reads it every call.
    ``allow``: None or -1 (the bounds cannot tell another allowed value apart)."""
    if not eager() or idx.numel() == 0:
        return
    if allow not in (None, -1):
        check_index_range(idx, name, rows, what, allow=allow, kind=kind)
        return
    floor = 0 if allow is None else allow

    def ok(lo: int, hi: int) -> bool:
        return lo >= floor and hi < rows and hi <= INT32_MAX

    if not ok(*index_bounds(idx, ok)):
        # the message's figures (over the values other than ``allow``): more reads,
        # on the error path only
        check_index_range(idx, name, rows, what, allow=allow, kind=kind)
