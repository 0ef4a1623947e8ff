"""The public rasterizer entry: validate, pick the path, call the raster stages.

``rasterize_meshes`` turns PyTorch3D's arguments into one
:class:`~warpraster.settings.RasterSettings`, packs and checks the meshes
(:mod:`warpraster.meshes`), finds or makes the workspace, and calls
:func:`warpraster.raster.rasterize_packed` (or the clipped path,
:func:`warpraster.raster.rasterize_clipped`). Every error is raised here,
before any kernel runs.
"""

from __future__ import annotations

import dataclasses
import inspect

from .fragments import Fragments
from .grad_buffers import clear_if_recording
from .meshes import pack_meshes
from .raster import ClipWorkspace, RasterWorkspace, rasterize_clipped, rasterize_packed
from .settings import RasterSettings, Tuning

__all__ = ["rasterize_meshes"]

_DEFAULTS = RasterSettings()

#: The render options: the fields of :class:`RasterSettings` (declared there, once),
#: taken as keywords by :func:`rasterize_meshes` and ``warpraster.torch.rasterize_meshes``.
RENDER_OPTIONS = tuple(f.name for f in dataclasses.fields(RasterSettings))


def takes_render_options(names: tuple[str, ...] = RENDER_OPTIONS):
    """Declares a function's ``**options`` as the render options ``names``: its
    ``__signature__`` lists them as keywords, typed and defaulted as the fields of
    :class:`RasterSettings` (for ``help()`` and editors)."""
    fields = [f for f in dataclasses.fields(RasterSettings) if f.name in names]

    def declare(fn):
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                     annotation=f.type) for f in fields]  # fmt: skip
        fn.__signature__ = sig.replace(parameters=params)
        return fn

    return declare


def settings_from_options(
    settings: RasterSettings | None,
    options: dict,
    *,
    allowed: tuple[str, ...] = RENDER_OPTIONS,
    caller: str = "rasterize_meshes",
) -> RasterSettings:
    """The call's settings: ``settings``, or one built from the keyword ``options``
    (names in ``allowed``; passing both is refused unless the keywords are defaults).

    Raises:
        TypeError: an option not in ``allowed`` (named, as Python names an unexpected
            keyword of ``caller``), or ``settings`` not a RasterSettings.
        ValueError: both ``settings`` and options; a bad option value.
    """
    for name in options:
        if name not in allowed:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    if settings is None:
        return RasterSettings(**options)
    if not isinstance(settings, RasterSettings):
        raise TypeError(f"settings must be a RasterSettings, got {type(settings).__name__}")
    if RasterSettings(**options) != _DEFAULTS:
        raise ValueError("pass either settings or the render options as keywords, not both")
    return settings


@takes_render_options()
def rasterize_meshes(
    verts,
    faces,
    mesh_to_face_first_idx,
    num_faces_per_mesh,
    *,
    settings: RasterSettings | None = None,
    clipped_faces_neighbor_idx=None,
    workspace: RasterWorkspace | ClipWorkspace | None = None,
    validate: bool = True,
    tuning: Tuning | None = None,
    **options,
) -> Fragments:
    """Rasterizes a packed batch of triangle meshes, as PyTorch3D's ``rasterize_meshes``.

    Each mesh n of the batch is drawn into its own H x W image; every pixel keeps
    the K nearest faces that cover it (or come within ``blur_radius`` of it).

    Args:
        verts: (V, 3) vertices in NDC (x left, y up) with z = depth: a
            ``wp.array`` of ``vec3`` (its ``.grad`` receives gradients when the
            call is recorded on a ``wp.Tape``), a (V, 3) float32 ``wp.array``
            (reinterpreted in place), or a NumPy array (copied to Warp's default
            device).
        faces: (F, 3) int vertex indices into ``verts`` (packed, global).
        mesh_to_face_first_idx: (N,) first face of each mesh (N >= 1).
        num_faces_per_mesh: (N,) face count of each mesh (0 allowed).
        settings: a :class:`~warpraster.settings.RasterSettings` holding every
            render option (then pass none of them), or None to build one from
            the keywords. Its docstring describes each option.
        clipped_faces_neighbor_idx: (F,) index of the other half of a face split
            by near-plane clipping, -1 for none (the default).
        workspace: reusable buffers (:class:`RasterWorkspace`; with clipping or
            frustum culling a :class:`ClipWorkspace`). With one, the call
            allocates nothing; without, one is made for this call.
        validate: check face indices and offsets on the host (a device read).
            Pass False in a captured loop once the topology has been checked.
        tuning: :class:`~warpraster.settings.Tuning` of the workspace this call
            makes when given none (a given workspace keeps its own ``tuning``).
        **options: the render options (``image_size``, ``blur_radius``,
            ``faces_per_pixel``, ``bin_size``, ``max_faces_per_bin``,
            ``perspective_correct``, ``clip_barycentric_coords``, ``cull_backfaces``,
            ``z_clip_value``, ``cull_to_frustum``, ``deterministic``,
            ``exact_perspective_grad``): PyTorch3D's options (and two of ours),
            the fields of :class:`~warpraster.settings.RasterSettings` with its
            defaults (``image_size`` 256, ``faces_per_pixel`` 8,
            ``exact_perspective_grad`` True: the true derivative where PyTorch3D's
            clamped perspective denominator gives another number).

    Returns:
        :class:`Fragments` (``pix_to_face``, ``zbuf``, ``bary_coords``, ``dists``),
        (N, H, W, K) each; with a workspace, its arrays (overwritten by its next call).

    Non-finite vertices: a face with any NaN or inf vertex coordinate is never
    drawn (it covers no pixel and gets no gradient); other faces are unaffected.

    Raises:
        TypeError, ValueError: bad input, named by argument, before any kernel runs.
    """
    settings = settings_from_options(settings, options)
    meshes = pack_meshes(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh,
                         clipped_faces_neighbor_idx, validate=validate)  # fmt: skip
    n = meshes.num_meshes
    settings.check_slots(n)
    device = meshes.device
    grad = meshes.verts.requires_grad
    if settings.clipped:
        if workspace is None:
            workspace = ClipWorkspace(num_verts=meshes.num_verts, num_faces=meshes.num_faces,
                                      num_meshes=n, settings=settings, device=device,
                                      requires_grad=grad, tuning=tuning)  # fmt: skip
        elif not isinstance(workspace, ClipWorkspace):
            raise TypeError(
                "with z_clip_value or cull_to_frustum, workspace must be a ClipWorkspace, "
                f"got {type(workspace).__name__}"
            )
        elif not workspace.matches(meshes.num_verts, meshes.num_faces, n, settings, device):
            raise ValueError(
                "workspace was made for another configuration (vertices, faces, meshes, "
                "image size, faces_per_pixel, bin_size or device differ)"
            )
    else:
        if workspace is None:
            workspace = RasterWorkspace(num_meshes=n, num_faces=meshes.num_faces,
                                        settings=settings, device=device,
                                        requires_grad=grad, tuning=tuning)  # fmt: skip
        elif not isinstance(workspace, RasterWorkspace):
            raise TypeError(
                f"workspace must be a RasterWorkspace without clipping, got "
                f"{type(workspace).__name__}"
            )
        elif not workspace.matches(n, meshes.num_faces, settings, device):
            raise ValueError(
                "workspace was made for another configuration (meshes, faces, image size, "
                "faces_per_pixel, bin_size or device differ)"
            )
    if settings.deterministic and not workspace.deterministic:
        raise ValueError("deterministic=True needs a workspace made with deterministic=True")
    return rasterize_checked(meshes, settings, workspace)


def rasterize_checked(meshes, settings: RasterSettings, workspace) -> Fragments:
    """Rasterizes packed ``meshes`` (:func:`~warpraster.meshes.pack_meshes`) into
    ``workspace``, all three already checked against each other (as
    :func:`rasterize_meshes` does, or a renderer once at set-up): the clipped path
    (a :class:`ClipWorkspace`) or the plain one."""
    # the workspace's gradients start from zero in every recorded render
    clear_if_recording(workspace)
    if settings.clipped:
        return rasterize_clipped(meshes, settings, workspace)
    return rasterize_packed(meshes, workspace, settings)
