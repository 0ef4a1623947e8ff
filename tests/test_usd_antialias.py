"""``usd.StageRenderer(antialias=True)``: the antialias pass on the stage's sample image.

Truths: the op itself (tests/test_antialias.py checks it against nvdiffrast's
numbers) applied to the stage's own shaded sample image and fragments, then the
same box filter; central differences of a loss of the antialiased stage image
with respect to a mesh transform and to points; the hard image's coverage has
no gradient with respect to a translation, the antialiased one's has.

The stages are written to ``tmp_path`` and read back: a single-sided cube (its
back faces culled, so its silhouette edges border culled faces) turned in front
of a quad (occlusion edges), and for near-plane clipping a floor that runs
behind the camera.
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES

import warpraster as wr
from warpraster.antialiasing import edge_opposites
from warpraster.shading.resolve import resolve_samples

pytest.importorskip("pxr")
import warpraster.usd as wu  # noqa: E402

H, W = 12, 16

# a cube of corners (+-0.5)^3, corner i = (x, y, z) bits of i, faces counter-clockwise
# seen from outside (USD's rightHanded front)
CUBE_POINTS = [(x - 0.5, y - 0.5, z - 0.5) for z in (0, 1) for y in (0, 1) for x in (0, 1)]
CUBE_QUADS = [[0, 2, 3, 1], [4, 5, 7, 6], [0, 1, 5, 4], [2, 6, 7, 3], [0, 4, 6, 2], [1, 3, 7, 5]]


def _mesh(stage, path, points, quads, color):
    from pxr import Gf, UsdGeom, Vt

    m = UsdGeom.Mesh.Define(stage, path)
    m.CreatePointsAttr(Vt.Vec3fArray.FromNumpy(np.asarray(points, np.float32)))
    m.CreateFaceVertexCountsAttr([len(q) for q in quads])
    m.CreateFaceVertexIndicesAttr([int(i) for q in quads for i in q])
    m.CreateDisplayColorAttr([Gf.Vec3f(*color)])
    return m


def _box_stage(folder) -> str:
    """The turned cube before a quad, a camera at z = 5 looking down -z."""
    from pxr import Gf, Usd, UsdGeom

    path = str(folder / "box.usda")
    stage = Usd.Stage.CreateNew(path)
    back = [(-0.8, -0.7, -1.0), (0.8, -0.7, -1.0), (0.8, 0.7, -1.0), (-0.8, 0.7, -1.0)]
    _mesh(stage, "/World/Back", back, [[0, 1, 2, 3]], (0.2, 0.3, 0.9))
    box = _mesh(stage, "/World/Box", CUBE_POINTS, CUBE_QUADS, (0.9, 0.4, 0.2))
    box.AddTranslateOp().Set(Gf.Vec3d(0.12, 0.04, 0.3))
    box.AddRotateXYZOp().Set(Gf.Vec3f(25.0, 35.0, 10.0))
    cam = UsdGeom.Camera.Define(stage, "/World/Cam")
    cam.AddTranslateOp().Set(Gf.Vec3d(0.0, 0.0, 5.0))
    stage.Save()
    return path


def _floor_stage(folder) -> str:
    """The cube over a flat floor grid (z from -6 to 6) that passes behind the camera
    at z = 4 (near 1: the row of points at z = 6 is behind it), seen wide (focal
    length 18)."""
    from pxr import Gf, Usd, UsdGeom

    path = str(folder / "floor.usda")
    stage = Usd.Stage.CreateNew(path)
    n = 3
    xs, zs = np.linspace(-3.0, 3.0, n + 1), np.linspace(-6.0, 6.0, n + 1)
    pts = [(x, -0.6, z) for z in zs for x in xs]
    quads = [[i * (n + 1) + j, (i + 1) * (n + 1) + j, (i + 1) * (n + 1) + j + 1,
              i * (n + 1) + j + 1] for i in range(n) for j in range(n)]  # fmt: skip
    _mesh(stage, "/World/Floor", pts, quads, (0.3, 0.8, 0.3))
    box = _mesh(stage, "/World/Box", CUBE_POINTS, CUBE_QUADS, (0.9, 0.4, 0.2))
    box.AddRotateXYZOp().Set(Gf.Vec3f(25.0, 35.0, 10.0))
    cam = UsdGeom.Camera.Define(stage, "/World/Cam")
    cam.AddTranslateOp().Set(Gf.Vec3d(0.0, 0.0, 4.0))
    cam.CreateFocalLengthAttr(18.0)
    stage.Save()
    return path


def _ambient_only(scene):
    scene.lights = wu.LightSet(directional=np.zeros((0, 2, 3), np.float32),
                               point=np.zeros((0, 2, 3), np.float32),
                               ambient=np.ones(3, np.float32), names=[])  # fmt: skip
    return scene


def _renderer(scene, device, *, antialias=True, spp=4, requires_grad=False):
    r = wu.StageRenderer(scene, image_size=(H, W), spp=spp, antialias=antialias,
                         requires_grad=requires_grad, device=device)  # fmt: skip
    if antialias:
        r._antialias.op.store_pairs = True  # _decisions reads every call's pair codes
    return r


def _sample_faces(r) -> np.ndarray:
    """The face id of every sample of the last render (all perspective here: the
    clipping workspace's fragments)."""
    return r.workspace(clipped=True).fragments.pix_to_face.numpy().copy()


def _decisions(r) -> np.ndarray:
    """Every sample's face id and the antialias pass's discrete choices of the last
    render (each pair's edge, or none: an edge turning steeper than 45 degrees or
    leaving the 1/16 sample margin flips one), concatenated."""
    codes = r._antialias.op.pair_code.numpy()  # the op's own buffer (test access)
    return np.concatenate([_sample_faces(r).ravel(), codes.ravel()])


def _resolved(r, samples) -> np.ndarray:
    """``samples`` resolved with the stage's box filter into fresh outputs."""
    d = r.device
    color = wp.zeros((H, W), dtype=wp.vec4, device=d)
    depth = wp.zeros((H, W), dtype=float, device=d)
    face_id = wp.zeros((H, W), dtype=wp.int32, device=d)
    mesh_id = wp.zeros((H, W), dtype=wp.int32, device=d)
    resolve_samples(samples, r.workspace(clipped=True).fragments, grid=r.grid,
                    far=r.buffers.zfar, face_mesh=r.buffers.face_mesh, color=color, depth=depth,
                    face_id=face_id, mesh_id=mesh_id)  # fmt: skip
    return color.numpy()


@pytest.mark.parametrize("spp", [1, 4])
def test_stage_antialias_is_the_op_on_its_own_samples_then_resolved(tmp_path, device, spp):
    scene = wu.load_stage(_box_stage(tmp_path))
    r = _renderer(scene, device, spp=spp)
    assert r.antialias
    r.render_device()
    frags = r.workspace(clipped=True).fragments
    want = wr.antialias(r.samples, frags.pix_to_face, r.verts_ndc, r.buffers.faces,
                        zbuf=frags.zbuf)  # fmt: skip
    got = r.color.numpy()
    # bit for bit: the same kernels on the same inputs, and no atomics in the forward
    np.testing.assert_array_equal(got, _resolved(r, want))
    hard = _renderer(scene, device, antialias=False, spp=spp).render()
    np.testing.assert_array_equal(_resolved(r, r.samples), hard.color)  # same samples
    changed = np.any(got != hard.color, axis=-1)
    assert changed.any()  # edges were blended
    # only where a pixel's samples meet another face or the background
    faces = _sample_faces(r)[0, :, :, 0]
    sy, sx = r.grid
    edge = np.zeros(faces.shape, bool)
    edge[:, :-1] |= faces[:, :-1] != faces[:, 1:]
    edge[:, 1:] |= faces[:, :-1] != faces[:, 1:]
    edge[:-1] |= faces[:-1] != faces[1:]
    edge[1:] |= faces[:-1] != faces[1:]
    assert not (changed & ~edge.reshape(H, sy, W, sx).any(axis=(1, 3))).any()


class _Loss:
    """``L = sum(w * color)`` (float64) of a stage renderer and its tape gradient."""

    def __init__(self, r, w):
        self.r = r
        self.w = w
        self.w_dev = wp.array(w.astype(np.float32), dtype=wp.vec4, device=r.device)

    def value(self) -> float:
        self.r.render_device()
        return float(np.sum(self.w * self.r.color.numpy().astype(np.float64)))

    def gradient(self, arr: wp.array) -> np.ndarray:
        arr.grad.zero_()
        tape = wp.Tape()
        with tape:
            self.r.render_device()
        tape.backward(grads={self.r.color: self.w_dev})
        return arr.grad.numpy().copy()


@pytest.mark.parametrize("spp", [1, 4])
def test_stage_antialias_gradients_match_central_differences(tmp_path, device, spp):
    scene = wu.load_stage(_box_stage(tmp_path))
    box = scene.meshes.names.index("/World/Box")
    r = _renderer(scene, device, spp=spp, requires_grad=True)
    rng = np.random.default_rng(7)
    loss = _Loss(r, rng.uniform(-1, 1, (H, W, 4)))
    b = r.buffers
    g_xform = loss.gradient(b.mesh_xform)
    g_verts = loss.gradient(b.verts)
    decisions0 = _decisions(r)
    # the cube's corner whose edges move the image most, along x and y
    first, count = int(scene.meshes.vert_first[box]), int(scene.meshes.vert_count[box])
    k = first + int(np.argmax(np.abs(g_verts[first : first + count, :2]).sum(-1)))
    # (array, index, analytic): the cube's translation (row 3 of its row-vector
    # transform) and one of its corners
    checks = [(b.mesh_xform, (box, 3, 0), g_xform[box, 3, 0]),
              (b.mesh_xform, (box, 3, 1), g_xform[box, 3, 1]),
              (b.verts, (k, 0), g_verts[k, 0]), (b.verts, (k, 1), g_verts[k, 1])]  # fmt: skip
    # Step: the pass blends by where an edge crosses between sample centres, a
    # smooth function of the points while no sample changes face and no pair
    # changes its edge decision (checked at +-h below), so the central
    # difference's truncation error is O(h^2) of the gradient. h = 1e-4 world units
    # moves an edge by ~2e-3 samples (~19 samples per world unit at the cube's
    # depth with spp 4, half that with spp 1); with ~100 samples of edges in view
    # one may still lie that close to an edge, so h is halved (at most 3 times)
    # until nothing changes at +-h. Rounding: L's 768 float32 terms of
    # order 1 carry ~6e-8 each, ~2e-6 in all, i.e. <= 4e-2 after dividing by 2h
    # (h >= 2.5e-5), against derivatives of order 1-50: the gradients must agree
    # within 1e-2 relative plus 5e-2 absolute.
    for arr, index, analytic in checks:
        fd = _central_difference(loss, arr, index, decisions0)
        assert abs(fd) > 1.0, (index, fd)  # the edges move the image
        assert abs(analytic - fd) <= 1e-2 * abs(fd) + 5e-2, (index, analytic, fd)


def _central_difference(loss, arr, index, decisions0) -> float:
    """d L / d arr[index] by central differences at the first step h of 1e-4,
    5e-5, 2.5e-5 at which no discrete decision changes (see the caller)."""
    r = loss.r
    base = arr.numpy().copy()
    for h in (1e-4, 5e-5, 2.5e-5):
        values, steps, same = [], [], True
        for sign in (1.0, -1.0):
            moved = base.copy()
            moved[index] = np.float32(base[index] + sign * h)
            steps.append(float(moved[index]) - float(base[index]))  # float32's own step
            arr.assign(moved)
            values.append(loss.value())
            same &= bool((_decisions(r) == decisions0).all())
        arr.assign(base)
        if same:
            return (values[0] - values[1]) / (steps[0] - steps[1])
    raise AssertionError(f"{index}: a sample or pair changes at every step tried")


@pytest.mark.parametrize("spp", [1, 4])
def test_only_the_antialiased_stage_image_has_coverage_gradients(tmp_path, device, spp):
    # ambient light only: the colours are constant over each face, so a uniform
    # translation of the cube changes the picture only where its edges are; a
    # loss on alpha (coverage) alone has no gradient in the hard image
    scene = _ambient_only(wu.load_stage(_box_stage(tmp_path)))
    box = scene.meshes.names.index("/World/Box")
    w = np.zeros((H, W, 4))
    w[..., 3] = 1.0
    moved = {}
    for aa in (False, True):
        r = _renderer(scene, device, antialias=aa, spp=spp, requires_grad=True)
        g = _Loss(r, w).gradient(r.buffers.mesh_xform)
        moved[aa] = np.abs(g[box, 3, :3]).max()
    # zero but for rounding: the hard alpha is the corner opacities (all 1)
    # interpolated by barycentrics, whose derivatives cancel exactly in exact
    # arithmetic; float32 leaves ~1e-7 of them (order 1-10 per world unit) per
    # sample, ~2e-7 in all here: 1e-5 is 50x that and ~1e6 below the antialiased one
    assert moved[False] <= 1e-5
    # where the cube overhangs the quad its silhouette moves coverage: of order
    # (silhouette length in pixels) x (pixels per world unit), ~30 here
    assert moved[True] > 1.0


def _floor_blends(codes: np.ndarray, faces: np.ndarray, floor: np.ndarray) -> int:
    """How many pairs blend between two faces of the (flat: no silhouette inside) floor."""
    c, f = codes[0], faces[0, :, :, 0]
    on = np.where(f >= 0, floor[np.maximum(f, 0)], False)
    right = (c[:, :-1, 0] >= 0) & on[:, :-1] & on[:, 1:]
    down = (c[:-1, :, 1] >= 0) & on[:-1] & on[1:]
    return int(right.sum() + down.sum())


def test_near_clipped_faces_keep_hard_edges(tmp_path, device):
    scene = wu.load_stage(_floor_stage(tmp_path))
    r = _renderer(scene, device, requires_grad=True)
    rng = np.random.default_rng(3)
    loss = _Loss(r, rng.uniform(-1, 1, (H, W, 4)))
    g = loss.gradient(r.buffers.verts)
    assert np.isfinite(r.color.numpy()).all() and np.isfinite(g).all()
    # the rule, in NumPy: a face with a corner or an edge's opposite vertex nearer
    # than the clip distance (near = 1) is made degenerate for the op
    faces = r.buffers.faces.numpy()
    ndc = r.verts_ndc.numpy()
    opp = edge_opposites(faces, len(ndc))
    near = (ndc[faces, 2] < 1.0).any(1) | ((opp >= 0) & (ndc[np.maximum(opp, 0), 2] < 1.0)).any(1)
    seen = np.unique(_sample_faces(r))
    assert np.isin(np.flatnonzero(near), seen).any()  # guarded faces are in view
    assert (~near[seen[seen >= 0]]).any()  # and faces the pass blends
    guarded = faces.copy()
    guarded[near] = faces[near][:, :1]
    topo = wr.AntialiasTopology(wp.array(faces, dtype=wp.int32, device=device), len(ndc), device)
    topo.faces.assign(guarded)
    frags = r.workspace(clipped=True).fragments
    want = wr.antialias(r.samples, frags.pix_to_face, r.verts_ndc, None, topology=topo,
                        zbuf=frags.zbuf)  # fmt: skip
    np.testing.assert_array_equal(r.color.numpy(), _resolved(r, want))
    # what the guard prevents: the op on the stage's faces as they are reads the
    # projections of the points behind the camera, and blends across the flat
    # floor's inner edges, which are no silhouettes
    floor = scene.meshes.face_mesh == scene.meshes.names.index("/World/Floor")
    p2f = _sample_faces(r)
    plain = wr.Antialias(r.buffers.faces, len(ndc), r.samples.shape, device, store_pairs=True)
    plain(r.samples, frags.pix_to_face, r.verts_ndc, zbuf=frags.zbuf)
    assert _floor_blends(plain.pair_code.numpy(), p2f, floor) > 0
    guarded_codes = r._antialias.op.pair_code.numpy()  # the op's own buffer (test access)
    assert _floor_blends(guarded_codes, p2f, floor) == 0


def test_a_later_frames_faces_refresh_the_edge_topology(tmp_path, device):
    # the cube rewound (corners 0, 2, 1: turned inside out): the same edges, but
    # each face's edges 1 and 2 swap, so the opposite-vertex table changes
    import dataclasses

    scene = wu.load_stage(_box_stage(tmp_path))
    r = _renderer(scene, device)
    m = scene.meshes
    flip = [0, 2, 1]
    rewound = dataclasses.replace(m, faces=m.faces[:, flip], normals=-m.normals[:, flip],
                                  colors=m.colors[:, flip], uvs=m.uvs[:, flip])  # fmt: skip
    r.set_frame(meshes=rewound)
    r.render_device()
    frags = r.workspace(clipped=True).fragments
    want = wr.antialias(r.samples, frags.pix_to_face, r.verts_ndc, rewound.faces,
                        zbuf=frags.zbuf)  # fmt: skip
    np.testing.assert_array_equal(r.color.numpy(), _resolved(r, want))
    np.testing.assert_array_equal(r._antialias.topology.opposite.numpy(),
                                  edge_opposites(rewound.faces, m.num_verts))  # fmt: skip


def test_antialias_is_captured_with_the_render_on_cpu(tmp_path):
    """Forward + backward with antialias in one graph (cpu), replayed after the
    cube's transform moved: the colours and gradients of eager runs."""
    device = "cpu"
    scene = wu.load_stage(_box_stage(tmp_path))
    box = scene.meshes.names.index("/World/Box")
    r = _renderer(scene, device, requires_grad=True)
    loss = _Loss(r, np.random.default_rng(5).uniform(-1, 1, (H, W, 4)))
    b = r.buffers
    params = [b.mesh_xform, b.verts]

    def step():
        for p in params:
            p.grad.zero_()
        tape = wp.Tape()
        with tape:
            r.render_device()
        tape.backward(grads={r.color: loss.w_dev})

    x0 = b.mesh_xform.numpy().copy()
    x1 = x0.copy()
    x1[box, 3, :2] += (0.05, -0.03)
    eager = []
    for x in (x0, x1):
        b.mesh_xform.assign(x)
        step()
        eager.append([r.color.numpy().copy()] + [p.grad.numpy().copy() for p in params])
    assert np.abs(eager[1][1]).max() > 0
    step()  # every module loaded before the capture
    with wp.ScopedCapture(device=device, force_module_load=False) as capture:
        step()
    for x, want in zip((x0, x1), eager, strict=True):
        b.mesh_xform.assign(x)
        wp.capture_launch(capture.graph)
        got = [r.color.numpy().copy()] + [p.grad.numpy().copy() for p in params]
        for a, e in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, e)


def test_antialias_must_be_a_bool(tmp_path):
    scene = wu.load_stage(_box_stage(tmp_path))
    with pytest.raises(TypeError, match="antialias must be a bool"):
        wu.StageRenderer(scene, image_size=(H, W), antialias="yes", device=DEVICES[0])


def test_cli_antialias_flag_blends_the_same_render(tmp_path, capsys, cli_device):
    from PIL import Image

    from warpraster.cli import main

    stage = _box_stage(tmp_path)
    images = {}
    for flag in ([], ["--antialias"]):
        out = tmp_path / ("aa" if flag else "hard")
        args = ["render", stage, "--size", f"{W}x{H}", "--spp", "4", "--ids", "--out", str(out),
                "--device", cli_device, "--no-progress", *flag]  # fmt: skip
        assert main(args) == 0, capsys.readouterr().err
        images[bool(flag)] = [np.asarray(Image.open(out / f"{k}.0000.png")).astype(np.int64)
                              for k in ("color", "face_id")]  # fmt: skip
    (hard, ids_hard), (aa, ids_aa) = images[False], images[True]
    np.testing.assert_array_equal(ids_aa, ids_hard)  # the same fragments
    assert np.any(aa != hard)  # edges blended
    # the default output is the renderer's without antialias: its colours, rounded
    # to 8 bits as the command writes them (sRGB-encoded)
    r = wu.StageRenderer(wu.load_stage(stage), image_size=(H, W), spp=4, device=cli_device)
    o = r.render()
    rgba = np.concatenate([wu.linear_to_srgb(o.color[..., :3]), o.color[..., 3:]], -1)
    np.testing.assert_array_equal(np.round(rgba * 255).astype(np.int64), hard)
    face = ids_hard[..., 0] + 256 * ids_hard[..., 1] + 65536 * ids_hard[..., 2] - 1
    np.testing.assert_array_equal(face, o.face_id)
