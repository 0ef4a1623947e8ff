"""The render op's configuration for one call: a JSON string and the tensor list.

:func:`config_and_tensors` turns a resolved call (a
:class:`~warpraster.torch.renderer.RenderCall`) into the op's configuration (what
each tensor is, the raster settings, the shader, the blend parameters, the texture
options) and its tensors in the op's order; :func:`config_json` makes the string the
op takes. :func:`call_config` does both for an eager call, the string kept per
configuration: a training loop's repeated calls read the few values the string
holds and find it, instead of building the dictionary and encoding it every call.
"""

from __future__ import annotations

import collections
import json
import threading

import torch

from .cameras import _f32
from .checks import check_packed
from .lighting import AmbientLights

__all__ = ["call_config", "config_and_tensors", "config_json", "packed"]

_RASTER_FIELDS = ("blur_radius", "faces_per_pixel", "bin_size", "max_faces_per_bin",
                  "perspective_correct", "clip_barycentric_coords", "cull_backfaces",
                  "z_clip_value", "cull_to_frustum", "exact_perspective_grad")  # fmt: skip


def _dev(t: torch.Tensor, device) -> torch.Tensor:
    return t if device is None or t.device == device else t.to(device)


def _camera_config(cams) -> dict:
    return {"type": cams._warp, "names": list(cams._names), "kwargs": cams._warp_kwargs()}


def _lights(call):
    """The lights the op shades with (a silhouette: ambient white, unused)."""
    return call.lights if call.shader._warp != "SoftSilhouetteShader" else _AMBIENT


_AMBIENT = AmbientLights()


def _image_size(s) -> tuple[int, int]:
    size = s.image_size
    return (size, size) if isinstance(size, int) else tuple(int(x) for x in size)


def _config(call) -> dict:
    """The op's configuration of ``call`` (without the per-call flags)."""
    s = call.raster_settings
    raster = {k: getattr(s, k) for k in _RASTER_FIELDS}
    if call.z_clip_value is not None:
        raster["z_clip_value"] = call.z_clip_value
    h, w = _image_size(s)
    raster["image_size"] = [h, w]
    config = {
        "camera": _camera_config(call.cameras),
        "raster": raster,
        "image_size": [h, w],
        "shader": "none",
    }
    if call.shader is None:
        return config
    config["shader"] = call.shader._warp
    config["shader_camera"] = None
    if call.shader_cameras is not None:
        config["shader_camera"] = _camera_config(call.shader_cameras)
    lights = _lights(call)
    config["lights"] = {"type": lights._warp, "names": list(lights._names)}
    config["materials"] = list(call.materials._names)
    bp = call.blend_params
    bg_tensor = isinstance(bp.background_color, torch.Tensor)
    config["blend"] = {
        "sigma": float(bp.sigma),
        "gamma": float(bp.gamma),
        "background_tensor": bg_tensor,
        "background": None if bg_tensor else [float(c) for c in bp.background_color],
    }
    config["z_planes"] = list(call.z_planes)
    tex = call.textures
    config["textures"] = None if tex is None else {"type": tex.kind, "static": tex.static}
    return config


def call_tensors(call, device) -> list[torch.Tensor]:
    """The op's tensors of ``call``, in the order its configuration names them, on
    ``device`` (None: where they are)."""
    tensors = [_dev(getattr(call.cameras, n), device) for n in call.cameras._names]
    if call.shader is None:
        return tensors
    own = call.shader_cameras
    if own is not None:
        tensors += [_dev(getattr(own, n), device) for n in own._names]
    lights = _lights(call)
    tensors += [_dev(getattr(lights, n), device) for n in lights._names]
    mats = call.materials
    tensors += [_dev(getattr(mats, n), device) for n in mats._names]
    bg = call.blend_params.background_color
    if isinstance(bg, torch.Tensor):
        tensors.append(_f32(bg, device, 3))
    tensors += [_f32(v, device).reshape(-1) for v in call.z_planes.values()]
    if call.textures is not None:
        tensors += [_dev(t, device) for t in call.textures.tensors]
    return tensors


def config_and_tensors(call, device) -> tuple[dict, list[torch.Tensor]]:
    """The op's configuration and tensor list for one call (a :class:`RenderCall`-like
    object: cameras, shader_cameras, raster_settings, shader, lights, materials,
    blend_params, z_planes, textures (a ``PackedTextures`` or None))."""
    return _config(call), call_tensors(call, device)


# ----------------------------------------------------------------------------- kept strings
def _camera_key(cams, key: list, values: list) -> None:
    kwargs = cams._warp_kwargs()
    key += (cams._warp, cams._names, tuple(kwargs))
    values.extend(kwargs.values())


def _config_key(call, flags: tuple) -> tuple:
    """Everything :func:`_config` reads from ``call``, and the per-call ``flags``, as
    one hashable key: (the structure: class names, tensor names, field counts, the
    flags (bools made here), as they are; the values a user sets (settings fields,
    camera options, blend values taken as :func:`_config` takes them, texture
    options), each as its ``repr``, which tells apart whatever their JSON tells apart
    (1, 1.0 and True are equal in Python, not in JSON; -0.0 == 0.0)). A value whose
    repr is not exact (a tensor where a number belongs) fails the JSON encoding
    anyway, so no string is ever kept under it. The structure fixes where each value
    sits in the flat list of values."""
    s = call.raster_settings
    values = [getattr(s, k) for k in _RASTER_FIELDS]
    values += (call.z_clip_value, s.image_size)
    key = [flags]
    _camera_key(call.cameras, key, values)
    if call.shader is not None:
        own = call.shader_cameras
        if own is None:
            key.append(None)
        else:
            _camera_key(own, key, values)
        lights = _lights(call)
        bp = call.blend_params
        bg = bp.background_color
        tex = call.textures
        key += (call.shader._warp, lights._warp, lights._names, call.materials._names,
                tuple(call.z_planes))  # fmt: skip
        values += (float(bp.sigma), float(bp.gamma))
        if isinstance(bg, torch.Tensor):
            key.append(None)
        else:
            bg = [float(c) for c in bg]
            key.append(len(bg))
            values += bg
        if tex is None:
            key.append(None)
        else:
            key += (tex.kind, tuple(tex.static))
            values.extend(tex.static.values())
    return tuple(key), tuple(map(repr, values))


_KEPT: collections.OrderedDict = collections.OrderedDict()
_KEPT_LOCK = threading.Lock()


def _flags(tensors: list, verts, antialias: bool, later: bool) -> dict:
    """The configuration's per-call entries."""
    flags = {}
    if antialias:
        flags["antialias"] = True
    # (a tuple: hashable in the kept strings' key; JSON writes it as a list)
    needs = tuple([t.requires_grad for t in tensors])
    # record the Warp launches for the backward when autograd will ask for it
    flags["record"] = torch.is_grad_enabled() and (verts.requires_grad or any(needs))
    # only the tensors that require gradients get them computed (issue 29)
    flags["needs_grad"] = needs
    if later:  # the caller reads the fragments from the op's buffers, if at all
        flags["fragments"] = False
    return flags


def call_config(call, verts, *, antialias: bool = False, later: bool = False
                ) -> tuple[str, list[torch.Tensor]]:  # fmt: skip
    """(configuration JSON, tensors) of one call rendering ``verts``: those of
    :func:`config_and_tensors` with the per-call entries (``antialias``, ``record``,
    ``needs_grad``, ``fragments``), as :func:`config_json` encodes them. Outside
    ``torch.compile`` the string is kept per configuration (the 64 used last): a
    repeated call reads the values it holds and finds it."""
    tensors = call_tensors(call, verts.device)
    flags = _flags(tensors, verts, antialias, later)
    if torch.compiler.is_compiling():
        return config_json({**_config(call), **flags}), tensors
    key = _config_key(call, tuple(flags.items()))
    with _KEPT_LOCK:
        config = _KEPT.get(key)
        if config is not None:
            _KEPT.move_to_end(key)
            return config, tensors
    config = json.dumps({**_config(call), **flags})
    with _KEPT_LOCK:
        _KEPT[key] = config
        while len(_KEPT) > 64:
            _KEPT.popitem(last=False)
    return config, tensors


def packed(verts, faces, first, count):
    """The checked packed batch (structure; the op checks the index values): float32
    contiguous verts, integer faces and per-mesh ranges as given (cast in the op)."""
    verts, faces, first, count, _ = check_packed(verts, faces, first, count)
    if verts.dtype != torch.float32:
        verts = verts.to(torch.float32)
    return verts.contiguous(), faces.contiguous(), first, count


@torch._dynamo.assume_constant_result
def config_json(config: dict) -> str:
    """The op's static configuration as JSON (a constant for torch.compile)."""
    return json.dumps(config)
