"""A non-finite vertex (NaN or inf) gets no gradient and poisons no other array.

Documented behaviour: a face with a NaN or inf vertex is never drawn, and the
other faces are unaffected. Truth: the same scene with those faces removed from
the packed faces (so nothing refers to the vertex). The image and every
gradient (vertices, camera R and T, lights, textures) must equal that scene's:
the faces' only other effect, their share of their neighbours' vertex normals,
is left out as well, forward and backward.
"""

from __future__ import annotations

import numpy as np
import p3d_render_cases as cases
import pytest
import warp as wp

import warpraster as wr
from warpraster import shading
from warpraster.renderer import MeshRenderer, Renderer

BAD = 5  # the vertex made non-finite (a vertex of every case's first mesh)


def _without_faces_of(d, vertex):
    """(faces, first, count) of the case with every face using ``vertex`` removed."""
    faces = d["faces_packed"].astype(np.int32)
    first, count = d["mesh_to_face_first_idx"], d["num_faces_per_mesh"]
    keep = ~(faces == vertex).any(1)
    new_first, new_count, kept = [], [], []
    for f0, c in zip(first, count, strict=True):
        k = np.nonzero(keep[f0 : f0 + c])[0] + f0
        new_first.append(len(kept))
        new_count.append(len(k))
        kept.extend(k.tolist())
    assert len(kept) < len(faces)  # the vertex is used: the case checks something
    return faces[kept], np.array(new_first, np.int32), np.array(new_count, np.int32)


def _cameras(d, spec, device):
    c = spec["camera"]
    kw = dict(znear=d["cam_znear"], zfar=d["cam_zfar"], R=d["cam_R"], T=d["cam_T"],
              device=device, requires_grad=True)  # fmt: skip
    if c["type"] == "FoVPerspectiveCameras":
        return wr.FoVPerspectiveCameras(fov=d["cam_fov"], aspect_ratio=d["cam_aspect_ratio"], **kw)
    return wr.FoVOrthographicCameras(min_x=c["min_x"], max_x=c["max_x"], min_y=c["min_y"],
                                     max_y=c["max_y"], scale_xyz=[c["scale_xyz"]],
                                     **kw)  # fmt: skip


def _render(name, device, faces, first, count, verts_np, entry):
    d, spec = cases.load(name)
    cams = _cameras(d, spec, device)
    lts = cases.lights(d, spec, device)
    cls = getattr(shading, spec["shader"])
    if spec["shader"] == "SoftSilhouetteShader":
        shader = cls(blend_params=cases.blend_params(spec))
    else:
        shader = cls(cameras=cams, lights=lts, materials=cases.materials(spec, device),
                     blend_params=cases.blend_params(spec))  # fmt: skip
    tex = cases.textures(d, spec, device)
    verts = wp.array(verts_np, dtype=wp.vec3, device=device, requires_grad=True)
    settings = cases.raster_settings(spec)
    tape = wp.Tape()
    if entry == "Renderer":
        r = Renderer(cameras=cams, raster_settings=settings, shader=shader, faces=faces,
                     mesh_to_face_first_idx=first, num_faces_per_mesh=count,
                     num_verts=len(verts_np), textures=tex)  # fmt: skip
        with tape:
            image = r.render(verts).image
    else:
        mr = MeshRenderer(rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=settings),
                          shader=shader)  # fmt: skip
        with tape:
            image = mr(verts, faces, first, count, textures=tex)
    tape.backward(grads={image: wp.array(d["grad_images"], dtype=wp.float32, device=device)})
    arrays = {"image": image, "verts": verts.grad, "R": cams.R.grad, "T": cams.T.grad}
    for owner, prefix in ((tex, "tex"), (lts, "light")):
        for key, a in vars(owner).items():
            if isinstance(a, wp.array) and a.grad is not None:
                arrays[f"{prefix}.{key}"] = a.grad
    return {k: a.numpy().copy() for k, a in arrays.items()}


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize(
    "name,entry",
    [
        ("r02_hardphong_point_vertexcolor", "Renderer"),
        ("r04_hardgouraud_batch2_nonsquare", "Renderer"),
        ("r06_hardflat_ortho", "Renderer"),
        ("r05_softsilhouette_k16", "Renderer"),
        ("r03_softphong_directional_k8", "MeshRenderer"),
    ],
)
def test_a_nonfinite_vertex_is_a_mesh_without_its_faces(name, entry, bad, device):
    d, _ = cases.load(name)
    v = d["verts_packed"].astype(np.float32)
    faces = d["faces_packed"].astype(np.int32)
    poisoned = v.copy()
    poisoned[BAD, 1] = bad
    got = _render(name, device, faces, d["mesh_to_face_first_idx"], d["num_faces_per_mesh"],
                  poisoned, entry)  # fmt: skip
    want = _render(name, device, *_without_faces_of(d, BAD), v, entry)
    for key, a in got.items():
        assert np.isfinite(a).all(), f"{key} has non-finite values"
    assert not got["verts"][BAD].any(), "the non-finite vertex got a gradient"
    assert np.abs(want["verts"]).max() > 0
    for key, w in want.items():
        # Same faces drawn, same per-slot values; the per-face tables and atomic
        # sums are indexed by face and the faces are renumbered, which on CUDA
        # reorders float32 atomics. A light's or camera's gradient sums ~10^4
        # per-pixel terms of both signs into one value: reordered, such a sum moves
        # by up to ~1e-5 of its largest term's scale (1.9e-5 of 1.4 seen on an
        # H200), so 1e-4 of the largest entry on CUDA; the cpu adds in one order
        # and a removed face's share was exactly 0: equal there
        rel = 0.0 if wp.get_device(device).is_cpu else 1e-4
        tol = rel * max(np.abs(w).max(), 1e-30)
        np.testing.assert_allclose(got[key], w, rtol=0, atol=tol,
                                   err_msg=key)  # fmt: skip


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
def test_sensor_nonfinite_particle_is_a_cloth_without_its_faces(deterministic, device):
    import warpraster.sim as wsim

    gv, gf = wsim.tessellate.grid_mesh(6, 6, 1.2, 1.2)
    gv = gv.astype(np.float32) + np.array([0.0, 0.0, 0.5], np.float32)
    gv[:, 2] += 0.1 * np.sin(3.0 * gv[:, 0])  # curved: smooth normals differ per vertex
    bad = 17  # an interior particle: six faces around it

    def run(points, faces):
        g = wsim.SensorGeometry()
        g.add_particle_mesh(np.arange(len(points)), faces, world=0, color=(0.8, 0.3, 0.2))
        bv, bf = wsim.box_mesh(0.3, 0.25, 0.15)
        g.add_body_mesh(0, bv, bf, world=0, color=(0.2, 0.3, 0.8))
        sensor = wsim.CameraSensor(
            g, world_count=1, camera_count=1, image_size=24, silhouette_sigma=1e-4,
            smooth_normals=True, device=device, requires_grad=True, material_grad=True,
            deterministic=deterministic, grad_channels=("color", "depth"),
        )  # fmt: skip
        cam = wsim.look_at_transform((2.0, -2.5, 2.4), (0.0, 0.0, 0.3))
        body_q = wp.array([(0.05, -0.1, 0.0, 0.0, 0.0, 0.2588, 0.9659)], dtype=wp.transform,
                          device=device, requires_grad=True)  # fmt: skip
        cam_q = wp.array([[cam]], dtype=wp.transform, device=device, requires_grad=True)
        fovs = wp.array([0.8], dtype=wp.float32, device=device, requires_grad=True)
        finite = wp.array(gv, dtype=wp.vec3, device=device)
        # the first update checks its inputs' values (set-up); later ones read them as
        # they are, as in a simulation whose state goes bad mid-run
        sensor.update(camera_transforms=cam_q, camera_fovs=fovs, particle_q=finite,
                      body_q=body_q)  # fmt: skip
        particle_q = wp.array(points, dtype=wp.vec3, device=device, requires_grad=True)
        rng = np.random.default_rng(1)
        frame = sensor.frames[0]
        tc = wp.array(rng.uniform(0, 1, (*frame.color.shape, 3)).astype(np.float32),
                      dtype=wp.vec3, device=device)  # fmt: skip
        loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            fr = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, particle_q=particle_q,
                               body_q=body_q)  # fmt: skip
            wsim.image_loss(fr.color, tc, loss, weight=1e-2)
            wsim.image_loss(fr.depth, wp.zeros_like(fr.depth), loss, weight=1e-3)
        tape.backward(loss)
        arrays = {"color": fr.color, "depth": fr.depth, "particle_q": particle_q.grad,
                  "body_q": body_q.grad, "cam_q": cam_q.grad, "fovs": fovs.grad,
                  "shape_colors": sensor.shape_colors.grad}  # fmt: skip
        return {k: a.numpy().copy() for k, a in arrays.items()}

    poisoned = gv.copy()
    poisoned[bad, 2] = np.nan
    got = run(poisoned, gf)
    want = run(gv, gf[~(gf == bad).any(1)])
    for key, a in got.items():
        assert np.isfinite(a).all(), f"{key} has non-finite values"
    assert not got["particle_q"][bad].any()
    assert np.abs(want["particle_q"]).max() > 0
    for key, w in want.items():
        # the cpu adds in one order and a removed face's share was exactly 0; on
        # CUDA the atomic backward's float32 sums reorder: 1e-5 of the largest entry
        tol = 1e-5 * max(np.abs(w).max(), 1e-30)
        np.testing.assert_allclose(got[key], w, rtol=0, atol=tol,
                                   err_msg=key)  # fmt: skip
