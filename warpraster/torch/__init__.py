"""PyTorch adapter: the rasterizer as a differentiable torch op, zero-copy.

``import warpraster.torch`` (explicitly: ``import warpraster`` never imports torch)
gives :func:`rasterize_meshes`, PyTorch3D's ``rasterize_meshes`` on packed tensors,
and :func:`rasterize_mesh_list` for lists of per-mesh tensors.

How it works:

* The Warp call is a ``torch.library.custom_op`` (``warpraster::rasterize_meshes``)
  with a fake implementation (output shapes from N, image size and K), so
  ``torch.compile(fullgraph=True)`` treats it as one opaque node.
* Its backward is a second custom op (``warpraster::rasterize_meshes_backward``)
  that runs the hand-written adjoint (:func:`warpraster.backward.grads_from_pix_to_face`)
  from the saved ``pix_to_face`` and the upstream gradients (zero at
  ``pix_to_face == -1``) and returns the vertex gradient.
  Nothing Warp-side (no tape) lives in the autograd graph. With ``z_clip_value``
  or ``cull_to_frustum`` the whole clipped forward is replayed under the tape
  instead, because its ``zbuf``/``dists`` belong to clipped sub-triangles.
* Tensors cross with ``wp.from_torch`` / ``wp.to_torch`` on torch's current CUDA
  stream: float32 contiguous vertices, int32 faces and the float outputs are
  shared, not copied (see ``docs/torch.md`` for the full list).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import torch
import warp as wp

from ..backward import grads_from_pix_to_face
from ..fragments import Fragments
from ..meshes import pack_meshes
from ..raster import rasterize_clipped, rasterize_packed
from ..rasterize import RENDER_OPTIONS, settings_from_options, takes_render_options
from ..rasterize import rasterize_meshes as _rasterize_meshes_wp
from ..settings import RasterSettings
from . import ops, shading
from .antialias import antialias
from .checks import (
    check_index_range,
    check_packed,
    check_packed_values,
    float_tensor,
    int_tensor,
    same_device,
    to_int32,
)
from .context import RasterContext, default_context
from .eager import eager_path
from .ops import (
    face_normals,
    interpolate_face_attributes,
    interpolate_vertex_attributes,
    sample_textures_uv,
    vertex_normals,
)
from .shading import (  # noqa: F401 (re-exported: shading.__all__, below)
    AmbientLights,
    BlendParams,
    DirectionalLights,
    FoVOrthographicCameras,
    FoVPerspectiveCameras,
    HardFlatShader,
    HardGouraudShader,
    HardPhongShader,
    Materials,
    MeshRasterizer,
    MeshRenderer,
    MeshRendererWithFragments,
    PerspectiveCameras,
    PointLights,
    RasterizationSettings,
    SoftGouraudShader,
    SoftPhongShader,
    SoftSilhouetteShader,
    TexturesUV,
    TexturesUVMipmap,
    TexturesVertex,
    camera_position_from_spherical_angles,
    look_at_rotation,
    look_at_view_transform,
)
from .stage import render_stage, stage_parameters
from .streams import _TorchStream

__all__ = [
    "RasterContext",
    "antialias",
    "render_stage",
    "stage_parameters",
    "default_context",
    "face_normals",
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "ops",
    "rasterize_mesh_list",
    "rasterize_meshes",
    "sample_textures_uv",
    "shading",
    "vertex_normals",
]
# The PyTorch3D-shaped rendering names, imported above, so that PyTorch3D code runs
# with ``from pytorch3d.renderer import X`` changed to ``from warpraster.torch import X``
# (not the renderer's Fragments: this module's Fragments is the rasterizer's).
__all__ += shading.__all__
__all__.remove("Fragments")

_NONE = -1  # bin_size / max_faces_per_bin = None in the op schema (ints only)


# ----------------------------------------------------------------------------- helpers
# The user's names of the packed arguments (error messages).
_NAMES = ("verts_packed", "faces_packed", "mesh_to_face_first_idx", "num_faces_per_mesh",
          "clipped_faces_neighbor_idx")  # fmt: skip


def _warp_inputs(verts, faces, first, count, neighbor, *, grad=None):
    """Warp views of the op's tensors (verts shared; its ``.grad`` is ``grad`` if given).

    The forward (``grad`` None) checks the index values first (a host read, also in
    a compiled graph: the op body runs eagerly), before any int32 cast could wrap them.
    """
    if grad is None:
        check_packed_values(verts.shape[0], faces, first, count, neighbor, names=_NAMES)
        v = wp.from_torch(verts, dtype=wp.vec3, requires_grad=False)
    else:
        v = wp.from_torch(verts, dtype=wp.vec3, requires_grad=True, grad=grad)
    f = to_int32(faces)
    if f.shape[0] == 0:
        f_wp = wp.empty((0, 3), dtype=wp.int32, device=v.device)
    else:
        f_wp = wp.from_torch(f, dtype=wp.int32)
    idx = [
        wp.from_torch(to_int32(first), dtype=wp.int32),
        wp.from_torch(to_int32(count), dtype=wp.int32),
    ]
    if neighbor is None or neighbor.shape[0] == 0:
        idx.append(None)
    else:
        idx.append(wp.from_torch(to_int32(neighbor)))
    return v, f_wp, *idx


# The op schemas take scalars only: the settings cross as these, in this order, with
# these schema types (both ops end with them).
_SETTINGS = (
    ("height", "SymInt"),
    ("width", "SymInt"),
    ("blur_radius", "float"),
    ("faces_per_pixel", "SymInt"),
    ("bin_size", "SymInt"),
    ("max_faces_per_bin", "SymInt"),
    ("perspective_correct", "bool"),
    ("clip_barycentric_coords", "bool"),
    ("cull_backfaces", "bool"),
    ("z_clip_value", "float?"),
    ("cull_to_frustum", "bool"),
    ("exact_perspective_grad", "bool"),
)
_SETTING_NAMES = tuple(name for name, _ in _SETTINGS)
# The keyword options of rasterize_meshes: all but ``deterministic`` (not in the schema).
_RENDER_OPTIONS = tuple(name for name in RENDER_OPTIONS if name != "deterministic")
# The packed meshes and the context handle, the arguments before the settings.
_MESH_ARGS = (
    "Tensor verts, Tensor faces, Tensor mesh_to_face_first_idx, Tensor num_faces_per_mesh, "
    "Tensor? clipped_faces_neighbor_idx, str? context"
)


def _schema(leading: str, returns: str) -> str:
    """An op schema: ``leading`` arguments, the mesh arguments, then the settings,
    returning ``returns``."""
    settings = ", ".join(f"{kind} {name}" for name, kind in _SETTINGS)
    return f"({leading}{_MESH_ARGS}, {settings}) -> {returns}"


def _split_args(args: tuple) -> tuple[tuple, str | None, RasterSettings]:
    """An op's arguments after its leading ones (``_MESH_ARGS``, then the settings):
    (verts, faces, mesh_to_face_first_idx, num_faces_per_mesh,
    clipped_faces_neighbor_idx), the context handle, the settings."""
    return tuple(args[:5]), args[5], _unflatten(args[6:])


def _new_outputs(verts: torch.Tensor, shape: tuple) -> tuple[torch.Tensor, ...]:
    """Fresh (pix_to_face int32, zbuf, bary_coords (..., 3), dists) of ``shape`` (N, H, W, K)."""
    return (
        verts.new_empty(shape, dtype=torch.int32),
        verts.new_empty(shape),
        verts.new_empty((*shape, 3)),
        verts.new_empty(shape),
    )


def _flatten(settings: RasterSettings) -> tuple:
    """RasterSettings -> the op's scalar arguments (None bins as ``_NONE``)."""
    h, w = settings.image_size
    none = _NONE
    return (
        h, w, settings.blur_radius, settings.faces_per_pixel,
        none if settings.bin_size is None else settings.bin_size,
        none if settings.max_faces_per_bin is None else settings.max_faces_per_bin,
        settings.perspective_correct, settings.clip_barycentric_coords, settings.cull_backfaces,
        settings.z_clip_value, settings.cull_to_frustum, settings.exact_perspective_grad,
    )  # fmt: skip


def _unflatten(args: tuple) -> RasterSettings:
    """The op's scalar arguments -> RasterSettings (the inverse of :func:`_flatten`)."""
    named = dict(zip(_SETTING_NAMES, args, strict=True))
    named["image_size"] = (named.pop("height"), named.pop("width"))
    for name in ("bin_size", "max_faces_per_bin"):
        if named[name] == _NONE:
            named[name] = None
    return RasterSettings(**named)


def _stream_key(device: torch.device):
    """Who may share a workspace: calls from one host thread on one stream (calls
    from two threads interleave their launches even on one stream)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    return (stream, threading.get_ident())


def _context(name: str | None) -> RasterContext:
    """The context a handle names; the default one if none is named, or if the
    caller dropped theirs (contexts hold scratch only, nothing a call returns)."""
    ctx = None if name is None else _CONTEXTS.get(name)
    return default_context() if ctx is None else ctx


_CONTEXTS: weakref.WeakValueDictionary[str, RasterContext] = weakref.WeakValueDictionary()


def _register_context(context: RasterContext | None) -> str | None:
    """A string handle for the op schema (which cannot carry Python objects)."""
    if context is None:
        return None
    if not isinstance(context, RasterContext):
        raise TypeError(f"context must be a RasterContext, got {type(context).__name__}")
    handle = f"ctx{id(context)}"
    _CONTEXTS[handle] = context
    return handle


# ----------------------------------------------------------------------------- forward op
def _rasterize_impl(*args: torch.Tensor | str | float | None) -> tuple[torch.Tensor, ...]:
    """(pix_to_face int32, zbuf, bary (N,H,W,K,3), dists), written by Warp into new tensors
    with the context's workspace as scratch. ``args``: the packed mesh tensors, the
    context handle and the flat settings (the schema's ``_MESH_ARGS``, ``_SETTINGS``)."""
    mesh, context, settings = _split_args(args)
    verts = mesh[0]
    device = verts.device
    n = mesh[2].shape[0]
    with _TorchStream(device):
        v, f, first, count, nb = _warp_inputs(*mesh)
        meshes = pack_meshes(v, f, first, count, nb, validate=False)  # checked above
        ws = _context(context).workspace(
            v.device, _stream_key(device), num_verts=v.shape[0], num_faces=f.shape[0],
            num_meshes=n, settings=settings,
        )  # fmt: skip
        if settings.clipped:
            frags = rasterize_clipped(meshes, settings, ws)
            # the clipped workspace keeps its own outputs: hand out copies
            return tuple(wp.to_torch(a, requires_grad=False).clone() for a in (
                frags.pix_to_face, frags.zbuf, frags.bary_coords, frags.dists))  # fmt: skip
        out = _new_outputs(verts, (n, *settings.image_size, settings.faces_per_pixel))
        frags = Fragments(
            pix_to_face=wp.from_torch(out[0], dtype=wp.int32),
            zbuf=wp.from_torch(out[1], dtype=wp.float32),
            bary_coords=wp.from_torch(out[2], dtype=wp.vec3),
            dists=wp.from_torch(out[3], dtype=wp.float32),
        )
        rasterize_packed(meshes, ws, settings, out=frags)
        return out


_rasterize_op = torch.library.custom_op(
    "warpraster::rasterize_meshes",
    mutates_args=(),
    schema=_schema("", "(Tensor, Tensor, Tensor, Tensor)"),
)(_rasterize_impl)


@_rasterize_op.register_fake
def _rasterize_fake(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh,
                    clipped_faces_neighbor_idx, context, height, width, blur_radius,
                    faces_per_pixel, *rest):  # fmt: skip
    return _new_outputs(verts, (mesh_to_face_first_idx.shape[0], height, width, faces_per_pixel))


# ----------------------------------------------------------------------------- backward op
@torch.library.custom_op(
    "warpraster::rasterize_meshes_backward",
    mutates_args=(),
    schema=_schema("Tensor grad_zbuf, Tensor grad_bary, Tensor grad_dists, Tensor pix_to_face, ",
                   "Tensor"),
)  # fmt: skip
def _rasterize_backward_op(
    grad_zbuf: torch.Tensor,
    grad_bary: torch.Tensor,
    grad_dists: torch.Tensor,
    pix_to_face: torch.Tensor,
    *args: torch.Tensor | str | float | None,
) -> torch.Tensor:
    """d loss / d verts (V, 3) float32 from the upstream gradients of zbuf, bary, dists.

    The upstream gradients must be contiguous float32 tensors of the fragments'
    shapes, zero in empty slots; they are read, not modified. ``args`` as for
    :func:`_rasterize_op`.
    """
    mesh, context, settings = _split_args(args)
    verts = mesh[0]
    shape = tuple(pix_to_face.shape)
    for name, g, want in (
        ("grad_zbuf", grad_zbuf, shape),
        ("grad_bary", grad_bary, (*shape, 3)),
        ("grad_dists", grad_dists, shape),
    ):
        # The kernels index by pix_to_face's shape: a mismatch would write out of bounds.
        if tuple(g.shape) != want or g.dtype != torch.float32 or not g.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous float32 tensor of shape {want}, "
                f"got {g.dtype} {tuple(g.shape)}"
            )
    grad_verts = torch.zeros_like(verts)
    device = verts.device
    with _TorchStream(device):
        v, f, first, count, nb = _warp_inputs(*mesh, grad=grad_verts)
        gz = wp.from_torch(grad_zbuf, dtype=wp.float32, requires_grad=False)
        gb = wp.from_torch(grad_bary, dtype=wp.vec3, requires_grad=False)
        gd = wp.from_torch(grad_dists, dtype=wp.float32, requires_grad=False)
        if not settings.clipped:
            # The hand-written backward from the forward's choice of faces, with the
            # context's per-face scratch.
            if f.shape[0] > 0:
                buffers = _context(context).backward_buffers(v.device, _stream_key(device),
                                                             f.shape[0])  # fmt: skip
                grads_from_pix_to_face(
                    v, f, wp.from_torch(pix_to_face, dtype=wp.int32), gz, gb, gd, v.grad,
                    perspective_correct=settings.perspective_correct,
                    clip_barycentric_coords=settings.clip_barycentric_coords,
                    exact_perspective_grad=settings.exact_perspective_grad, buffers=buffers,
                )  # fmt: skip
        else:
            # Clipped path: replay the whole forward on the tape (its zbuf / dists
            # belong to the clipped sub-triangles), into a workspace of its own.
            tape = wp.Tape()
            with tape:
                out = _rasterize_meshes_wp(v, f, first, count, clipped_faces_neighbor_idx=nb,
                                           validate=False, settings=settings)  # fmt: skip
            tape.backward(grads={out.zbuf: gz, out.bary_coords: gb, out.dists: gd})
        # (no tape.reset(): it would zero grad_verts too; the tape is dropped here)
    return grad_verts


@_rasterize_backward_op.register_fake
def _rasterize_backward_fake(grad_zbuf, grad_bary, grad_dists, pix_to_face, verts, *args):
    return torch.empty_like(verts)


# ----------------------------------------------------------------------------- autograd
def _setup_context(ctx, inputs, output):
    verts, faces, first, count, neighbor, *settings = inputs
    ctx.settings = tuple(settings)
    ctx.save_for_backward(output[0], verts, faces, first, count, neighbor)


def _backward(ctx, grad_pix_to_face, grad_zbuf, grad_bary, grad_dists):
    pix_to_face, verts, faces, first, count, neighbor = ctx.saved_tensors
    valid = pix_to_face >= 0
    shape = pix_to_face.shape

    def masked(g, mask, full_shape):
        # Contiguous (Warp views it in place), 0 in empty slots: those outputs are
        # constants and must not pass gradient on.
        if g is None:
            return verts.new_zeros(full_shape)
        return torch.where(mask, g, 0.0).contiguous()

    grad_verts = _rasterize_backward_op(
        masked(grad_zbuf, valid, shape),
        masked(grad_bary, valid.unsqueeze(-1), (*shape, 3)),
        masked(grad_dists, valid, shape),
        pix_to_face,
        verts,
        faces,
        first,
        count,
        neighbor,
        *ctx.settings,
    )
    return (grad_verts,) + (None,) * (5 + len(_SETTING_NAMES))


#: the op, eagerly without the dispatcher's layers (:mod:`warpraster.torch.eager`)
_rasterize = eager_path(_rasterize_op, _rasterize_impl, _setup_context, _backward,
                        non_differentiable=(0,))  # fmt: skip


def _refuse_functorch(*_args):
    raise RuntimeError(
        "warpraster.torch.rasterize_meshes does not support torch.func transforms "
        "(grad, vmap, jacrev, jacfwd, ...): batch meshes by packing them (one call renders N "
        "images) and use torch.autograd (loss.backward() / torch.autograd.grad) for gradients"
    )


# vmap (and so jacrev/jacfwd) reaches the op's vmap rule; torch.func.grad is
# caught in rasterize_meshes, where the tensors arrive functorch-wrapped.
torch.library.register_vmap("warpraster::rasterize_meshes", _refuse_functorch)
torch.library.register_vmap("warpraster::rasterize_meshes_backward", _refuse_functorch)


# ----------------------------------------------------------------------------- validation
def _check_functorch(*tensors) -> None:
    if torch.compiler.is_compiling():
        return
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    if wrapped is not None and any(t is not None and wrapped(t) for t in tensors):
        _refuse_functorch()


def _to_kernel_float(verts: torch.Tensor) -> torch.Tensor:
    """float32 contiguous (V, 3): the tensor itself when it already is (zero-copy)."""
    return verts.to(torch.float32).contiguous()


# ----------------------------------------------------------------------------- public API
@takes_render_options(_RENDER_OPTIONS)
def rasterize_meshes(
    verts_packed: torch.Tensor,
    faces_packed: torch.Tensor,
    mesh_to_face_first_idx: torch.Tensor | Sequence[int],
    num_faces_per_mesh: torch.Tensor | Sequence[int],
    *,
    clipped_faces_neighbor_idx: torch.Tensor | None = None,
    context: RasterContext | None = None,
    **options,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rasterizes a packed batch of meshes: PyTorch3D's ``rasterize_meshes`` on tensors.

    The packed inputs are what a PyTorch3D ``Meshes`` gives:
    ``verts_packed()``, ``faces_packed()``, ``mesh_to_faces_packed_first_idx()``,
    ``num_faces_per_mesh()``. Settings and outputs are PyTorch3D's (see
    :func:`warpraster.rasterize_meshes` for each setting); the output is identical
    for any ``bin_size``, and a bin that overflows still renders exactly.

    Args:
        verts_packed: (V, 3) floating-point vertices, x, y in NDC (+X left, +Y up),
            z = depth. Shared with Warp (zero-copy) when float32 and contiguous;
            other float dtypes are cast to float32 (the gradient is cast back).
        faces_packed: (F, 3) integer vertex indices into ``verts_packed``
            (global). int32 is shared; int64 is range-checked and copied to int32.
        mesh_to_face_first_idx: (N,) first face of each mesh (a tensor or ints).
        num_faces_per_mesh: (N,) faces of each mesh (0 allowed).
        clipped_faces_neighbor_idx: as in PyTorch3D.
        context: a :class:`RasterContext` whose workspaces the call reuses
            (default: the process-wide one, see :func:`default_context`).
        **options: the render options of :func:`warpraster.rasterize_meshes` but
            ``deterministic``: ``image_size`` (``int`` or ``(H, W)``), ``blur_radius``,
            ``faces_per_pixel``, ``bin_size``, ``max_faces_per_bin``,
            ``perspective_correct``, ``clip_barycentric_coords``, ``cull_backfaces``,
            ``z_clip_value``, ``cull_to_frustum`` as in PyTorch3D, and
            ``exact_perspective_grad`` (default True: the true derivative at a
            clamped perspective denominator; False: PyTorch3D's numbers there;
            see :class:`warpraster.RasterSettings`).

    Returns:
        ``(pix_to_face, zbuf, bary_coords, dists)`` on the input's device:
        ``pix_to_face`` int64 (N, H, W, K), -1 where empty; ``zbuf`` float32
        (N, H, W, K); ``bary_coords`` float32 (N, H, W, K, 3); ``dists`` float32
        (N, H, W, K) signed squared distance. Empty slots hold -1. The float
        outputs are differentiable with respect to ``verts_packed``.

    Raises:
        TypeError, ValueError: bad input, naming the argument (before any kernel).
        RuntimeError: under ``torch.func`` transforms (use ``torch.autograd``).
    """
    _, _, first, count, neighbor = check_packed(
        verts_packed, faces_packed, mesh_to_face_first_idx, num_faces_per_mesh,
        clipped_faces_neighbor_idx, names=_NAMES,
    )  # fmt: skip
    _check_functorch(verts_packed)
    settings = settings_from_options(None, options, allowed=_RENDER_OPTIONS)
    settings.check_slots(first.shape[0])
    # (the op checks the index values before its first kernel, also when compiled)
    pix_to_face, zbuf, bary_coords, dists = _rasterize(
        _to_kernel_float(verts_packed), faces_packed, first, count, neighbor,
        _register_context(context), *_flatten(settings),
    )  # fmt: skip
    # PyTorch3D's dtype: the one copy of the outputs.
    return pix_to_face.to(torch.int64), zbuf, bary_coords, dists


def rasterize_mesh_list(
    verts_list: Sequence[torch.Tensor],
    faces_list: Sequence[torch.Tensor],
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rasterizes a list of meshes, packed as PyTorch3D's ``Meshes`` packs them.

    Args:
        verts_list: N tensors (V_i, 3) of floating-point vertices (NDC x, y; z depth).
        faces_list: N tensors (F_i, 3) of integer vertex indices, LOCAL to their
            mesh (0 .. V_i - 1). A mesh may be empty ((0, 3) faces).
        **kwargs: the keywords of :func:`rasterize_meshes`.

    Returns:
        As :func:`rasterize_meshes`; ``pix_to_face`` indexes the packed faces
        (mesh i's faces start at ``sum(F_j for j < i)``). Gradients reach every
        tensor of ``verts_list``.
    """
    if isinstance(verts_list, torch.Tensor) or isinstance(faces_list, torch.Tensor):
        raise TypeError("verts_list and faces_list must be lists of tensors, one per mesh")
    verts_list, faces_list = list(verts_list), list(faces_list)
    if len(verts_list) != len(faces_list):
        raise ValueError(
            f"verts_list has {len(verts_list)} meshes but faces_list has {len(faces_list)}"
        )
    if not verts_list:
        raise ValueError("verts_list must hold at least one mesh")
    for i, (v, f) in enumerate(zip(verts_list, faces_list, strict=True)):
        float_tensor(v, f"verts_list[{i}]", 2, (3,), "(V, 3)")
        int_tensor(f, f"faces_list[{i}]", 2, 3)
    device = verts_list[0].device
    same_device(
        device,
        "verts_list[0]",
        **{f"verts_list[{i}]": v for i, v in enumerate(verts_list)},
        **{f"faces_list[{i}]": f for i, f in enumerate(faces_list)},
    )
    # Local indices must stay inside their own mesh (the packed check alone would
    # accept an index into the next mesh's vertices). A host read, eager only.
    for i, (v, f) in enumerate(zip(verts_list, faces_list, strict=True)):
        check_index_range(f, f"faces_list[{i}]", v.shape[0], f"vertices in verts_list[{i}]",
                          kind="vertex indices")  # fmt: skip
    vert_offsets, face_counts, offset = [], [], 0
    for v, f in zip(verts_list, faces_list, strict=True):
        vert_offsets.append(offset)
        face_counts.append(f.shape[0])
        offset += v.shape[0]
    first = [sum(face_counts[:i]) for i in range(len(face_counts))]
    verts = torch.cat([v.to(torch.float32) for v in verts_list])
    faces = torch.cat(
        [f.to(torch.int64) + o for f, o in zip(faces_list, vert_offsets, strict=True)]
    )
    return rasterize_meshes(
        verts,
        faces,
        torch.tensor(first, dtype=torch.int64, device=device),
        torch.tensor(face_counts, dtype=torch.int64, device=device),
        **kwargs,
    )
