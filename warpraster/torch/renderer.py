"""PyTorch3D's ``MeshRasterizer``, ``MeshRenderer`` and shaders on tensors.

A call takes a PyTorch3D ``Meshes`` (or any object with ``verts_packed()``,
``faces_packed()``, ``mesh_to_faces_packed_first_idx()``, ``num_faces_per_mesh()``
and ``textures``), or the packed tensors themselves, and PyTorch3D's per-call
keywords with PyTorch3D's meaning (:class:`RenderCall`); a keyword nothing uses
raises ``TypeError``. The render itself is one custom op (:mod:`.render_op`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rasterizer import RasterizationSettings
from .cameras import _Camera
from .lighting import LIGHTS, BlendParams, Materials, PointLights
from .render_config import call_config, packed
from .render_op import fragments_later, render
from .textures import pack_textures

__all__ = [
    "Fragments",
    "HardFlatShader",
    "HardGouraudShader",
    "HardPhongShader",
    "MeshRasterizer",
    "MeshRenderer",
    "MeshRendererWithFragments",
    "SoftGouraudShader",
    "SoftPhongShader",
    "SoftSilhouetteShader",
]


# ----------------------------------------------------------------------------- shaders
class _Shader:
    _warp = ""

    def __init__(self, device=None, cameras=None, lights=None, materials=None, blend_params=None):
        self.cameras = cameras
        self.lights = lights if lights is not None else PointLights(device=device)
        self.materials = materials if materials is not None else Materials(device=device)
        self.blend_params = blend_params if blend_params is not None else BlendParams()

    def to(self, device):
        for holder in (self.cameras, self.lights, self.materials):
            if holder is not None:
                holder.to(device)
        return self


def _shader_class(name: str) -> type[_Shader]:
    """PyTorch3D's shader ``name`` on tensors: a :class:`_Shader` running Warp's ``name``."""
    doc = f"PyTorch3D's ``{name}`` on tensors (renders with :class:`warpraster.shading.{name}`)."
    return type(name, (_Shader,), {"_warp": name, "__doc__": doc, "__module__": __name__})


HardPhongShader = _shader_class("HardPhongShader")
SoftPhongShader = _shader_class("SoftPhongShader")
HardGouraudShader = _shader_class("HardGouraudShader")
SoftGouraudShader = _shader_class("SoftGouraudShader")
HardFlatShader = _shader_class("HardFlatShader")


class SoftSilhouetteShader(_Shader):
    """PyTorch3D's ``SoftSilhouetteShader`` (alpha only; lights and materials unused)."""

    _warp = "SoftSilhouetteShader"

    def __init__(self, blend_params=None):
        super().__init__(blend_params=blend_params)


@dataclass
class Fragments:
    """PyTorch3D's ``Fragments`` (pix_to_face int64 as PyTorch3D's; bary (N, H, W, K, 3))."""

    pix_to_face: torch.Tensor
    zbuf: torch.Tensor
    bary_coords: torch.Tensor
    dists: torch.Tensor


# ----------------------------------------------------------------------------- one call
def _check_type(value, name: str, types, what: str):
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    return value


@dataclass
class RenderCall:
    """What one call renders with, PyTorch3D's keywords resolved.

    As PyTorch3D's ``MeshRasterizer``: ``cameras=`` replaces the rasterizer's camera;
    ``R=``, ``T=`` and the camera's projection parameters (``znear``, ``zfar``,
    ``fov``, ``aspect_ratio``, ``degrees``; ``min_x``..``scale_xyz``;
    ``focal_length``, ``principal_point``) override its own for this call
    (PyTorch3D's ``get_world_to_view_transform(**kwargs)`` /
    ``get_projection_transform(**kwargs)``); ``raster_settings=`` replaces the
    settings; ``eps`` must be None (the projection divides without a clamp). As
    PyTorch3D's shaders: ``cameras=`` (else the shader's camera, else the
    rasterizer's) gives the eye position, ``lights=``, ``materials=``,
    ``blend_params=`` replace the shader's, ``znear=``/``zfar=`` the softmax depth
    range. The shader's camera sees the call's ``R``/``T`` when it is the camera the
    rasterizer uses (PyTorch3D's rasterizer writes them into that object).
    """

    cameras: _Camera
    shader_cameras: _Camera | None
    raster_settings: RasterizationSettings
    z_clip_value: float | None
    shader: _Shader | None
    lights: object = None
    materials: object = None
    blend_params: object = None
    z_planes: dict | None = None
    textures: object = None

    @classmethod
    def resolve(cls, rasterizer: MeshRasterizer, shader: _Shader | None, kwargs: dict, who: str):
        kw = dict(kwargs)
        base = kw.pop("cameras", None)
        if base is None:
            base = rasterizer.cameras if shader is None else (
                rasterizer.cameras or shader.cameras
            )  # fmt: skip
        if base is None:
            raise ValueError(f"{who}: cameras must be given at initialization or in the call")
        _check_type(base, "cameras", _Camera, "a warpraster.torch camera")
        settings = _check_type(kw.pop("raster_settings", rasterizer.raster_settings),
                               "raster_settings", RasterizationSettings,
                               "a RasterizationSettings")  # fmt: skip
        if kw.pop("eps", None) is not None:
            raise TypeError(f"{who}: eps is not used (the projection divides by depth without a "
                            "clamp); pass eps=None or leave it out")  # fmt: skip
        z_given = {k: kwargs[k] for k in ("znear", "zfar") if k in kwargs}
        overrides = {k: kw.pop(k) for k in base.call_keywords() if k in kw}
        cams = base.overridden(overrides) if overrides else base
        z_clip = None
        if "znear" in overrides and settings.z_clip_value is None:
            # PyTorch3D clips at the camera's own znear / 2, not the call's.
            persp = settings.perspective_correct
            persp = base.is_perspective() if persp is None else persp
            z_clip = float(base.znear.min()) / 2.0 if persp else None
        call = cls(cams, None, settings, z_clip, shader)
        if shader is not None:
            own = kwargs.get("cameras", shader.cameras)
            if own is not None and own is not base:
                call.shader_cameras = _check_type(own, "cameras", _Camera,
                                                  "a warpraster.torch camera")  # fmt: skip
            call.lights = _check_type(
                kw.pop("lights", shader.lights),
                "lights",
                LIGHTS,
                "PointLights, DirectionalLights or AmbientLights",
            )
            call.materials = _check_type(kw.pop("materials", shader.materials), "materials",
                                         Materials, "Materials")  # fmt: skip
            call.blend_params = _check_type(
                kw.pop("blend_params", shader.blend_params),
                "blend_params",
                BlendParams,
                "BlendParams",
            )
            for k in z_given:
                kw.pop(k, None)
            call.z_planes = z_given
        if kw:
            known = sorted({"cameras", "raster_settings", "eps", *base.call_keywords()} | (
                set() if shader is None else
                {"lights", "materials", "blend_params", "znear", "zfar"}))  # fmt: skip
            raise TypeError(f"{who} got keyword(s) {sorted(kw)} that it does not use "
                            f"(with {type(base).__name__}: {', '.join(known)})")  # fmt: skip
        return call


def _meshes_inputs(meshes_world, packed_args: tuple, textures):
    """(verts, faces, first, count, textures, num_verts_per_mesh or None) from a
    ``Meshes``-like object or the packed tensors."""
    if isinstance(meshes_world, torch.Tensor):
        if len(packed_args) != 3:
            raise TypeError("a packed call takes verts, faces, mesh_to_face_first_idx and "
                            f"num_faces_per_mesh; got {1 + len(packed_args)} positional "
                            "arguments")  # fmt: skip
        return (meshes_world, *packed_args, textures, None)
    needed = ("verts_packed", "faces_packed", "mesh_to_faces_packed_first_idx",
              "num_faces_per_mesh")  # fmt: skip
    missing = [m for m in needed if not callable(getattr(meshes_world, m, None))]
    if missing or packed_args:
        raise TypeError(
            "meshes_world must be a Meshes (an object with verts_packed(), faces_packed(), "
            "mesh_to_faces_packed_first_idx(), num_faces_per_mesh() and textures) alone, or "
            f"the four packed tensors; got {type(meshes_world).__name__}"
            + (f" without {', '.join(missing)}" if missing else " with more arguments")
        )
    per_mesh = getattr(meshes_world, "num_verts_per_mesh", None)
    return (
        *(getattr(meshes_world, m)() for m in needed),
        textures if textures is not None else getattr(meshes_world, "textures", None),
        per_mesh() if callable(per_mesh) else None,
    )


def _render(rasterizer, shader, meshes_world, packed_args, textures, kwargs, who,
            antialias: bool = False, fragments: bool = True):  # fmt: skip
    """(image, Fragments) of one call (image zeros for a rasterizer call); without
    ``fragments`` (outside torch.compile) the Fragments are a :class:`LazyFragments`
    where the op left them in its buffers."""
    verts, faces, first, count, tex, per_mesh = _meshes_inputs(meshes_world, packed_args, textures)
    call = RenderCall.resolve(rasterizer, shader, kwargs, who)
    v, f, fi, cn = packed(verts, faces, first, count)
    if shader is not None:
        call.textures = pack_textures(tex, v.shape[0], cn, per_mesh, num_faces=f.shape[0])
    if antialias and call.raster_settings.faces_per_pixel != 1:
        raise ValueError(
            "antialias: the antialias pass takes a K = 1 render, the raster settings have "
            f"faces_per_pixel={call.raster_settings.faces_per_pixel}"
        )
    later = not fragments and not torch.compiler.is_compiling()
    config, tensors = call_config(call, v, antialias=antialias, later=later)
    img, p2f, zbuf, bary, dists, _handle = render(v, f, fi, cn, tensors, config)
    left = fragments_later() if later else None
    if left is not None:
        return img, LazyFragments(*left)
    return img, Fragments(p2f.to(torch.int64), zbuf, bary, dists)


class LazyFragments:
    """The fragments of a :class:`MeshRenderer` call, copied out of the render's own
    buffers when first read: as :class:`Fragments`, without gradients
    (:class:`MeshRendererWithFragments` returns them with gradients, as PyTorch3D's
    does). Most calls never read them, and a K = 8 render's fragments are ~0.4 GB to
    copy. Read them before the next call: a later call may render into the same
    buffers, and then reading raises ``RuntimeError`` (never another call's values)."""

    def __init__(self, slot, generation: int):
        self._slot, self._generation = slot, generation
        self._frags: Fragments | None = None

    def _get(self) -> Fragments:
        if self._frags is None:
            if self._slot.generation != self._generation:
                raise RuntimeError(
                    "MeshRenderer.fragments: these fragments were overwritten by a later "
                    "render; read them before the next call, or use "
                    "MeshRendererWithFragments, which returns them (with gradients)"
                )
            with torch.no_grad():
                p2f, zbuf, bary, dists = self._slot.outputs()[1:]
            self._frags = Fragments(p2f.to(torch.int64), zbuf, bary, dists)
            self._slot = None
        return self._frags

    pix_to_face = property(lambda self: self._get().pix_to_face)
    zbuf = property(lambda self: self._get().zbuf)
    bary_coords = property(lambda self: self._get().bary_coords)
    dists = property(lambda self: self._get().dists)


class MeshRasterizer:
    """PyTorch3D's ``MeshRasterizer`` on tensors: ``rasterizer(meshes_world, **kwargs)``
    (or ``rasterizer(verts, faces, first, count, **kwargs)``) returns :class:`Fragments`."""

    def __init__(self, cameras=None, raster_settings=None):
        self.cameras = cameras
        self.raster_settings = raster_settings or RasterizationSettings()

    def to(self, device):
        if self.cameras is not None:
            self.cameras.to(device)
        return self

    def __call__(self, meshes_world, *packed_args, **kwargs) -> Fragments:
        return _render(self, None, meshes_world, packed_args, None, kwargs, "MeshRasterizer")[1]

    forward = __call__


class MeshRenderer(torch.nn.Module):
    """PyTorch3D's ``MeshRenderer`` on tensors.

    ``renderer(meshes_world, **kwargs)`` renders a ``Meshes`` (its ``textures``
    attached: ours or PyTorch3D's ``TexturesVertex`` / ``TexturesUV``);
    ``renderer(verts_packed, faces_packed, mesh_to_face_first_idx, num_faces_per_mesh,
    textures=...)`` the packed tensors. Keywords: see :class:`RenderCall`. Returns the
    (N, H, W, 4) image; ``renderer.fragments`` holds the fragments of the last call
    (a :class:`LazyFragments`: copied out when first read, without gradients; read
    them before the next call; :class:`MeshRendererWithFragments` returns them with
    gradients).
    Gradients reach the vertices and every camera/light/material/texture/background
    tensor that requires grad.
    """

    def __init__(self, rasterizer: MeshRasterizer, shader: _Shader, *, antialias: bool = False):
        super().__init__()
        if not isinstance(antialias, bool):
            raise TypeError(f"antialias must be a bool, got {antialias!r}")
        if antialias and not getattr(shader, "_warp", "").startswith("Hard"):
            raise ValueError(
                f"antialias: the antialias pass takes a hard image (K = 1, a hard shader), got "
                f"{type(shader).__name__}; soft shaders blend their edges already"
            )
        self.rasterizer = rasterizer
        self.shader = shader
        #: run the antialias pass on the hard image (warpraster.torch.antialias):
        #: gradients with respect to where the silhouette and occlusion edges are
        self.antialias = antialias
        self.fragments: Fragments | None = None

    def to(self, device):
        self.rasterizer.to(device)
        self.shader.to(device)
        return self

    #: the op returns the fragments (MeshRendererWithFragments), else they are read
    #: from its buffers on demand (LazyFragments)
    _returns_fragments = False

    def forward(self, meshes_world, *packed_args, textures=None, **kwargs):
        img, self.fragments = _render(self.rasterizer, self.shader, meshes_world, packed_args,
                                      textures, kwargs, type(self).__name__,
                                      antialias=self.antialias,
                                      fragments=self._returns_fragments)  # fmt: skip
        return img


class MeshRendererWithFragments(MeshRenderer):
    """PyTorch3D's ``MeshRendererWithFragments``: returns ``(images, fragments)``
    (the fragments differentiable: gradients flow from a loss on them)."""

    _returns_fragments = True

    def forward(self, meshes_world, *packed_args, textures=None, **kwargs):
        img = super().forward(meshes_world, *packed_args, textures=textures, **kwargs)
        return img, self.fragments
