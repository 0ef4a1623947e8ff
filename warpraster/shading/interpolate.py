"""Interpolation of per-face-vertex and per-vertex attributes over the fragments.

Two forms, one kernel:

* :func:`interpolate_face_attributes` is PyTorch3D's op: attributes given per face
  corner, ``(F, 3, D)``;
* :func:`interpolate_vertex_attributes` is nvdiffrast's ``interpolate``: attributes
  per vertex ``(V, D)`` indexed through packed faces ``(F, 3)``, optionally with the
  screen-space derivatives of the interpolated attribute (what mip-level
  selection needs), computed analytically per face from the projected vertices.

For N images of H x W pixels with K slots each, the result is a 4-D
``wp.array`` of shape ``(N, H, W, K)`` whose dtype is ``vector(D, float32)``
(``wp.vec2``/``vec3``/``vec4`` for D = 2, 3, 4): its ``.numpy()`` is
``(N, H, W, K, D)``. Slots with ``pix_to_face < 0`` hold zeros.

The kernel runs one thread per (slot, channel) and has no loop, so Warp's
generated adjoint is exact: recorded on a ``wp.Tape``, gradients reach the
attributes (atomically summed per face corner or vertex), the barycentrics (and
from there the vertices through the rasterizer's own backward, when the
fragments were recorded on the same tape) and, for the derivative outputs, the
projected vertices ``verts_ndc``. :func:`interpolate_face_attributes_adjoint` and
:func:`interpolate_vertex_attributes_adjoint` launch that adjoint alone, without a
tape and without running the forward (the interpolation is linear: its inputs are
all the adjoint reads).

Vector-typed arrays are handed to the kernels as float32 views that share their
data and their ``.grad`` buffer: write upstream gradients into a result's
existing ``.grad`` (``out.grad.assign(g)``, ``wp.copy``), do not rebind
``out.grad`` to a new array after the call was recorded.

Screen-space derivative units: per pixel, ``d/dx`` along image columns to the
right (increasing ``xi``), ``d/dy`` along rows downwards (increasing ``yi``).
PyTorch3D's NDC has +X left and +Y up and a pixel spans ``2 / min(H, W)`` NDC
units on both axes, so ``d/dx = -(2 / min(H, W)) * d/dX_ndc`` and
``d/dy = -(2 / min(H, W)) * d/dY_ndc``. nvdiffrast's ``interpolate`` reports
derivatives per pixel with x right and y along its (bottom-up) rows; flip the
sign of d/dy to compare with an OpenGL-style image.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..geometry import EPS, barycentric, pixel_centre
from ..meshes import as_faces_array, as_vec3_array
from ..structs import new_struct
from .adjoint_args import grad_view, no_adjoint, upstream_view
from .pixel_args import PixelFragments

# Same float rounding as PyTorch3D's separately rounded products (see fragments.py).
wp.set_module_options({"fuse_fp": False})

__all__ = [
    "as_float_array",
    "as_fragment_arrays",
    "float_view",
    "interpolate_face_attributes",
    "interpolate_face_attributes_adjoint",
    "interpolate_vertex_attributes",
    "interpolate_vertex_attributes_adjoint",
    "vector_type",
]


# ----------------------------------------------------------------------------- array helpers
_VECTOR_TYPES: dict[int, type] = {2: wp.vec2, 3: wp.vec3, 4: wp.vec4}


def vector_type(d: int) -> type:
    """``vector(d, float32)``: ``wp.vec2``/``vec3``/``vec4`` for 2, 3, 4; one cached type per d."""
    if d not in _VECTOR_TYPES:
        _VECTOR_TYPES[d] = wp.types.vector(length=d, dtype=wp.float32)
    return _VECTOR_TYPES[d]


def is_torch(x) -> bool:
    """Whether ``x`` is a torch object (rejected here: use ``warpraster.torch``)."""
    return type(x).__module__.startswith("torch")


def _vector_length(dtype) -> int | None:
    """Length of a float32 vector dtype, None for anything else."""
    if wp.types.type_is_vector(dtype) and dtype._wp_scalar_type_ == wp.float32:
        return int(dtype._length_)
    return None


def _alias(arr: wp.array, dtype, shape: tuple[int, ...]) -> wp.array:
    """A view of contiguous ``arr`` with another dtype/shape, sharing data and gradient."""
    view = wp.array(ptr=arr.ptr, dtype=dtype, shape=shape, device=arr.device)
    view._ref = arr  # keep the owner alive
    if arr.requires_grad and arr.grad is not None:
        view.grad = wp.array(ptr=arr.grad.ptr, dtype=dtype, shape=shape, device=arr.device)
        view.grad._ref = arr.grad
        view.requires_grad = True
    return view


def float_view(arr: wp.array) -> wp.array:
    """float32 view of a contiguous vector(D) array: shape ``(..., last * D)``.

    The view shares data and ``.grad`` with ``arr``. A float32 array is returned as is.
    """
    if arr.dtype == wp.float32:
        return arr
    d = _vector_length(arr.dtype)
    if d is None:
        raise TypeError(f"expected a float32 or float32-vector array, got {arr.dtype}")
    if not arr.is_contiguous:
        raise ValueError("array must be contiguous")
    shape = tuple(arr.shape[:-1]) + (arr.shape[-1] * d,)
    return _alias(arr, wp.float32, shape)


def as_float_array(x, name: str, shape: tuple, device=None, requires_grad: bool = False):
    """A float32 Warp array of ``shape`` (None entries: any size) from NumPy or Warp input.

    Accepted: NumPy (copied to ``device``); a float32 ``wp.array`` of that shape
    (used as is); a ``wp.array`` of ``vector(shape[-1])`` with the leading shape
    (reinterpreted zero-copy, sharing ``.grad``, so gradients arrive in the array
    passed).

    Raises:
        TypeError: torch tensors, wrong dtypes.
        ValueError: wrong shapes, wrong device.
    """
    if is_torch(x):
        raise TypeError(f"{name} is a torch tensor: use warpraster.torch for torch inputs")

    def _check_shape(got):
        if len(got) != len(shape) or any(
            s is not None and g != s for g, s in zip(got, shape, strict=True)
        ):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name} must have shape {want}, got {tuple(got)}")

    if isinstance(x, wp.array):
        if device is not None and wp.get_device(x.device) != wp.get_device(device):
            raise ValueError(f"{name} is on device {x.device}, expected {wp.get_device(device)}")
        if x.dtype == wp.float32:
            _check_shape(x.shape)
            return x
        d = _vector_length(x.dtype)
        if d is None:
            raise TypeError(
                f"{name} must be a float32 wp.array or a float32 vector array, got dtype "
                f"{wp.types.type_repr(x.dtype)}"
            )
        full = tuple(x.shape) + (d,)
        _check_shape(full)
        if not x.is_contiguous:
            raise ValueError(f"{name} must be contiguous")
        return _alias(x, wp.float32, full)
    try:
        a = np.asarray(x)
    except Exception:  # noqa: BLE001
        raise TypeError(f"{name} must be array-like, got {type(x).__name__}") from None
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold numbers, got dtype {a.dtype}")
    _check_shape(a.shape)
    return wp.array(
        np.ascontiguousarray(a, dtype=np.float32),
        dtype=wp.float32,
        device=device,
        requires_grad=requires_grad,
    )


def check_slot_array(x: wp.array, name: str, dtype, device, shape=None) -> wp.array:
    """``x`` when it is a ``dtype`` (N, H, W, K) ``wp.array`` (of ``shape`` when given) on
    ``device``: TypeError for another dtype or rank, ValueError for another shape or device."""
    if x.dtype != dtype or x.ndim != 4:
        raise TypeError(
            f"{name} must be a wp.array of {wp.types.type_repr(dtype)} with shape "
            f"(N, H, W, K), got dtype {wp.types.type_repr(x.dtype)} shape {x.shape}"
        )
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    if wp.get_device(x.device) != wp.get_device(device):
        raise ValueError(f"{name} is on device {x.device}, expected {device}")
    return x


def as_slot_array(x, name: str, dtype, device, shape=None) -> wp.array:
    """An (N, H, W, K) ``dtype`` (int32 or a float32 vector) Warp array of ``shape``
    (when given) on ``device``: a Warp array is checked (:func:`check_slot_array`)
    and used as it is; NumPy (vectors as a last axis) is checked and copied."""
    if is_torch(x):
        raise TypeError(f"{name} is a torch tensor: use warpraster.torch for torch inputs")
    if isinstance(x, wp.array):
        return check_slot_array(x, name, dtype, device, shape)
    a = np.asarray(x)
    tail = (dtype._length_,) if wp.types.type_is_vector(dtype) else ()
    what = "numbers" if tail else "integers"
    if a.dtype.kind not in ("fiu" if tail else "iu"):
        raise TypeError(f"{name} must hold {what}, got dtype {a.dtype}")
    want = ("N", "H", "W", "K") if shape is None else tuple(shape)
    if (
        a.ndim != 4 + len(tail)
        or a.shape[4:] != tail
        or (shape is not None and a.shape[:4] != want)
    ):
        raise ValueError(
            f"{name} must have shape ({', '.join(map(str, want + tail))}), got {a.shape}"
        )
    host = np.ascontiguousarray(a, dtype=np.float32 if tail else np.int32)
    return wp.array(host, dtype=dtype, device=device)


def as_fragment_arrays(pix_to_face, bary_coords, device=None):
    """``pix_to_face`` int32 (N, H, W, K) and ``bary_coords`` vec3 (N, H, W, K) as Warp arrays.

    NumPy ``pix_to_face`` (any integer dtype) is range-checked (>= -1) and copied;
    NumPy ``bary_coords`` must be (N, H, W, K, 3). Warp arrays are used as they
    are (``bary_coords`` must be ``vec3``: Warp arrays have at most 4 dims).
    """
    if device is None:
        for x in (pix_to_face, bary_coords):
            if isinstance(x, wp.array):
                device = x.device
                break
    if not isinstance(pix_to_face, wp.array) and not is_torch(pix_to_face):
        a = np.asarray(pix_to_face)
        if a.dtype.kind in "iu" and a.size and (a.min() < -1 or a.max() > np.iinfo(np.int32).max):
            raise ValueError("pix_to_face must hold -1 or face indices that fit in int32")
    p2f = as_slot_array(pix_to_face, "pix_to_face", wp.int32, device)
    bary = as_slot_array(bary_coords, "bary_coords", wp.vec3, device)
    if tuple(bary.shape) != tuple(p2f.shape):
        raise ValueError(
            f"bary_coords has shape {tuple(bary.shape)}, pix_to_face has shape {tuple(p2f.shape)}"
        )
    return p2f, bary


def _check_out(out, name: str, shape: tuple[int, ...], d: int, device) -> wp.array:
    """Checks a caller's output array: contiguous (N, H, W, K) of vector(d, float32)."""
    if not isinstance(out, wp.array):
        raise TypeError(f"{name} must be a wp.array, got {type(out).__name__}")
    if _vector_length(out.dtype) != d or tuple(out.shape) != shape:
        raise ValueError(
            f"{name} must be a wp.array of vector({d}, float32) with shape {shape}, got dtype "
            f"{wp.types.type_repr(out.dtype)} shape {tuple(out.shape)}"
        )
    if wp.get_device(out.device) != wp.get_device(device):
        raise ValueError(f"{name} is on device {out.device}, expected {device}")
    if not out.is_contiguous:
        raise ValueError(f"{name} must be contiguous")
    return out


def check_pix_to_face(p2f: wp.array, num_faces: int, name: str, host=None) -> None:
    """Raises ValueError unless every face index of the fragments ``p2f`` is below
    ``num_faces`` (the rows of ``name``): read from ``host``, the caller's NumPy
    ``pix_to_face``, when given, else back from ``p2f`` (a host read: only where the
    caller asked for ``validate``)."""
    if host is None or isinstance(host, wp.array):
        host = p2f.numpy()
    mx = int(np.asarray(host).max(initial=-1))
    if mx >= num_faces:
        raise ValueError(f"pix_to_face holds face {mx}, but {name} has {num_faces} faces")


def check_face_range(faces: wp.array, n_rows: int, name: str, rows: str):
    """Raises ValueError unless every index of ``faces`` is in [0, n_rows) (reads it back)."""
    fa = faces.numpy()
    if fa.size and (fa.min() < 0 or fa.max() >= n_rows):
        raise ValueError(
            f"{name} has indices in [{int(fa.min())}, {int(fa.max())}], outside "
            f"[0, {n_rows - 1}] for {n_rows} {rows}"
        )


# ----------------------------------------------------------------------------- kernel
@wp.struct
class SlotAttributes:
    """The attribute an interpolation reads, ``dim`` float32 channels: per face corner
    (``per_corner`` = 1: ``face_attributes`` (F, 3, dim)) or per vertex through
    ``faces`` (``per_corner`` = 0: ``vert_attributes`` (V, dim), ``faces`` (F, 3))."""

    per_corner: int
    face_attributes: wp.array3d(dtype=wp.float32)
    vert_attributes: wp.array2d(dtype=wp.float32)
    faces: wp.array2d(dtype=wp.int32)
    dim: int


@wp.func
def slot_channel(j: int, channels: int):
    """(slot k, channel c) of the thread index ``j = k * channels + c`` of the per-slot,
    per-channel kernels."""
    k = j // channels
    return k, j - k * channels


@wp.struct
class ScreenFaces:
    """The projected faces the screen-space derivatives come from, read only
    ``with_derivatives``: ``verts_ndc`` (V', 3) indexed by ``ndc_faces`` (F, 3), and
    the rasterizer's ``perspective_correct`` setting."""

    with_derivatives: int
    verts_ndc: wp.array(dtype=wp.vec3)
    ndc_faces: wp.array2d(dtype=wp.int32)
    perspective_correct: int


@wp.func
def bary_derivatives(p: wp.vec2, v0: wp.vec3, v1: wp.vec3, v2: wp.vec3, perspective_correct: int):
    """(d bary / d X_ndc, d bary / d Y_ndc) of the face (v0, v1, v2) at NDC point ``p``.

    Each a vec3 over the three barycentrics. Uses the same
    screen barycentrics (area offset by EPS) and, when ``perspective_correct`` is set,
    the same perspective correction (w_i = s_i z_j z_k, denominator clamped to
    EPS) as the rasterizer, unclipped.
    """
    area = (v2[0] - v0[0]) * (v1[1] - v0[1]) - (v2[1] - v0[1]) * (v1[0] - v0[0]) + EPS
    dsx = wp.vec3(v2[1] - v1[1], v0[1] - v2[1], v1[1] - v0[1]) / area
    dsy = wp.vec3(v1[0] - v2[0], v2[0] - v0[0], v0[0] - v1[0]) / area
    if perspective_correct != 0:
        s = barycentric(p, wp.vec2(v0[0], v0[1]), wp.vec2(v1[0], v1[1]), wp.vec2(v2[0], v2[1]))
        zz = wp.vec3(v1[2] * v2[2], v0[2] * v2[2], v0[2] * v1[2])
        w = wp.cw_mul(s, zz)
        wsum = w[0] + w[1] + w[2]
        denom = wp.max(wsum, EPS)
        b = w / denom
        dwx = wp.cw_mul(dsx, zz)
        dwy = wp.cw_mul(dsy, zz)
        dx = wp.vec3(0.0)
        dy = wp.vec3(0.0)
        if wsum > EPS:
            dx = (dwx - b * (dwx[0] + dwx[1] + dwx[2])) / denom
            dy = (dwy - b * (dwy[0] + dwy[1] + dwy[2])) / denom
        else:
            dx = dwx / denom
            dy = dwy / denom
        return dx, dy
    return dsx, dsy


@wp.struct
class InterpolatedSlots:
    """Where an interpolation writes, (N, H, W, K * dim) float32 views of
    ``vector(dim)`` arrays: the ``values`` and, written only ``with_derivatives``, their
    screen-space derivatives ``ddx``, ``ddy``."""

    values: wp.array4d(dtype=wp.float32)
    ddx: wp.array4d(dtype=wp.float32)
    ddy: wp.array4d(dtype=wp.float32)


@wp.kernel
def _interpolate(
    # In: the fragments (pix_to_face, bary_coords), the attribute, the projected faces
    frag: PixelFragments,
    attrs: SlotAttributes,
    screen: ScreenFaces,
    # Out:
    slots_out: InterpolatedSlots,
):
    n, yi, xi, j = wp.tid()
    k, c = slot_channel(j, attrs.dim)
    f = frag.pix_to_face[n, yi, xi, k]
    if f < 0:
        slots_out.values[n, yi, xi, j] = 0.0
        if screen.with_derivatives != 0:
            slots_out.ddx[n, yi, xi, j] = 0.0
            slots_out.ddy[n, yi, xi, j] = 0.0
        return
    a0 = float(0.0)
    a1 = float(0.0)
    a2 = float(0.0)
    if attrs.per_corner != 0:
        a0 = attrs.face_attributes[f, 0, c]
        a1 = attrs.face_attributes[f, 1, c]
        a2 = attrs.face_attributes[f, 2, c]
    else:
        a0 = attrs.vert_attributes[attrs.faces[f, 0], c]
        a1 = attrs.vert_attributes[attrs.faces[f, 1], c]
        a2 = attrs.vert_attributes[attrs.faces[f, 2], c]
    b = frag.bary_coords[n, yi, xi, k]
    slots_out.values[n, yi, xi, j] = b[0] * a0 + b[1] * a1 + b[2] * a2
    if screen.with_derivatives != 0:
        height = frag.pix_to_face.shape[1]
        width = frag.pix_to_face.shape[2]
        p = pixel_centre(yi, xi, height, width)
        dbx, dby = bary_derivatives(
            p,
            screen.verts_ndc[screen.ndc_faces[f, 0]],
            screen.verts_ndc[screen.ndc_faces[f, 1]],
            screen.verts_ndc[screen.ndc_faces[f, 2]],
            screen.perspective_correct,
        )
        # One pixel step is 2 / min(H, W) NDC units; columns run to -X, rows to -Y.
        step = -2.0 / float(wp.min(height, width))
        slots_out.ddx[n, yi, xi, j] = step * (dbx[0] * a0 + dbx[1] * a1 + dbx[2] * a2)
        slots_out.ddy[n, yi, xi, j] = step * (dby[0] * a0 + dby[1] * a1 + dby[2] * a2)


def _launch(
    p2f, bary, face_attrs, vert_attrs, faces, d, verts_ndc, ndc_faces, persp, outs, adjoint=False
):
    """The interpolation kernel over these arrays (None: the other attribute form, no
    derivatives); with ``adjoint``, Warp's adjoint of it alone, the arrays then
    carrying the gradient buffers (see :mod:`~warpraster.shading.adjoint_args`)."""
    n, h, w, k = p2f.shape
    device = p2f.device
    # arrays left None (the other attribute form, no derivatives) become placeholders
    attrs = new_struct(SlotAttributes, device, face_attributes=face_attrs,
                       vert_attributes=vert_attrs, faces=faces,
                       per_corner=1 if face_attrs is not None else 0, dim=d)  # fmt: skip
    screen = new_struct(ScreenFaces, device, verts_ndc=verts_ndc, ndc_faces=ndc_faces,
                        perspective_correct=int(bool(persp)),
                        with_derivatives=1 if verts_ndc is not None else 0)  # fmt: skip
    frag = new_struct(PixelFragments, device, pix_to_face=p2f, bary_coords=bary)
    values, ddx, ddy = (float_view(o) if o is not None else None for o in outs)
    slots = new_struct(InterpolatedSlots, device, values=values, ddx=ddx, ddy=ddy)
    dim = (n, h, w, k * d)
    if not adjoint:
        wp.launch(_interpolate, dim=dim, inputs=[frag, attrs, screen], outputs=[slots],
                  device=device)  # fmt: skip
        return
    adj_in = [no_adjoint(PixelFragments), no_adjoint(SlotAttributes), no_adjoint(ScreenFaces)]
    wp.launch(_interpolate, dim=dim, inputs=[frag, attrs, screen], outputs=[slots],
              adj_inputs=adj_in, adj_outputs=[no_adjoint(InterpolatedSlots)], adjoint=True,
              device=device)  # fmt: skip


def alloc_vector_out(out, name, shape, d, device, requires_grad):
    """``out`` checked, or a new zeroed (N, H, W, K) ``vector(d)`` array."""
    if out is not None:
        return _check_out(out, name, shape, d, device)
    return wp.zeros(shape, dtype=vector_type(d), device=device, requires_grad=requires_grad)


# ----------------------------------------------------------------------------- public
def interpolate_face_attributes(
    pix_to_face,
    bary_coords,
    face_attributes,
    *,
    out: wp.array | None = None,
    validate: bool = True,
) -> wp.array:
    """Interpolates per-face-vertex attributes at each fragment, as PyTorch3D.

    ``out[n, y, x, k] = sum_i bary[n, y, x, k][i] * face_attributes[f, i]`` with
    ``f = pix_to_face[n, y, x, k]``; zeros where ``f < 0``.

    Args:
        pix_to_face: (N, H, W, K) face of each slot, -1 empty: an int32 ``wp.array``
            (e.g. ``Fragments.pix_to_face``) or NumPy (any int dtype; checked >= -1).
        bary_coords: (N, H, W, K) ``wp.vec3`` array (``Fragments.bary_coords``) or
            NumPy (N, H, W, K, 3).
        face_attributes: (F, 3, D) float32 ``wp.array``, a ``vector(D)`` ``wp.array``
            of shape (F, 3), or NumPy (F, 3, D). Face indices in ``pix_to_face``
            must be < F.
        out: optional preallocated result, (N, H, W, K) of ``vector(D, float32)``
            (contiguous); with it (and ``validate=False``) the call allocates
            nothing and reads nothing back (graph-capturable).
        validate: check that a Warp ``pix_to_face`` indexes ``face_attributes``
            (a read of ``pix_to_face`` back to the host; NumPy input is always
            checked).

    Returns:
        ``wp.array`` (N, H, W, K) of ``vector(D, float32)`` (``.numpy()`` gives
        (N, H, W, K, D)); ``requires_grad`` when an input requires gradients.
        Recorded on a ``wp.Tape``, gradients flow to ``face_attributes`` and to
        ``bary_coords``.

    Raises:
        TypeError, ValueError: bad input, named by argument, before any kernel runs.
    """
    p2f, bary = as_fragment_arrays(pix_to_face, bary_coords)
    device = p2f.device
    fa = as_float_array(face_attributes, "face_attributes", (None, 3, None), device)
    d = fa.shape[2]
    if d < 1:
        raise ValueError("face_attributes must have D >= 1 channels")
    if validate or not isinstance(pix_to_face, wp.array):
        check_pix_to_face(p2f, fa.shape[0], "face_attributes", pix_to_face)
    shape = tuple(p2f.shape)
    rg = bool(fa.requires_grad or bary.requires_grad)
    values = alloc_vector_out(out, "out", shape, d, device, rg)
    _launch(p2f, bary, fa, None, None, d, None, None, False, [values, None, None])
    return values


def interpolate_vertex_attributes(
    pix_to_face,
    bary_coords,
    attributes,
    faces,
    *,
    verts_ndc=None,
    ndc_faces=None,
    perspective_correct: bool = True,
    out: wp.array | None = None,
    out_dx: wp.array | None = None,
    out_dy: wp.array | None = None,
    validate: bool = True,
) -> wp.array | tuple[wp.array, wp.array, wp.array]:
    """Interpolates per-vertex attributes at each fragment (nvdiffrast's ``interpolate``).

    Value: ``sum_i bary[i] * attributes[faces[f, i]]`` with ``f = pix_to_face``;
    zeros in empty slots. With ``verts_ndc``, also the analytic screen-space
    derivatives of that value, per pixel: ``d/dx`` along columns to the right,
    ``d/dy`` along rows downwards (``= -(2 / min(H, W))`` times the derivative
    w.r.t. PyTorch3D's NDC X resp. Y, which point left and up). They are the
    derivatives of the face's unclipped barycentrics (perspective-correct when
    ``perspective_correct``), constant over a face without perspective.

    Args:
        pix_to_face, bary_coords: the fragments (see :func:`interpolate_face_attributes`).
        attributes: (V, D) float32 ``wp.array``, (V,) ``vector(D)`` ``wp.array`` or NumPy.
        faces: (F, 3) int32 indices into ``attributes`` (``wp.array`` int32 or vec3i, NumPy).
            For UVs with their own topology this is ``faces_uvs``.
        verts_ndc: (V', 3) projected vertices the fragments were rasterized from
            (``MeshRasterizer.transform``; x, y NDC, z depth): enables derivatives.
        ndc_faces: (F, 3) indices into ``verts_ndc`` (default: ``faces``).
        perspective_correct: the rasterizer's setting (derivatives only).
        out, out_dx, out_dy: optional preallocated (N, H, W, K) ``vector(D)`` outputs;
            with them (and ``validate=False``) the call allocates nothing and reads
            nothing back (graph-capturable).
        validate: check the face indices on the host (a device read): those of
            ``faces`` (and ``ndc_faces``) and that ``pix_to_face`` indexes ``faces``.

    Returns:
        ``values`` when ``verts_ndc`` is None, else ``(values, d_dx, d_dy)``; each a
        ``wp.array`` (N, H, W, K) of ``vector(D, float32)``. On a ``wp.Tape``
        gradients flow to ``attributes``, ``bary_coords`` and ``verts_ndc``.

    Raises:
        TypeError, ValueError: bad input, named by argument, before any kernel runs.
    """
    p2f, bary = as_fragment_arrays(pix_to_face, bary_coords)
    device = p2f.device
    attrs = as_float_array(attributes, "attributes", (None, None), device)
    d = attrs.shape[1]
    if d < 1:
        raise ValueError("attributes must have D >= 1 channels")
    fcs = as_faces_array(faces, "faces", device)
    vn = None
    nf = None
    if verts_ndc is not None:
        vn = as_vec3_array(verts_ndc, "verts_ndc", device)
        nf = fcs if ndc_faces is None else as_faces_array(ndc_faces, "ndc_faces", device)
        if nf.shape[0] != fcs.shape[0]:
            raise ValueError(f"ndc_faces has {nf.shape[0]} faces, faces has {fcs.shape[0]}")
    elif ndc_faces is not None:
        raise ValueError("ndc_faces is only used with verts_ndc")
    if validate or not isinstance(pix_to_face, wp.array):
        check_pix_to_face(p2f, fcs.shape[0], "faces", pix_to_face)
    if validate:
        check_face_range(fcs, attrs.shape[0], "faces", "attribute rows")
        if vn is not None:
            check_face_range(nf, vn.shape[0], "ndc_faces", "vertices in verts_ndc")
    shape = tuple(p2f.shape)
    rg = bool(attrs.requires_grad or bary.requires_grad or (vn is not None and vn.requires_grad))
    values = alloc_vector_out(out, "out", shape, d, device, rg)
    if vn is None:
        _launch(p2f, bary, None, attrs, fcs, d, None, None, False, [values, None, None])
        return values
    ddx = alloc_vector_out(out_dx, "out_dx", shape, d, device, rg)
    ddy = alloc_vector_out(out_dy, "out_dy", shape, d, device, rg)
    _launch(p2f, bary, None, attrs, fcs, d, vn, nf, perspective_correct, [values, ddx, ddy])
    return values, ddx, ddy


# ----------------------------------------------------------------------------- adjoints
def interpolate_face_attributes_adjoint(
    pix_to_face: wp.array,
    bary_coords: wp.array,
    face_attributes: wp.array,
    values_grad: wp.array,
    *,
    bary_coords_grad: wp.array | None = None,
    face_attributes_grad: wp.array | None = None,
) -> None:
    """The adjoint of :func:`interpolate_face_attributes` alone: adds the gradients of
    its inputs for the gradient ``values_grad`` of its result (the forward is not run:
    the interpolation is linear, its inputs are all the adjoint reads).

    The same launch as a ``wp.Tape``'s replay of the call (the same bits), without the
    forward before it; the gradient buffers are arguments (the arrays' own ``.grad``
    are not touched): nothing is checked, no device memory is allocated and
    ``values_grad`` is only read (graph-capturable).

    Args:
        pix_to_face: (N, H, W, K) int32, the forward's.
        bary_coords: (N, H, W, K) ``vec3``, the forward's.
        face_attributes: (F, 3, D) float32, the forward's.
        values_grad: (N, H, W, K) ``vector(D)`` gradient of the result (contiguous).
        bary_coords_grad: (N, H, W, K) ``vec3`` added to (None: not computed).
        face_attributes_grad: (F, 3, D) float32 added to (None: not computed).
    """
    _launch(pix_to_face, grad_view(bary_coords, bary_coords_grad),
            grad_view(face_attributes, face_attributes_grad), None, None,
            face_attributes.shape[2], None, None, False, [upstream_view(values_grad), None, None],
            adjoint=True)  # fmt: skip


def interpolate_vertex_attributes_adjoint(
    pix_to_face: wp.array,
    bary_coords: wp.array,
    attributes: wp.array,
    faces: wp.array,
    values_grad: wp.array,
    *,
    verts_ndc: wp.array | None = None,
    ndc_faces: wp.array | None = None,
    perspective_correct: bool = True,
    dx_grad: wp.array | None = None,
    dy_grad: wp.array | None = None,
    bary_coords_grad: wp.array | None = None,
    attributes_grad: wp.array | None = None,
    verts_ndc_grad: wp.array | None = None,
) -> None:
    """The adjoint of :func:`interpolate_vertex_attributes` alone: adds the gradients
    of its inputs for the gradients of its results (the forward is not run: its
    inputs are all the adjoint reads).

    The same launch as a ``wp.Tape``'s replay of the call (the same bits), without the
    forward; the gradient buffers are arguments (the arrays' own ``.grad`` are not
    touched): nothing is checked, no device memory is allocated and the result
    gradients are only read (graph-capturable).

    Args:
        pix_to_face, bary_coords: the forward's fragments ((N, H, W, K) int32, ``vec3``).
        attributes: (V, D) float32, the forward's.
        faces: (F, 3) int32, the forward's.
        values_grad: (N, H, W, K) ``vector(D)`` gradient of ``values`` (contiguous).
        verts_ndc, ndc_faces, perspective_correct: the forward's (``vec3``, int32
            (F, 3), default ``faces``); with ``verts_ndc``, ``dx_grad`` and
            ``dy_grad`` (as ``values_grad``) are the derivatives' gradients.
        bary_coords_grad: (N, H, W, K) ``vec3`` added to (None: not computed).
        attributes_grad: (V, D) float32 added to (None: not computed).
        verts_ndc_grad: (V', 3) ``vec3`` added to (None: not computed).
    """
    d = attributes.shape[1]
    if verts_ndc is not None:
        if dx_grad is None or dy_grad is None:
            raise ValueError("dx_grad and dy_grad are needed with verts_ndc")
        ndc_faces = faces if ndc_faces is None else ndc_faces
    outs = [upstream_view(values_grad), None, None]
    if verts_ndc is not None:
        outs[1:] = upstream_view(dx_grad), upstream_view(dy_grad)
        verts_ndc = grad_view(verts_ndc, verts_ndc_grad)
    _launch(pix_to_face, grad_view(bary_coords, bary_coords_grad), None,
            grad_view(attributes, attributes_grad), faces, d, verts_ndc, ndc_faces,
            perspective_correct, outs, adjoint=True)  # fmt: skip
