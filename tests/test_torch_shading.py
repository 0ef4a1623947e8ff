"""The torch entry: warpraster.torch.shading's MeshRenderer against real PyTorch3D
(reference cases r02-r09), gradients to every tensor, torch.compile."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import p3d_render_cases as cases  # noqa: E402
from test_shaders import (  # noqa: E402
    GRAD_TOL,
    IMAGE_FRACTION,
    IMAGE_TOL,
    IMAGE_TOL_MAX,
    RASTER_BACKWARD_OPEN,  # noqa: E402
)

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
