"""PyTorch3D-shaped rendering on tensors: cameras, lights, materials, textures,
shaders, ``MeshRasterizer`` and ``MeshRenderer``, with autograd to every tensor.

``from warpraster.torch.shading import MeshRenderer, MeshRasterizer, SoftPhongShader,
FoVPerspectiveCameras, PointLights, TexturesVertex, ...`` reads like PyTorch3D's
``pytorch3d.renderer``; the renderer is called on packed meshes (what a
``Meshes`` gives: ``verts_packed()``, ``faces_packed()``,
``mesh_to_faces_packed_first_idx()``, ``num_faces_per_mesh()``).

How it works: one ``torch.library.custom_op`` (``warpraster::render_meshes``)
projects, rasterizes and shades with the Warp kernels, on tensors shared with
Warp (zero-copy ``wp.from_torch``); it returns the RGBA image and the fragments.
Its backward is a second custom op that replays the render on a ``wp.Tape``
with the tensors' gradient buffers attached and runs ``tape.backward`` from the
upstream gradients, returning the gradients of the vertices and of every camera,
light, material, background and texture tensor. Both ops have fake
implementations (output shapes from the settings), so ``torch.compile`` treats
the render as one opaque node. The replay costs a second forward in the
backward; nothing Warp-side lives in the autograd graph.

Every parameter tensor is cast to contiguous float32 (a no-op when it already
is; the cast is differentiable), integer tensors to int32.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass

import numpy as np
import torch
import warp as wp

from .. import camera as _camera
from .. import shading as _shading
from ..rasterizer import MeshRasterizer as _WarpMeshRasterizer
from ..rasterizer import RasterizationSettings
from ..renderer import MeshRenderer as _WarpMeshRenderer
from .checks import (
    check_index_range,
    check_packed,
    check_packed_values,
    float_tensor,
    int_tensor,
    to_int32,
)
from .streams import _TorchStream

__all__ = [
    "AmbientLights",
    "BlendParams",
    "DirectionalLights",
    "FoVOrthographicCameras",
    "FoVPerspectiveCameras",
    "Fragments",
    "HardFlatShader",
    "HardGouraudShader",
    "HardPhongShader",
    "Materials",
    "MeshRasterizer",
    "MeshRenderer",
    "PerspectiveCameras",
    "PointLights",
    "RasterizationSettings",
    "SoftGouraudShader",
    "SoftPhongShader",
    "SoftSilhouetteShader",
    "TexturesUV",
    "TexturesVertex",
]


def _f32(x, device=None, width: int | None = None) -> torch.Tensor:
    """A float32 contiguous tensor (rows of ``width`` when given; a row is broadcast as (1, w))."""
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)
    t = x.to(torch.float32)
    if width is not None and t.ndim == 1 and t.shape[0] == width:
        t = t.reshape(1, width)
    return t.contiguous()


# ----------------------------------------------------------------------------- parameter holders
class _Holder:
    """Named float32 tensors (the differentiable inputs) plus static options."""

    _names: tuple[str, ...] = ()

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n) for n in self._names}

    def to(self, device):
        for n in self._names:
            setattr(self, n, getattr(self, n).to(device))
        return self

    def _set_pose(self, R, T, device) -> None:
        """PyTorch3D's R (N, 3, 3), default identity, and T (N, 3), default zero."""
        self.R = _f32(torch.eye(3)[None] if R is None else R, device).reshape(-1, 3, 3)
        self.T = _f32(torch.zeros(1, 3) if T is None else T, device, 3)


class FoVPerspectiveCameras(_Holder):
    """PyTorch3D's ``FoVPerspectiveCameras`` on tensors (fov in degrees by default)."""

    _names = ("znear", "zfar", "aspect_ratio", "fov", "R", "T")
    _warp = "FoVPerspectiveCameras"

    def __init__(
        self,
        znear=1.0,
        zfar=100.0,
        aspect_ratio=1.0,
        fov=60.0,
        degrees=True,
        R=None,
        T=None,
        device=None,
    ):
        self.degrees = bool(degrees)
        self.znear, self.zfar = _f32(znear, device).reshape(-1), _f32(zfar, device).reshape(-1)
        self.aspect_ratio = _f32(aspect_ratio, device).reshape(-1)
        self.fov = _f32(fov, device).reshape(-1)
        self._set_pose(R, T, device)

    def _warp_kwargs(self):
        return {"degrees": self.degrees}


class FoVOrthographicCameras(_Holder):
    """PyTorch3D's ``FoVOrthographicCameras`` on tensors."""

    _names = ("znear", "zfar", "max_y", "min_y", "max_x", "min_x", "scale_xyz", "R", "T")
    _warp = "FoVOrthographicCameras"

    def __init__(
        self,
        znear=1.0,
        zfar=100.0,
        max_y=1.0,
        min_y=-1.0,
        max_x=1.0,
        min_x=-1.0,
        scale_xyz=((1.0, 1.0, 1.0),),
        R=None,
        T=None,
        device=None,
    ):
        for name, v in (
            ("znear", znear),
            ("zfar", zfar),
            ("max_y", max_y),
            ("min_y", min_y),
            ("max_x", max_x),
            ("min_x", min_x),
        ):
            setattr(self, name, _f32(v, device).reshape(-1))
        self.scale_xyz = _f32(scale_xyz, device, 3)
        self._set_pose(R, T, device)

    def _warp_kwargs(self):
        return {}


class PerspectiveCameras(_Holder):
    """PyTorch3D's ``PerspectiveCameras`` on tensors (NDC or screen space)."""

    _names = ("focal_length", "principal_point", "R", "T")
    _warp = "PerspectiveCameras"

    def __init__(
        self,
        focal_length=1.0,
        principal_point=((0.0, 0.0),),
        R=None,
        T=None,
        device=None,
        in_ndc=True,
        image_size=None,
    ):
        fl = _f32(focal_length, device)
        self.focal_length = fl.reshape(-1, 1) if fl.ndim <= 1 else fl
        self.principal_point = _f32(principal_point, device, 2)
        self._set_pose(R, T, device)
        self.in_ndc = bool(in_ndc)
        self.image_size = None if image_size is None else np.asarray(image_size).tolist()

    def _warp_kwargs(self):
        return {"in_ndc": self.in_ndc, "image_size": self.image_size}


class _Mirror(_Holder):
    """A holder that takes the arguments of the Warp class it mirrors (``_warp`` in
    :mod:`warpraster.shading`): the same names in the same order (positional too,
    as PyTorch3D's) with the same defaults, then ``device`` (a torch device).
    Colours, locations and directions become float32 (B, 3) rows; the names in
    ``_scalars`` (B,) values."""

    _scalars: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        warp_args = inspect.signature(getattr(_shading, cls._warp)).parameters.values()
        own = [p for p in warp_args if p.name not in ("device", "requires_grad")]
        cls._names = tuple(p.name for p in own)
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        cls.__signature__ = inspect.Signature(
            [p.replace(kind=kind) for p in own] + [inspect.Parameter("device", kind, default=None)]
        )

    def __init__(self, *args, **kwargs):
        bound = self.__signature__.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        device = values.pop("device")
        for name, v in values.items():
            t = _f32(v, device).reshape(-1) if name in self._scalars else _f32(v, device, 3)
            setattr(self, name, t)


class PointLights(_Mirror):
    """PyTorch3D's ``PointLights`` on tensors (arguments of
    :class:`warpraster.shading.PointLights`)."""

    _warp = "PointLights"


class DirectionalLights(_Mirror):
    """PyTorch3D's ``DirectionalLights`` on tensors (arguments of
    :class:`warpraster.shading.DirectionalLights`)."""

    _warp = "DirectionalLights"


class AmbientLights(_Holder):
    """PyTorch3D's ``AmbientLights`` on tensors."""

    _names = ("ambient_color",)
    _warp = "AmbientLights"

    def __init__(self, *, ambient_color=None, device=None):
        self.ambient_color = _f32(
            ((1.0, 1.0, 1.0),) if ambient_color is None else ambient_color, device, 3
        )


class Materials(_Mirror):
    """PyTorch3D's ``Materials`` on tensors (arguments of
    :class:`warpraster.shading.Materials`)."""

    _warp = "Materials"
    _scalars = ("shininess",)


@dataclass
class BlendParams:
    """PyTorch3D's ``BlendParams``; ``background_color`` may be a tensor (gets a gradient)."""

    sigma: float = 1e-4
    gamma: float = 1e-4
    background_color: object = (1.0, 1.0, 1.0)


class TexturesVertex(_Holder):
    """PyTorch3D's ``TexturesVertex``, packed: ``verts_features`` (V, 3)."""

    _names = ("verts_features",)
    _warp = "TexturesVertex"

    def __init__(self, verts_features):
        if not isinstance(verts_features, torch.Tensor):
            verts_features = torch.as_tensor(np.asarray(verts_features))
        float_tensor(verts_features, "verts_features", 2, (None,))
        self.verts_features = _f32(verts_features)

    def _static(self):
        return {}


class TexturesUV(_Holder):
    """PyTorch3D's ``TexturesUV``, packed.

    maps (N, Ht, Wt, 3) one per mesh (row 0 at v = 1, as PyTorch3D), faces_uvs (F, 3),
    verts_uvs (T, 2).
    """

    _names = ("maps", "verts_uvs")
    _warp = "TexturesUV"

    def __init__(
        self,
        maps,
        faces_uvs,
        verts_uvs,
        padding_mode="border",
        align_corners=True,
        sampling_mode="bilinear",
    ):
        maps, faces_uvs, verts_uvs = (
            x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
            for x in (maps, faces_uvs, verts_uvs)
        )
        float_tensor(maps, "maps", 4, (None, None, None))
        float_tensor(verts_uvs, "verts_uvs", 2, (2,))
        int_tensor(faces_uvs, "faces_uvs", 2, 3)
        check_index_range(faces_uvs, "faces_uvs", verts_uvs.shape[0], "UVs in verts_uvs")
        self.maps = _f32(maps)
        self.verts_uvs = _f32(verts_uvs)
        self.faces_uvs = to_int32(faces_uvs)
        self.padding_mode, self.align_corners = padding_mode, bool(align_corners)
        self.sampling_mode = sampling_mode

    def _static(self):
        return {
            "padding_mode": self.padding_mode,
            "align_corners": self.align_corners,
            "sampling_mode": self.sampling_mode,
        }


# ----------------------------------------------------------------------------- shaders
class _Shader:
    _warp = ""

    def __init__(self, device=None, cameras=None, lights=None, materials=None, blend_params=None):
        self.cameras = cameras
        self.lights = lights if lights is not None else PointLights(device=device)
        self.materials = materials if materials is not None else Materials(device=device)
        self.blend_params = blend_params if blend_params is not None else BlendParams()


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


# ----------------------------------------------------------------------------- the op
def _wp(t: torch.Tensor, dtype, grad: torch.Tensor | None = None) -> wp.array:
    if grad is None:
        return wp.from_torch(t, dtype=dtype, requires_grad=False)
    return wp.from_torch(t, dtype=dtype, requires_grad=True, grad=grad)


_VEC_DTYPES = {3: wp.vec3, 2: wp.vec2}


def _as_warp(t, grad=None):
    """Warp view of a parameter tensor: (B,) scalars, (B, 2|3) vectors, (B, 3, 3) mat33."""
    if t.ndim == 3 and t.shape[1:] == (3, 3):
        return _wp(t, wp.mat33, grad)
    if t.ndim == 2 and t.shape[1] in _VEC_DTYPES and t.shape[1] != 1:
        return _wp(t, _VEC_DTYPES[t.shape[1]], grad)
    return _wp(t, wp.float32, grad)


def _build(config: dict, tensors: list[torch.Tensor], grads: list | None):
    """Warp cameras, lights, materials, textures, blend params and shader from the op inputs."""
    it = iter(range(len(tensors)))

    def take(kind="param"):
        i = next(it)
        g = None if grads is None else grads[i]
        t = tensors[i]
        if kind == "raw":
            return _wp(t, wp.float32, g)
        return _as_warp(t, g)

    cam_cfg = config["camera"]
    cam_args = {name: take() for name in cam_cfg["names"]}
    if "focal_length" in cam_args:
        fl = tensors[cam_cfg["names"].index("focal_length")]
        i = cam_cfg["names"].index("focal_length")
        cam_args["focal_length"] = _wp(fl, wp.float32, None if grads is None else grads[i])
    cams = getattr(_camera, cam_cfg["type"])(**cam_args, **cam_cfg["kwargs"])
    out = {"cameras": cams}
    if config["shader"] == "none":
        return out
    light_cfg = config["lights"]
    lt_args = {name: take() for name in light_cfg["names"]}
    out["lights"] = getattr(_shading, light_cfg["type"])(**lt_args)
    out["materials"] = _shading.Materials(**{n: take() for n in config["materials"]})
    bg = take() if config["blend"]["background_tensor"] else tuple(config["blend"]["background"])
    out["blend_params"] = _shading.BlendParams(
        sigma=config["blend"]["sigma"], gamma=config["blend"]["gamma"], background_color=bg
    )
    tex_cfg = config["textures"]
    if tex_cfg is None:
        out["textures"] = None
    elif tex_cfg["type"] == "TexturesVertex":
        out["textures"] = _shading.TexturesVertex(take("raw"))
    else:
        maps = take("raw")
        verts_uvs = take("raw")
        faces_uvs = wp.from_torch(tensors[next(it)], dtype=wp.int32)
        out["textures"] = _shading.TexturesUV(maps, faces_uvs, verts_uvs, **tex_cfg["static"])
    return out


def _run(verts, faces, first, count, tensors, config, grads=None, grad_verts=None):
    """Runs the Warp MeshRenderer (or rasterizer) on tensor views; returns (image, fragments)."""
    v = _wp(verts, wp.vec3, grad_verts)
    f = wp.from_torch(to_int32(faces), dtype=wp.int32)
    fi = wp.from_torch(to_int32(first), dtype=wp.int32)
    cn = wp.from_torch(to_int32(count), dtype=wp.int32)
    objs = _build(config, tensors, grads)
    settings = RasterizationSettings(**config["raster"])
    rasterizer = _WarpMeshRasterizer(cameras=objs["cameras"], raster_settings=settings)
    if config["shader"] == "none":
        return None, rasterizer(v, f, fi, cn, validate=grads is None)
    shader = getattr(_shading, config["shader"])(
        cameras=objs["cameras"],
        lights=objs["lights"],
        materials=objs["materials"],
        blend_params=objs["blend_params"],
    )
    renderer = _WarpMeshRenderer(rasterizer=rasterizer, shader=shader)
    image, frags = renderer(v, f, fi, cn, textures=objs["textures"], return_fragments=True)
    return image, frags


def _shape(first: torch.Tensor, config: dict):
    h, w = config["image_size"]
    return (first.shape[0], h, w, config["raster"]["faces_per_pixel"])


@torch.library.custom_op("warpraster::render_meshes", mutates_args=())
def _render_op(
    verts: torch.Tensor,
    faces: torch.Tensor,
    mesh_to_face_first_idx: torch.Tensor,
    num_faces_per_mesh: torch.Tensor,
    tensors: list[torch.Tensor],
    config: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image (N, H, W, 4), pix_to_face int32, zbuf, bary (N, H, W, K, 3), dists)."""
    cfg = json.loads(config)
    # The index values, before any int32 cast could wrap them (a host read; the op
    # body runs eagerly also inside a compiled graph).
    check_packed_values(verts.shape[0], faces, mesh_to_face_first_idx, num_faces_per_mesh)
    with _TorchStream(verts.device):
        image, frags = _run(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh, tensors, cfg)
        n, h, w, k = frags.pix_to_face.shape
        outs = (
            wp.to_torch(frags.pix_to_face).clone(),
            wp.to_torch(frags.zbuf).clone(),
            wp.to_torch(frags.bary_coords).reshape(n, h, w, k, 3).clone(),
            wp.to_torch(frags.dists).clone(),
        )
        img = wp.to_torch(image).clone() if image is not None else verts.new_zeros((n, h, w, 4))
    return (img, *outs)


@_render_op.register_fake
def _render_fake(verts, faces, first, count, tensors, config):
    cfg = json.loads(config)
    shape = _shape(first, cfg)
    return (
        verts.new_empty((*shape[:3], 4)),
        verts.new_empty(shape, dtype=torch.int32),
        verts.new_empty(shape),
        verts.new_empty((*shape, 3)),
        verts.new_empty(shape),
    )


@torch.library.custom_op("warpraster::render_meshes_backward", mutates_args=())
def _render_backward_op(
    upstream: list[torch.Tensor], saved: list[torch.Tensor], config: str
) -> list[torch.Tensor]:
    """[d verts, d tensors[0], ...]: the render replayed on a wp.Tape, then backward.

    ``upstream`` = [d image, d zbuf, d bary, d dists] (zeros where none came);
    ``saved`` = the forward's inputs [verts, faces, mesh_to_face_first_idx,
    num_faces_per_mesh, *tensors], as :func:`_setup_context` saved them.
    """
    cfg = json.loads(config)
    grad_image, grad_zbuf, grad_bary, grad_dists = upstream
    verts, faces, first, count, *tensors = saved

    grad_verts = torch.zeros_like(verts)
    grads = [torch.zeros_like(t) if t.is_floating_point() else None for t in tensors]
    with _TorchStream(verts.device):
        tape = wp.Tape()
        with tape:
            image, frags = _run(
                verts, faces, first, count, tensors, cfg, grads=grads, grad_verts=grad_verts
            )
        n, h, w, k = frags.pix_to_face.shape
        output_grads = {
            frags.zbuf: wp.from_torch(grad_zbuf.contiguous(), dtype=wp.float32),
            frags.bary_coords: wp.from_torch(
                grad_bary.reshape(n, h, w, k, 3).contiguous(), dtype=wp.vec3
            ),
            frags.dists: wp.from_torch(grad_dists.contiguous(), dtype=wp.float32),
        }
        if image is not None:
            output_grads[image] = wp.from_torch(grad_image.contiguous(), dtype=wp.float32)
        tape.backward(grads=output_grads)
    return [grad_verts] + [
        g if g is not None else torch.zeros_like(t, dtype=torch.float32)
        for g, t in zip(grads, tensors, strict=True)
    ]


@_render_backward_op.register_fake
def _render_backward_fake(upstream, saved, config):
    verts, tensors = saved[0], saved[4:]
    return [torch.empty_like(verts)] + [torch.empty_like(t, dtype=torch.float32) for t in tensors]


def _setup_context(ctx, inputs, output):
    verts, faces, first, count, tensors, config = inputs
    ctx.config = config
    ctx.save_for_backward(verts, faces, first, count, *tensors)


def _backward_impl(ctx, g_image, g_p2f, g_zbuf, g_bary, g_dists):
    saved = list(ctx.saved_tensors)
    verts, first, tensors = saved[0], saved[2], saved[4:]
    shape = _shape(first, json.loads(ctx.config))

    def z(g, s):
        return verts.new_zeros(s) if g is None else g.contiguous()

    upstream = [
        z(g_image, (*shape[:3], 4)),
        z(g_zbuf, shape),
        z(g_bary, (*shape, 3)),
        z(g_dists, shape),
    ]
    grads = _render_backward_op(upstream, saved, ctx.config)
    tensor_grads = [
        g if t.is_floating_point() else None for g, t in zip(grads[1:], tensors, strict=True)
    ]
    return (grads[0], None, None, None, tensor_grads, None)


_render_op.register_autograd(_backward_impl, setup_context=_setup_context)


# ----------------------------------------------------------------------------- user API
def _dev(t: torch.Tensor, device) -> torch.Tensor:
    return t if device is None else t.to(device)


def _config_and_tensors(cameras, raster_settings, shader, textures, device):
    cams = cameras
    raster = {
        k: getattr(raster_settings, k)
        for k in (
            "blur_radius",
            "faces_per_pixel",
            "bin_size",
            "max_faces_per_bin",
            "perspective_correct",
            "clip_barycentric_coords",
            "cull_backfaces",
            "z_clip_value",
            "cull_to_frustum",
            "exact_perspective_grad",
        )
    }
    size = raster_settings.image_size
    h, w = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
    raster["image_size"] = [h, w]
    tensors = []
    cam_t = cams.tensors()
    tensors += [_dev(t, device) for t in cam_t.values()]
    config = {
        "camera": {"type": cams._warp, "names": list(cam_t), "kwargs": cams._warp_kwargs()},
        "raster": raster,
        "image_size": [h, w],
        "shader": "none",
    }
    if shader is None:
        return config, tensors
    config["shader"] = shader._warp
    lights = shader.lights if not isinstance(shader, SoftSilhouetteShader) else AmbientLights()
    lt = lights.tensors()
    tensors += [_dev(t, device) for t in lt.values()]
    config["lights"] = {"type": lights._warp, "names": list(lt)}
    mt = shader.materials.tensors()
    tensors += [_dev(t, device) for t in mt.values()]
    config["materials"] = list(mt)
    bp = shader.blend_params
    bg_tensor = isinstance(bp.background_color, torch.Tensor)
    config["blend"] = {
        "sigma": float(bp.sigma),
        "gamma": float(bp.gamma),
        "background_tensor": bg_tensor,
        "background": None if bg_tensor else [float(c) for c in bp.background_color],
    }
    if bg_tensor:
        tensors.append(_f32(_dev(bp.background_color, device), device, 3))
    if textures is None:
        config["textures"] = None
    elif isinstance(textures, TexturesVertex):
        config["textures"] = {"type": "TexturesVertex"}
        tensors.append(_dev(textures.verts_features, device))
    elif isinstance(textures, TexturesUV):
        config["textures"] = {"type": "TexturesUV", "static": textures._static()}
        tensors += [
            _dev(textures.maps, device),
            _dev(textures.verts_uvs, device),
            _dev(textures.faces_uvs, device),
        ]
    else:
        raise TypeError(
            f"textures must be TexturesVertex or TexturesUV, got {type(textures).__name__}"
        )
    return config, tensors


def _packed(verts, faces, first, count):
    """The checked packed batch (structure; the op checks the index values): float32
    contiguous verts, integer faces and per-mesh ranges as given (cast in the op)."""
    verts, faces, first, count, _ = check_packed(verts, faces, first, count)
    return verts.to(torch.float32).contiguous(), faces.contiguous(), first, count


def _check_texture_rows(textures, num_verts: int, num_faces: int) -> None:
    """A texture's rows match the mesh: one feature row per vertex, one UV face per face."""
    if isinstance(textures, TexturesVertex) and textures.verts_features.shape[0] != num_verts:
        raise ValueError(
            f"textures.verts_features has {textures.verts_features.shape[0]} rows for "
            f"{num_verts} vertices in verts"
        )
    if isinstance(textures, TexturesUV) and textures.faces_uvs.shape[0] != num_faces:
        raise ValueError(
            f"textures.faces_uvs has {textures.faces_uvs.shape[0]} faces, faces has {num_faces}"
        )


@torch._dynamo.assume_constant_result
def _config_json(config: dict) -> str:
    """The op's static configuration as JSON (a constant for torch.compile)."""
    return json.dumps(config)


class MeshRasterizer:
    """PyTorch3D's ``MeshRasterizer`` on tensors: ``rasterizer(verts, faces, first, count)``."""

    def __init__(self, cameras=None, raster_settings=None):
        self.cameras = cameras
        self.raster_settings = raster_settings or RasterizationSettings()

    def __call__(self, verts, faces, mesh_to_face_first_idx, num_faces_per_mesh, **kwargs):
        cams = kwargs.get("cameras", self.cameras)
        v, f, fi, cn = _packed(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh)
        config, tensors = _config_and_tensors(cams, self.raster_settings, None, None, v.device)
        config = _config_json(config)
        _, p2f, zbuf, bary, dists = _render_op(v, f, fi, cn, tensors, config)
        return Fragments(p2f.to(torch.int64), zbuf, bary, dists)


class MeshRenderer(torch.nn.Module):
    """PyTorch3D's ``MeshRenderer`` on tensors.

    ``renderer(verts_packed, faces_packed, mesh_to_face_first_idx, num_faces_per_mesh,
    textures=...)`` returns the (N, H, W, 4) image; ``renderer.fragments`` holds
    the fragments of the last call. Gradients reach the vertices and every
    camera/light/material/texture/background tensor that requires grad.
    """

    def __init__(self, rasterizer: MeshRasterizer, shader: _Shader):
        super().__init__()
        self.rasterizer = rasterizer
        self.shader = shader
        self.fragments: Fragments | None = None

    def forward(
        self, verts, faces, mesh_to_face_first_idx, num_faces_per_mesh, *, textures=None, **kwargs
    ):
        cams = kwargs.get("cameras", self.shader.cameras or self.rasterizer.cameras)
        v, f, fi, cn = _packed(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh)
        _check_texture_rows(textures, v.shape[0], f.shape[0])
        config, tensors = _config_and_tensors(
            cams, self.rasterizer.raster_settings, self.shader, textures, v.device
        )
        config = _config_json(config)
        img, p2f, zbuf, bary, dists = _render_op(v, f, fi, cn, tensors, config)
        self.fragments = Fragments(p2f.to(torch.int64), zbuf, bary, dists)
        return img
