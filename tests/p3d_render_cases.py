"""The PyTorch3D renderer reference cases r02-r09 (tests/data/pytorch3d-render).

Loads a case and builds its scene for the Warp entry point (the torch tests
reuse the parsed parameters). ``WARPRASTER_P3D_RENDER`` names another directory
of cases with the same format (hidden cases).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import warp as wp

import warpraster as wr
from warpraster import shading
from warpraster.renderer import MeshRenderer

DATA = Path(
    os.environ.get(
        "WARPRASTER_P3D_RENDER", Path(__file__).resolve().parent / "data" / "pytorch3d-render"
    )
)


def case_names() -> list[str]:
    """Every render case (kind == "render") in the data directory."""
    names = []
    for p in sorted(DATA.glob("*.npz")):
        with np.load(p, allow_pickle=False) as d:
            if json.loads(str(d["spec"])).get("kind") == "render":
                names.append(p.stem)
    return names


def load(name: str) -> tuple[dict, dict]:
    """(arrays, resolved spec) of a case."""
    with np.load(DATA / f"{name}.npz", allow_pickle=False) as f:
        d = {k: f[k] for k in f.files}
    spec = json.loads(str(d["spec"]))
    resolved = spec["resolved"]
    resolved["effective"] = spec["effective"]
    return d, resolved


def cameras(d: dict, spec: dict, device):
    c = spec["camera"]
    common = dict(
        znear=d["cam_znear"], zfar=d["cam_zfar"], R=d["cam_R"], T=d["cam_T"], device=device
    )
    if c["type"] == "FoVPerspectiveCameras":
        return wr.FoVPerspectiveCameras(
            fov=d["cam_fov"], aspect_ratio=d["cam_aspect_ratio"], **common
        )
    if c["type"] == "FoVOrthographicCameras":
        return wr.FoVOrthographicCameras(
            min_x=c["min_x"],
            max_x=c["max_x"],
            min_y=c["min_y"],
            max_y=c["max_y"],
            scale_xyz=[c["scale_xyz"]],
            **common,
        )
    raise NotImplementedError(c["type"])


def lights(d: dict, spec: dict, device, requires_grad: bool = True):
    light = spec["lights"]
    colours = {
        k: light[k] for k in ("ambient_color", "diffuse_color", "specular_color") if k in light
    }
    if light["type"] == "PointLights":
        return shading.PointLights(
            location=d["light_location"], device=device, requires_grad=requires_grad, **colours
        )
    if light["type"] == "DirectionalLights":
        return shading.DirectionalLights(
            direction=d["light_direction"], device=device, requires_grad=requires_grad, **colours
        )
    return shading.AmbientLights(ambient_color=light["ambient_color"], device=device)


def materials(spec: dict, device):
    return shading.Materials(device=device, **spec["materials"])


def blend_params(spec: dict):
    b = spec["blend"]
    return shading.BlendParams(
        sigma=b["sigma"], gamma=b["gamma"], background_color=tuple(b["background_color"])
    )


def raster_settings(spec: dict):
    """The case's settings, with ``exact_perspective_grad=False``: these cases hold
    PyTorch3D's gradients, which at a clamped perspective denominator (r08, r09)
    are not the derivative that the default gives (docs/BACKWARD.md)."""
    r = spec["raster"]
    return wr.RasterizationSettings(
        exact_perspective_grad=False,
        image_size=tuple(r["image_size"]),
        blur_radius=r["blur_radius"],
        faces_per_pixel=r["faces_per_pixel"],
        bin_size=r["bin_size"],
        perspective_correct=r["perspective_correct"],
        clip_barycentric_coords=r["clip_barycentric_coords"],
        cull_backfaces=r["cull_backfaces"],
        z_clip_value=r["z_clip_value"],
    )


def textures(d: dict, spec: dict, device, requires_grad: bool = True):
    t = spec["texture"]
    if t["type"] == "TexturesVertex":
        return shading.TexturesVertex(
            d["vertex_colors"], device=device, requires_grad=requires_grad
        )
    return shading.TexturesUV(
        d["texture_maps"],
        d["faces_uvs"].astype(np.int32),
        d["verts_uvs"],
        padding_mode=t["padding_mode"],
        align_corners=t["align_corners"],
        sampling_mode=t["sampling_mode"],
        device=device,
        requires_grad=requires_grad,
    )


def warp_scene(name: str, device, requires_grad: bool = True):
    """(d, spec, renderer, verts, textures, lights) for the Warp ``MeshRenderer``."""
    d, spec = load(name)
    cams = cameras(d, spec, device)
    lts = lights(d, spec, device, requires_grad)
    shader_cls = getattr(shading, spec["shader"])
    shader = shader_cls(
        cameras=cams, lights=lts, materials=materials(spec, device), blend_params=blend_params(spec)
    )
    renderer = MeshRenderer(
        rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=raster_settings(spec)),
        shader=shader,
    )
    verts = wp.array(d["verts_packed"], dtype=wp.vec3, device=device, requires_grad=requires_grad)
    tex = textures(d, spec, device, requires_grad)
    return d, spec, renderer, verts, tex, lts


def texture_grads(d: dict, tex) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (ours, PyTorch3D's) for the texture gradients of a case."""
    if "grad_vertex_colors" in d:
        return {"vertex_colors": (tex.verts_features.grad.numpy(), d["grad_vertex_colors"])}
    return {
        "texture_maps": (tex.maps.grad.numpy(), d["grad_texture_maps"]),
        "verts_uvs": (tex.verts_uvs.grad.numpy(), d["grad_verts_uvs"]),
    }


def light_grads(d: dict, lts) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for key in ("location", "direction"):
        if f"grad_light_{key}" in d:
            out[f"light_{key}"] = (getattr(lts, key).grad.numpy(), d[f"grad_light_{key}"])
    return out


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| (0 when both are 0)."""
    nb = float(np.linalg.norm(np.asarray(b, np.float64)))
    na = float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
    return na / nb if nb > 0 else na


def face_normal_bug_delta(verts: np.ndarray, faces: np.ndarray, grad_normals: np.ndarray):
    """What PyTorch3D's CPU ``face_areas_normals`` backward adds to the true vertex gradient.

    Its ``grad_v1_z`` term for ``grad_normals[:, 1]`` multiplies by ``cx`` where the
    derivative has ``cy`` (the six other z/y terms are right), so its ``verts``
    gradient of ``faces_normals_packed`` is off by
    ``(cy - cx) * (bx cy - by cx) / |c|^3 * g_y`` at every face's vertex 1, z.
    """
    v = verts.astype(np.float32)
    a = v[faces[:, 1]] - v[faces[:, 0]]
    b = v[faces[:, 2]] - v[faces[:, 0]]
    c = np.cross(a, b)
    norm = np.maximum(np.linalg.norm(c, axis=1), 1e-6)
    term = (c[:, 1] - c[:, 0]) * (b[:, 0] * c[:, 1] - b[:, 1] * c[:, 0]) / norm**3
    delta = np.zeros_like(v, dtype=np.float64)
    np.add.at(delta[:, 2], faces[:, 1], term * grad_normals[:, 1])
    return delta
