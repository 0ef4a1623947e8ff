"""Per-face materials: a material table and (F,) ids, lit by the one shading core.

Truths: for the hard shaders, the composite of one render per material row (a
pixel shows the render of its front face's material: the same float32
operations); for the soft shaders, a float64 NumPy oracle of PyTorch3D's
lighting and softmax blend (tests/np_shading.py) evaluated on the render's own
fragments with each slot's own material; gradients to the table's rows against
central differences.
"""

from __future__ import annotations

import np_shading as ref
import numpy as np
import pytest
import warp as wp

import warpraster as wr
from warpraster import shading
from warpraster.primitives import ico_sphere
from warpraster.renderer import MeshRenderer, Renderer

ROWS = dict(
    ambient_color=[[0.2, 0.1, 0.1], [0.05, 0.2, 0.05], [0.1, 0.1, 0.3]],
    diffuse_color=[[0.9, 0.3, 0.2], [0.2, 0.8, 0.3], [0.3, 0.4, 0.9]],
    specular_color=[[0.5, 0.5, 0.5], [0.1, 0.1, 0.1], [0.9, 0.8, 0.7]],
    shininess=[10.0, 40.0, 80.0],
)


def _scene(device, rows=ROWS, requires_grad=False):
    v, f = ico_sphere(2)
    v = (v * 0.9).astype(np.float32)
    ids = (np.arange(len(f)) * 7 % 3).astype(np.int32)  # every row on many faces
    R, T = wr.look_at_view_transform(dist=3.0, elev=20.0, azim=30.0)
    cams = wr.FoVPerspectiveCameras(R=R, T=T, fov=50.0, device=device)
    lights = shading.PointLights(location=[[1.5, 2.0, 2.5]], device=device)
    mats = shading.Materials(**{k: np.array(x, np.float32) for k, x in rows.items()},
                             device=device, requires_grad=requires_grad)  # fmt: skip
    return v, f.astype(np.int32), ids, cams, lights, mats


def _row(rows, m):
    return {k: np.array(x, np.float32)[m : m + 1] for k, x in rows.items()}


@pytest.mark.parametrize("shader_cls", [shading.HardPhongShader, shading.HardFlatShader])
def test_hard_shaders_show_each_faces_own_material(shader_cls, device):
    v, f, ids, cams, lights, mats = _scene(device)
    settings = wr.RasterizationSettings(image_size=(40, 48), faces_per_pixel=1)
    shader = shader_cls(cameras=cams, lights=lights, materials=mats)
    r = Renderer(cameras=cams, raster_settings=settings, shader=shader, faces=f,
                 mesh_to_face_first_idx=[0], num_faces_per_mesh=[len(f)], num_verts=len(v),
                 face_materials=ids)  # fmt: skip
    out = r.render(wp.array(v, dtype=wp.vec3, device=device))
    got = out.image.numpy()
    p2f = out.face_ids.numpy()
    want = np.zeros_like(got)
    for m in range(3):
        one = shader_cls(cameras=cams, lights=lights,
                         materials=shading.Materials(device=device, **_row(ROWS, m)))  # fmt: skip
        r1 = Renderer(cameras=cams, raster_settings=settings, shader=one, faces=f,
                      mesh_to_face_first_idx=[0], num_faces_per_mesh=[len(f)],
                      num_verts=len(v))  # fmt: skip
        img = r1.render(wp.array(v, dtype=wp.vec3, device=device)).image.numpy()
        sel = (p2f >= 0) & (ids[np.maximum(p2f, 0)] == m)
        want[sel] = img[sel]
        if m == 0:
            want[p2f < 0] = img[p2f < 0]  # background
    assert len(np.unique(ids[p2f[p2f >= 0]])) == 3  # all three materials are seen
    # the same float32 operations on the same values (the Renderer's vertex normals
    # are gathered in a fixed order): equal bit for bit
    np.testing.assert_array_equal(got, want)
    # and the MeshRenderer takes the ids per call, with the same result (its vertex
    # normals are summed with atomics: on CUDA their order varies, a few ulps)
    mr = MeshRenderer(rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=settings),
                      shader=shader)  # fmt: skip
    img = mr(wp.array(v, dtype=wp.vec3, device=device), f, [0], [len(f)], face_materials=ids)
    if wp.get_device(device).is_cpu:
        np.testing.assert_array_equal(img.numpy(), got)
    else:
        np.testing.assert_allclose(img.numpy(), got, rtol=0, atol=1e-6)


def _vertex_normals(v, f):
    n = np.zeros_like(v)
    for c in range(3):
        i, j, k = f[:, c], f[:, (c + 1) % 3], f[:, (c + 2) % 3]
        np.add.at(n, i, np.cross(v[j] - v[i], v[k] - v[i]))
    return ref.normalize(n)


def _soft_oracle(v, f, ids, frags, cams, rows, light, sigma, gamma, znear, zfar):
    """float64 softmax-blended Phong image with each slot's own material row."""
    p2f = frags.pix_to_face.numpy()
    bary = frags.bary_coords.numpy().astype(np.float64)
    v64, nrm = v.astype(np.float64), _vertex_normals(v.astype(np.float64), f)
    fi = np.maximum(p2f, 0)
    corners = f[fi]  # (N, H, W, K, 3)
    points = np.einsum("...c,...cd->...d", bary, v64[corners])
    normals = np.einsum("...c,...cd->...d", bary, nrm[corners])
    m = ids[fi]
    table = {k: np.asarray(x, np.float64) for k, x in rows.items()}
    eye = ref.camera_centre(cams.R.numpy().astype(np.float64), cams.T.numpy().astype(np.float64))
    colours = ref.lit(
        "point", np.asarray(light, np.float64), np.array([0.5] * 3), np.array([0.3] * 3),
        np.array([0.2] * 3), table["ambient_color"][m], table["diffuse_color"][m],
        table["specular_color"][m], table["shininess"][m], points, normals, 1.0, eye[0],
    )  # fmt: skip
    return ref.softmax_blend(p2f, frags.dists.numpy().astype(np.float64),
                             frags.zbuf.numpy().astype(np.float64), colours,
                             np.ones(3), sigma, gamma, znear, zfar)  # fmt: skip


def test_soft_phong_blends_each_slots_own_material(device):
    v, f, ids, cams, lights, mats = _scene(device)
    settings = wr.RasterizationSettings(image_size=32, faces_per_pixel=4, blur_radius=2e-4)
    # gamma 1e-2, not PyTorch3D's 1e-4: exp((zinv - zmax) / gamma) multiplies the
    # float32 rounding of zinv by 1 / gamma, which at 1e-4 is 1e-3 of a weight;
    # this test is about each slot's material, not the blend's conditioning
    blend = shading.BlendParams(sigma=1e-4, gamma=1e-2)
    shader = shading.SoftPhongShader(cameras=cams, lights=lights, materials=mats,
                                     blend_params=blend)  # fmt: skip
    mr = MeshRenderer(rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=settings),
                      shader=shader)  # fmt: skip
    verts = wp.array(v, dtype=wp.vec3, device=device)
    img, frags = mr(verts, f, [0], [len(f)], face_materials=ids, return_fragments=True)
    want = _soft_oracle(v, f, ids, frags, cams, ROWS, [1.5, 2.0, 2.5], 1e-4, 1e-2, 1.0, 100.0)
    # float32 lighting and blend against float64 on the same fragments: PyTorch3D's
    # formulas in float32 differ from float64 by a few ulps of values <= ~2
    np.testing.assert_allclose(img.numpy(), want, rtol=0, atol=2e-5)


def test_material_table_gradients_match_central_differences(device):
    v, f, ids, cams, lights, mats = _scene(device, requires_grad=True)
    settings = wr.RasterizationSettings(image_size=24, faces_per_pixel=4, blur_radius=2e-4)
    blend = shading.BlendParams(sigma=1e-4, gamma=1e-4)

    def renderer(materials):
        shader = shading.SoftPhongShader(cameras=cams, lights=lights, materials=materials,
                                         blend_params=blend)  # fmt: skip
        return Renderer(cameras=cams, raster_settings=settings, shader=shader, faces=f,
                        mesh_to_face_first_idx=[0], num_faces_per_mesh=[len(f)],
                        num_verts=len(v), face_materials=ids, channels=())  # fmt: skip

    rng = np.random.default_rng(2)
    weights = rng.standard_normal((1, 24, 24, 4)).astype(np.float32)
    verts = wp.array(v, dtype=wp.vec3, device=device)
    r = renderer(mats)
    tape = wp.Tape()
    with tape:
        out = r.render(verts)
    tape.backward(grads={out.image: wp.array(weights, dtype=wp.float32, device=device)})
    analytic = {k: a.grad.numpy().copy() for k, a in mats.parameters().items()}

    def loss(rows):
        img = renderer(shading.Materials(device=device, **rows)).render(verts).image.numpy()
        return float((img.astype(np.float64) * weights).sum())

    base = {k: np.array(x, np.float32) for k, x in ROWS.items()}
    for name, h in (("diffuse_color", 1e-2), ("specular_color", 1e-2), ("shininess", 0.5)):
        # the image is linear in the colours (any step is exact up to float32
        # rounding of the sums, ~1e-6 relative); shininess enters as v.r^s, smooth
        # away from v.r = 0, where a 0.5 step on exponents 10-80 leaves a
        # curvature error below 1e-3 relative
        fd = np.zeros_like(base[name], dtype=np.float64)
        for idx in np.ndindex(base[name].shape):
            plus = {k: x.copy() for k, x in base.items()}
            minus = {k: x.copy() for k, x in base.items()}
            plus[name][idx] += h
            minus[name][idx] -= h
            fd[idx] = (loss(plus) - loss(minus)) / (2 * h)
        got = analytic[name].reshape(fd.shape)
        assert np.abs(fd).max() > 0
        err = np.linalg.norm(got - fd) / np.linalg.norm(fd)
        assert err < 2e-3, (name, err)


def test_bad_face_materials_are_refused_before_any_kernel(device):
    v, f, ids, cams, lights, mats = _scene(device)
    settings = wr.RasterizationSettings(image_size=8, faces_per_pixel=1)
    kw = dict(cameras=cams, raster_settings=settings, faces=f, mesh_to_face_first_idx=[0],
              num_faces_per_mesh=[len(f)], num_verts=len(v))  # fmt: skip
    phong = shading.HardPhongShader(cameras=cams, lights=lights, materials=mats)
    with pytest.raises(ValueError, match=r"face_materials\[0\] = 3"):
        Renderer(shader=phong, face_materials=ids + 3, **kw)
    with pytest.raises(ValueError, match="face_materials must have length"):
        Renderer(shader=phong, face_materials=ids[:-1], **kw)
    with pytest.raises(TypeError, match="face_materials must hold integers"):
        Renderer(shader=phong, face_materials=ids.astype(np.float32), **kw)
    gouraud = shading.HardGouraudShader(cameras=cams, lights=lights, materials=mats)
    with pytest.raises(ValueError, match="face_materials"):
        Renderer(shader=gouraud, face_materials=ids, **kw)
