"""The torch entry: warpraster.torch.shading's MeshRenderer against real PyTorch3D
(reference cases r02-r09), gradients to every tensor, torch.compile."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import p3d_render_cases as cases  # noqa: E402
import warp as wp  # noqa: E402
from test_shaders import (  # noqa: E402
    GRAD_TOL,
    IMAGE_FRACTION,
    IMAGE_TOL,
    IMAGE_TOL_MAX,
    RASTER_BACKWARD_OPEN,  # noqa: E402
)

import warpraster.torch as wrt  # noqa: E402
from warpraster.torch import shading as T  # noqa: E402

CASES = cases.case_names()


def torch_scene(name):
    """(d, spec, renderer, inputs, leaves) for the torch MeshRenderer (cpu tensors)."""
    d, spec = cases.load(name)
    c = spec["camera"]
    R, Tt = torch.tensor(d["cam_R"]), torch.tensor(d["cam_T"])
    if c["type"] == "FoVPerspectiveCameras":
        cams = T.FoVPerspectiveCameras(
            znear=torch.tensor(d["cam_znear"]),
            zfar=torch.tensor(d["cam_zfar"]),
            fov=torch.tensor(d["cam_fov"]),
            aspect_ratio=torch.tensor(d["cam_aspect_ratio"]),
            R=R,
            T=Tt,
        )
    else:
        cams = T.FoVOrthographicCameras(
            znear=torch.tensor(d["cam_znear"]),
            zfar=torch.tensor(d["cam_zfar"]),
            min_x=c["min_x"],
            max_x=c["max_x"],
            min_y=c["min_y"],
            max_y=c["max_y"],
            R=R,
            T=Tt,
        )
    light = spec["lights"]
    leaves = {}
    colours = {
        k: [light[k]] for k in ("ambient_color", "diffuse_color", "specular_color") if k in light
    }
    if light["type"] == "PointLights":
        leaves["light_location"] = torch.tensor(d["light_location"], requires_grad=True)
        lights = T.PointLights(location=leaves["light_location"], **colours)
    elif light["type"] == "DirectionalLights":
        leaves["light_direction"] = torch.tensor(d["light_direction"], requires_grad=True)
        lights = T.DirectionalLights(direction=leaves["light_direction"], **colours)
    else:
        lights = T.AmbientLights(ambient_color=colours["ambient_color"])
    m = spec["materials"]
    mats = T.Materials(
        ambient_color=[m["ambient_color"]],
        diffuse_color=[m["diffuse_color"]],
        specular_color=[m["specular_color"]],
        shininess=m["shininess"],
    )
    b = spec["blend"]
    bp = T.BlendParams(
        sigma=b["sigma"], gamma=b["gamma"], background_color=tuple(b["background_color"])
    )
    if spec["shader"] == "SoftSilhouetteShader":
        shader = T.SoftSilhouetteShader(blend_params=bp)
    else:
        shader = getattr(T, spec["shader"])(
            cameras=cams, lights=lights, materials=mats, blend_params=bp
        )
    ren = T.MeshRenderer(
        rasterizer=T.MeshRasterizer(cameras=cams, raster_settings=cases.raster_settings(spec)),
        shader=shader,
    )
    leaves["verts"] = torch.tensor(d["verts_packed"], requires_grad=True)
    if "vertex_colors" in d:
        leaves["vertex_colors"] = torch.tensor(d["vertex_colors"], requires_grad=True)
        tex = T.TexturesVertex(leaves["vertex_colors"])
    else:
        t = spec["texture"]
        leaves["texture_maps"] = torch.tensor(d["texture_maps"], requires_grad=True)
        leaves["verts_uvs"] = torch.tensor(d["verts_uvs"], requires_grad=True)
        tex = T.TexturesUV(
            leaves["texture_maps"],
            torch.tensor(d["faces_uvs"]),
            leaves["verts_uvs"],
            padding_mode=t["padding_mode"],
            align_corners=t["align_corners"],
            sampling_mode=t["sampling_mode"],
        )
    inputs = (
        leaves["verts"],
        torch.tensor(d["faces_packed"]),
        torch.tensor(d["mesh_to_face_first_idx"]),
        torch.tensor(d["num_faces_per_mesh"]),
    )
    return d, spec, ren, inputs, tex, leaves


@pytest.mark.parametrize("name", CASES)
def test_torch_reference_images_and_gradients(name):
    d, spec, ren, inputs, tex, leaves = torch_scene(name)
    img = ren(*inputs, textures=tex)
    np.testing.assert_array_equal(ren.fragments.pix_to_face.numpy(), d["pix_to_face"])
    err = np.abs(img.detach().numpy() - d["images"])  # tolerances argued in test_shaders.py
    assert err.max() <= IMAGE_TOL_MAX and (err <= IMAGE_TOL).mean() >= IMAGE_FRACTION
    (img * torch.tensor(d["grad_images"])).sum().backward()
    for key, leaf in leaves.items():
        if key == "verts":
            continue
        theirs = d[f"grad_{key}"]
        assert cases.rel_l2(leaf.grad.numpy(), theirs) <= GRAD_TOL, key
    if name in RASTER_BACKWARD_OPEN or spec["shader"] == "HardFlatShader":
        return  # vertex gradients: see test_shaders.py (the Warp entry runs the same kernels)
    assert cases.rel_l2(leaves["verts"].grad.numpy(), d["grad_verts"]) <= GRAD_TOL


def test_torch_camera_and_material_gradients_match_finite_differences():
    # T of the camera and the material's diffuse colour are trainable tensors:
    # autograd through the custom op vs central differences of the float32 render
    # (h = 1e-3; the sum of ~1e3 pixel values rounds at ~1e-4: 5e-2 relative).
    d, spec, ren, inputs, tex, leaves = torch_scene("r02_hardphong_point_vertexcolor")
    cams = ren.rasterizer.cameras
    cams.T = cams.T.clone().requires_grad_(True)
    mats = ren.shader.materials
    mats.diffuse_color = mats.diffuse_color.clone().requires_grad_(True)
    g = torch.tensor(d["grad_images"])

    def loss():
        return (ren(*inputs, textures=tex) * g).sum()

    loss().backward()
    for holder, name, idx in ((mats, "diffuse_color", (0, 1)), (cams, "T", (0, 2))):
        analytic = getattr(holder, name).grad[idx].item()
        base = getattr(holder, name).detach().clone()
        vals = []
        for s in (1, -1):
            p = base.clone()
            p[idx] += s * 1e-3
            setattr(holder, name, p)
            with torch.no_grad():
                vals.append(loss().item())
        setattr(holder, name, base)
        fd = (vals[0] - vals[1]) / 2e-3
        assert abs(analytic - fd) <= 5e-2 * max(abs(fd), 1.0), (name, analytic, fd)


def test_torch_compile_fullgraph_render_and_backward():
    d, spec, ren, inputs, tex, leaves = torch_scene("r03_softphong_directional_k8")
    g = torch.tensor(d["grad_images"])

    def step(verts, colors):
        img = ren(verts, *inputs[1:], textures=T.TexturesVertex(colors))
        return (img * g).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    v = leaves["verts"]
    c = leaves["vertex_colors"]
    loss = compiled(v, c)
    loss.backward()
    assert cases.rel_l2(v.grad.numpy(), d["grad_verts"]) <= GRAD_TOL
    assert cases.rel_l2(c.grad.numpy(), d["grad_vertex_colors"]) <= GRAD_TOL


def test_torch_bad_input_raises():
    d, spec, ren, inputs, tex, leaves = torch_scene("r02_hardphong_point_vertexcolor")
    with pytest.raises(ValueError, match="verts"):
        ren(inputs[0][:, :2], *inputs[1:], textures=tex)
    with pytest.raises(TypeError, match="textures"):
        ren(*inputs, textures="wood")


def test_torch_lights_and_materials_take_pytorch3d_arguments_and_defaults():
    # PyTorch3D's documented defaults (pytorch3d.renderer.lighting and .materials), in its order
    grey = {"ambient_color": 0.5, "diffuse_color": 0.3, "specular_color": 0.2}
    white = {"ambient_color": 1.0, "diffuse_color": 1.0, "specular_color": 1.0}
    p3d = {
        T.PointLights: {**grey, "location": (0.0, 1.0, 0.0)},
        T.DirectionalLights: {**grey, "direction": (0.0, 1.0, 0.0)},
        T.Materials: {**white, "shininess": 64.0},
    }
    for cls, defaults in p3d.items():
        got = cls().tensors()
        assert list(got) == list(defaults)  # the op's tensor order is the argument order
        for name, value in defaults.items():
            shape = (1,) if name == "shininess" else (1, 3)
            want = torch.broadcast_to(torch.tensor(value, dtype=torch.float32), shape)
            assert torch.equal(got[name], want), (cls.__name__, name)
        # positional arguments in PyTorch3D's order, then the device
        values = [torch.rand(2, 3) for _ in defaults]
        if cls is T.Materials:
            values[-1] = torch.rand(2)
        by_position = cls(*values, "cpu").tensors()
        by_name = cls(**dict(zip(defaults, values, strict=True)), device="cpu").tensors()
        for name in defaults:
            assert torch.equal(by_position[name], by_name[name])
    with pytest.raises(TypeError):
        T.PointLights(direction=(0.0, 0.0, 1.0))  # a directional light's argument


# ----------------------------------------------------------------------------- input checks
def _small_scene():
    """Two triangles in front of a default camera: (verts, faces, first, count)."""
    verts = torch.tensor(
        [[-1.0, -1.0, 3.0], [1.0, -1.0, 3.0], [0.0, 1.0, 3.0],
         [-1.0, 1.0, 4.0], [1.0, 1.0, 4.0], [0.0, -1.0, 4.0]]
    )  # fmt: skip
    faces = torch.tensor([[0, 1, 2], [3, 4, 5]])
    return verts, faces, torch.tensor([0]), torch.tensor([2])


def _entry_points():
    """name -> call(verts, faces, first, count): the torch entry points over packed meshes."""
    cams = T.FoVPerspectiveCameras()
    settings = T.RasterizationSettings(image_size=8, faces_per_pixel=1)
    rasterizer = T.MeshRasterizer(cameras=cams, raster_settings=settings)
    renderer = T.MeshRenderer(rasterizer, T.HardPhongShader(cameras=cams))
    return {
        "rasterize_meshes": lambda v, f, fi, c: wrt.rasterize_meshes(v, f, fi, c, image_size=8),
        "MeshRasterizer": rasterizer,
        "MeshRenderer": renderer,
    }


# (argument index, bad value from the good scene, error, what the message names)
_BAD_PACKED = {
    "int64 faces past 2**32 (would wrap to valid ones)": (
        1, lambda f: f + 2**32, ValueError, "faces(_packed)? has values that do not fit in int32"),
    "faces on another device": (
        1, lambda f: f.to("meta"), ValueError, "faces(_packed)? is on meta"),
    "integer vertices": (0, lambda v: v.long(), TypeError, "verts(_packed)? must be a floating"),
    "float faces": (1, lambda f: f.float() + 0.5, TypeError, "faces(_packed)? must be an integer"),
    "fractional first": (2, lambda fi: torch.tensor([0.5]), TypeError, "mesh_to_face_first_idx"),
    "fractional first (list)": (2, lambda fi: [0.5], TypeError, "mesh_to_face_first_idx"),
    "fractional count": (3, lambda c: torch.tensor([2.0]), TypeError, "num_faces_per_mesh"),
    "negative face index": (1, lambda f: f - 1, ValueError, r"faces(_packed)? has vertex indices"),
    "face index == V": (1, lambda f: f + 1, ValueError, r"faces(_packed)? has vertex indices"),
    "count not adding up": (3, lambda c: c + 1, ValueError, "num_faces_per_mesh adds up to 3"),
    "first and count of different lengths": (
        2, lambda fi: torch.tensor([0, 1]), ValueError, "num_faces_per_mesh has 1 entries"),
    "first past the faces": (2, lambda fi: fi + 1, ValueError, "running sum"),
}  # fmt: skip


@pytest.mark.parametrize("entry", ["rasterize_meshes", "MeshRasterizer", "MeshRenderer"])
@pytest.mark.parametrize("case", list(_BAD_PACKED))
def test_every_torch_entry_point_checks_packed_inputs_before_any_kernel(entry, case, monkeypatch):
    """The renderer and rasterizer refuse what rasterize_meshes refuses (one check
    path): int64 faces that would wrap to valid int32 indices, tensors on another
    device, integer vertices, float faces, fractional per-mesh ranges, indices out of
    range, per-mesh ranges that do not add up. Each raises naming the argument, and
    before any Warp kernel is launched."""
    index, bad, error, match = _BAD_PACKED[case]
    args = list(_small_scene())
    args[index] = bad(args[index])
    call = _entry_points()[entry]
    launches = []
    monkeypatch.setattr(wp, "launch", lambda *a, **k: launches.append(a))
    with pytest.raises(error, match=match):
        call(*args)
    assert launches == []


def test_torch_texture_holders_check_their_tensors():
    """TexturesUV / TexturesVertex refuse float UV faces, int64 UV faces past int32,
    UV faces out of range and non-float maps, naming the argument; the renderer
    refuses texture rows that do not match the mesh."""
    maps, uvs = torch.rand(1, 4, 4, 3), torch.rand(3, 2)
    with pytest.raises(TypeError, match="faces_uvs must be an integer"):
        T.TexturesUV(maps, torch.zeros(2, 3), uvs)
    with pytest.raises(ValueError, match="faces_uvs has values that do not fit in int32"):
        T.TexturesUV(maps, torch.zeros(2, 3, dtype=torch.int64) + 2**32, uvs)
    with pytest.raises(ValueError, match="faces_uvs has indices in"):
        T.TexturesUV(maps, torch.full((2, 3), 3), uvs)
    with pytest.raises(TypeError, match="maps must be a floating"):
        T.TexturesUV(maps.to(torch.uint8), torch.zeros(2, 3, dtype=torch.int64), uvs)
    with pytest.raises(ValueError, match="verts_uvs must have shape"):
        T.TexturesUV(maps, torch.zeros(2, 3, dtype=torch.int64), torch.rand(3, 3))
    with pytest.raises(TypeError, match="verts_features must be a floating"):
        T.TexturesVertex(torch.ones(6, 3, dtype=torch.int64))
    renderer = _entry_points()["MeshRenderer"]
    with pytest.raises(ValueError, match="verts_features has 5 rows for 6 vertices"):
        renderer(*_small_scene(), textures=T.TexturesVertex(torch.rand(5, 3)))
    with pytest.raises(ValueError, match="faces_uvs has 1 faces, faces has 2"):
        one_face = T.TexturesUV(maps, torch.zeros(1, 3, dtype=torch.int64), uvs)
        renderer(*_small_scene(), textures=one_face)
