"""Per-vertex gathers over static corner lists (CornerLists) instead of atomic scatters.

Truths: the lists against a brute-force listing; the gathered vertex normals and
corner-table backward against Warp's generated adjoints of the scatter kernels
(same scene, same upstream gradients) and against float64 NumPy transcriptions
of the analytic gradients; central finite differences of the float64 normals;
the Renderer's gradients against MeshRenderer's (which keeps the generated
path) for every shading mode and texel source; the same bits run to run.

Tolerances: the two paths add the same float32 terms in another order (and the
normals' adjoint adds a face's three upstream gradients before one cross
product where Warp's adjoint takes three), so a vertex's difference is bounded
by a few float32 ulps times the number of terms times the sum of the terms'
magnitudes; :func:`rounding_bound` computes that sum per vertex.
"""

from __future__ import annotations

import numpy as np
import p3d_render_cases as cases
import pytest
import warp as wp
from np_shading import central_difference
from test_normals import np_vertex_normals, random_mesh

from warpraster.renderer import Renderer
from warpraster.shading import normals as normals_module
from warpraster.shading import shaders as shaders_module
from warpraster.shading.corner_lists import CornerLists
from warpraster.shading.modes import ShadingMode, TexelSource
from warpraster.shading.normals import vertex_normals
from warpraster.shading.shaders import FaceTables, ShadingBuffers, gather_faces

EPS32 = float(np.finfo(np.float32).eps)


def shared_mesh(rng, nv=40, nf=120):
    """Random faces over few vertices (every vertex in ~9 faces), one face with a
    repeated vertex, one vertex in no face."""
    return random_mesh(rng, nv=nv, nf=nf)


def rounding_bound(terms_abs: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(V, 1) bound on the float32 difference of two orders of summing a vertex's
    terms: (count + 8) ulps of the summed magnitudes (each addition rounds by at
    most half an ulp of a partial sum; 8 more for forming each term in float32:
    edge differences, a cross product, the sum of three upstream rows)."""
    return ((counts + 8.0) * EPS32 * terms_abs)[:, None]


def degree(f: np.ndarray, nv: int) -> np.ndarray:
    return np.bincount(f.reshape(-1), minlength=nv).astype(np.float64)


# ----------------------------------------------------------------------------- the lists
def test_corner_lists_list_each_vertex_corners_in_ascending_order(device):
    rng = np.random.default_rng(0)
    v, f = shared_mesh(rng)
    lists = CornerLists(f, len(v), device=device)
    start, entries = lists.start.numpy(), lists.entries.numpy()
    assert start[0] == 0 and start[-1] == f.size
    for i in range(len(v)):
        want = [3 * fi + c for fi in range(len(f)) for c in range(3) if f[fi, c] == i]
        assert entries[start[i] : start[i + 1]].tolist() == want
    assert start[-1] - start[-2] == 0  # the last vertex is in no face
    empty = CornerLists(np.zeros((0, 3), np.int32), 5, device=device)
    assert empty.start.numpy().tolist() == [0] * 6 and empty.entries.shape == (0,)
    out = vertex_normals(np.ones((5, 3), np.float32), empty.faces, corner_lists=empty)
    assert (out.numpy() == 0).all()


def test_bad_corner_lists_name_the_argument():
    rng = np.random.default_rng(1)
    v, f = shared_mesh(rng, nv=10, nf=12)
    with pytest.raises(ValueError, match="faces"):
        CornerLists(f, 5)  # indices beyond 5 vertices
    with pytest.raises(ValueError, match="num_verts"):
        CornerLists(f, -1)
    lists = CornerLists(f, len(v))  # Warp's default device: no kernel runs here
    other = wp.array(f, dtype=wp.int32)  # same values, another array
    with pytest.raises(ValueError, match="corner_lists"):
        vertex_normals(v, other, corner_lists=lists)
    with pytest.raises(ValueError, match="corner_lists"):
        vertex_normals(np.zeros((len(v) + 1, 3), np.float32), lists.faces, corner_lists=lists)
    with pytest.raises(ValueError, match="corner_lists"):
        ShadingBuffers((1, 4, 4, 1), len(v) + 1, len(f), lists.faces.device, corner_lists=lists)


# ----------------------------------------------------------------------------- vertex normals
def np_corner_normals_grad(v, f, g):
    """float64 gradient of sum over corners g[i] . cross(v_j - v_i, v_k - v_i),
    term by term, and each vertex's summed term magnitudes."""
    v = v.astype(np.float64)
    grad = np.zeros_like(v)
    mags = np.zeros(len(v))
    for c in range(3):
        i, j, k = f[:, c], f[:, (c + 1) % 3], f[:, (c + 2) % 3]
        e1, e2, gi = v[j] - v[i], v[k] - v[i], g[i]
        dj, dk = np.cross(e2, gi), np.cross(gi, e1)
        for idx, d in ((j, dj), (k, dk), (i, -dj - dk)):
            np.add.at(grad, idx, d)
        m = np.linalg.norm(gi, axis=1) * (np.linalg.norm(e1, axis=1) + np.linalg.norm(e2, axis=1))
        for idx in (i, j, k):
            np.add.at(mags, idx, 2.0 * m)
    return grad, mags


def _normals_run(v, faces, lists, sums_grad, device):
    """(normals, verts.grad) with the sums' upstream gradient ``sums_grad``."""
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    sums = wp.zeros(len(v), dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = vertex_normals(verts, faces, sums_out=sums, validate=False, corner_lists=lists)
    tape.backward(grads={sums: wp.array(sums_grad, dtype=wp.vec3, device=device)})
    return out.numpy(), verts.grad.numpy(), tape


def test_gathered_vertex_normals_equal_the_scattered_ones(device):
    rng = np.random.default_rng(2)
    v, f = shared_mesh(rng)
    lists = CornerLists(f, len(v), device=device)
    g = rng.normal(size=v.shape).astype(np.float32)
    new_n, new_g, tape = _normals_run(v, lists.faces, lists, g, device)
    old_n, old_g, _ = _normals_run(v, lists.faces, None, g, device)
    launched = [x[0] for x in tape.launches if not callable(x)]
    assert normals_module._scatter_corner_normals not in launched  # no atomic path recorded
    if wp.get_device(device).is_cpu:
        # the cpu's atomic scatter runs the corners serially, in the lists' order
        np.testing.assert_array_equal(new_n, old_n)
    else:
        # float32 sums of ~9 corner terms in another order, then normalised: a few
        # ulp of a unit vector's components
        np.testing.assert_allclose(new_n, old_n, rtol=0, atol=1e-6)
    want, mags = np_corner_normals_grad(v, f, g.astype(np.float64))
    bound = rounding_bound(mags, degree(f, len(v)))
    assert (np.abs(new_g - want) <= bound).all()  # float32 vs the float64 terms
    assert (np.abs(new_g - old_g) <= 2 * bound).all()  # two float32 orders
    assert np.abs(want).max() > 1.0  # a gradient worth comparing


def test_gathered_vertex_normals_gradient_matches_finite_differences(device):
    """Tape gradient of <g, normals> w.r.t. a (V, 3) float32 array vs float64 FD."""
    rng = np.random.default_rng(3)
    # no degenerate face: its normal is cross / 1e-6 (see test_normals.py)
    v, f = random_mesh(rng, degenerate=False)
    lists = CornerLists(f, len(v), device=device)
    verts = wp.array(v, dtype=wp.float32, device=device, requires_grad=True)  # plain (V, 3)
    tape = wp.Tape()
    with tape:
        out = vertex_normals(verts, lists.faces, corner_lists=lists)
    g = rng.normal(size=(out.shape[0], 3))
    out.grad.assign(g.astype(np.float32))
    tape.backward()
    got = verts.grad.numpy()
    num = central_difference(lambda x: np_vertex_normals(x, f), v.astype(np.float64), g, 1e-6)
    # float32 adjoint of O(1)-conditioned normalisations vs float64 FD: 1e-3 of
    # the largest entry (as test_normals.py)
    assert np.abs(got - num).max() <= 1e-3 * np.abs(num).max()
    tape.zero()  # the lists' backward is registered with its arrays: zeroed too
    assert not verts.grad.numpy().any()


# ----------------------------------------------------------------------------- corner tables
MODES = [ShadingMode.PHONG, ShadingMode.FLAT]
SOURCES = [TexelSource.WHITE, TexelSource.VERTEX, TexelSource.PIXEL]


def _tables_run(v, faces, nrm, col, mode, src, lists, table_grads, device):
    """The gradients gather_faces' backward adds to (verts, normals, colours), each
    starting from ones (added to, not overwritten)."""
    arrays = [wp.array(x, dtype=wp.vec3, device=device, requires_grad=True) for x in (v, nrm, col)]
    for a in arrays:
        a.grad.fill_(1.0)
    tables = FaceTables(faces.shape[0], device, True)
    tape = wp.Tape()
    with tape:
        gather_faces(arrays[0], faces, arrays[1], mode=mode, texels_from=src,
                     vert_colors=arrays[2], tables=tables, corner_lists=lists)  # fmt: skip
    grads = dict(zip((tables.pos, tables.nrm, tables.col), table_grads, strict=True))
    tape.backward(grads={t: wp.array(g, dtype=wp.mat33, device=device) for t, g in grads.items()})
    launched = [x[0] for x in tape.launches if not callable(x)]
    return [a.grad.numpy() for a in arrays], launched


@pytest.mark.parametrize("src", SOURCES, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name.lower())
def test_gathered_table_backward_equals_the_generated_one(mode, src, device):
    rng = np.random.default_rng(4)
    v, f = shared_mesh(rng)
    nv, nf = len(v), len(f)
    nrm = rng.normal(size=(nf if mode == ShadingMode.FLAT else nv, 3)).astype(np.float32)
    col = rng.uniform(size=(nv, 3)).astype(np.float32)
    table_grads = [rng.normal(size=(nf, 3, 3)).astype(np.float32) for _ in range(3)]
    lists = CornerLists(f, nv, device=device)
    new, launched = _tables_run(v, lists.faces, nrm, col, mode, src, lists, table_grads, device)
    assert shaders_module._gather_faces_kernel not in launched  # no generated adjoint recorded
    old, launched = _tables_run(v, lists.faces, nrm, col, mode, src, None, table_grads, device)
    assert shaders_module._gather_faces_kernel in launched
    # float64 truth: each table row goes to the vertex (or face) it was read from
    gp, gn, gc = (t.astype(np.float64) for t in table_grads)
    want = [np.ones((nv, 3)), np.ones(nrm.shape), np.ones((nv, 3))]
    mags = np.zeros((3, max(nv, nf)))
    for c in range(3):
        np.add.at(want[0], f[:, c], gp[:, c])
        np.add.at(mags[0], f[:, c], np.abs(gp[:, c]).sum(1))
        if mode != ShadingMode.FLAT:
            np.add.at(want[1], f[:, c], gn[:, c])
            np.add.at(mags[1], f[:, c], np.abs(gn[:, c]).sum(1))
        if src == TexelSource.VERTEX:
            np.add.at(want[2], f[:, c], gc[:, c])
            np.add.at(mags[2], f[:, c], np.abs(gc[:, c]).sum(1))
    if mode == ShadingMode.FLAT:
        want[1] += gn[:, 0]
        mags[1, :nf] = np.abs(gn[:, 0]).sum(1)
    per_vertex = degree(f, nv)
    counts = [per_vertex, np.ones(nf) if mode == ShadingMode.FLAT else per_vertex, per_vertex]
    for k, name in enumerate(("verts", "normals", "vert_colors")):
        n = len(want[k])
        # the starting ones are one more term of each sum
        bound = rounding_bound(mags[k, :n] + 1.0, counts[k] + 1.0)
        assert (np.abs(new[k] - want[k]) <= bound).all(), name
        assert (np.abs(new[k] - old[k]) <= 2 * bound).all(), name


# ----------------------------------------------------------------------------- determinism
def test_gathers_give_the_same_bits_run_to_run(device):
    """Gathered sums have one order: a mesh large enough for CUDA atomics to race
    gives the same bits on every run (vertex normals and their gradient, table
    backward)."""
    from warpraster.primitives import ico_sphere

    rng = np.random.default_rng(5)
    v, f = ico_sphere(4)
    v = (v + rng.normal(scale=0.01, size=v.shape)).astype(np.float32)
    f = f.astype(np.int32)
    lists = CornerLists(f, len(v), device=device)
    g = rng.normal(size=v.shape).astype(np.float32)
    table_grads = [rng.normal(size=(len(f), 3, 3)).astype(np.float32) for _ in range(3)]
    runs = []
    for _ in range(3):
        n, gn, _ = _normals_run(v, lists.faces, lists, g, device)
        t, _ = _tables_run(v, lists.faces, v, v, ShadingMode.PHONG, TexelSource.VERTEX, lists,
                           table_grads, device)  # fmt: skip
        runs.append([n, gn, *t])
    for later in runs[1:]:
        for a, b in zip(runs[0], later, strict=True):
            np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- the Renderer
RENDER_CASES = [
    ("r02_hardphong_point_vertexcolor", True),
    ("r03_softphong_directional_k8", True),
    ("r03_softphong_directional_k8", False),  # white: textures None
    ("r04_hardgouraud_batch2_nonsquare", True),
    ("r05_softsilhouette_k16", True),
    ("r06_hardflat_ortho", True),
    ("r06_hardflat_ortho", False),
    ("r08_texuv_softphong_nocorners_reflect", True),  # UV texels (per slot)
]


@pytest.mark.parametrize(
    "name,textured",
    RENDER_CASES,
    ids=[f"{n[:3]}-{'tex' if t else 'white'}" for n, t in RENDER_CASES],
)
def test_renderer_gradients_equal_the_generated_path(name, textured, device):
    """The Renderer (corner lists) and MeshRenderer (no lists: Warp's generated
    adjoints) render the same scene; the same upstream image gradient gives the
    same vertex, texture and light gradients up to float32 summation order."""
    d, spec = cases.load(name)
    results = []
    upstream = None
    for use_renderer in (True, False):
        _, _, mesh_renderer, verts, tex, lts = cases.warp_scene(name, device)
        tex = tex if textured else None
        tape = wp.Tape()
        if use_renderer:
            r = Renderer(cameras=mesh_renderer.rasterizer.cameras,
                         raster_settings=cases.raster_settings(spec), shader=mesh_renderer.shader,
                         faces=d["faces_packed"].astype(np.int32),
                         mesh_to_face_first_idx=d["mesh_to_face_first_idx"],
                         num_faces_per_mesh=d["num_faces_per_mesh"], num_verts=len(verts),
                         textures=tex)  # fmt: skip
            with tape:
                image = r.render(verts).image
            launched = [x[0] for x in tape.launches if not callable(x)]
            assert normals_module._scatter_corner_normals not in launched
            assert shaders_module._gather_faces_kernel not in launched
        else:
            with tape:
                image = mesh_renderer(verts, d["faces_packed"].astype(np.int32),
                                      d["mesh_to_face_first_idx"], d["num_faces_per_mesh"],
                                      textures=tex)  # fmt: skip
        if upstream is None:
            upstream = np.random.default_rng(6).normal(size=image.shape).astype(np.float32)
        tape.backward(grads={image: wp.array(upstream, dtype=wp.float32, device=device)})
        got = {"image": image.numpy(), "verts": verts.grad.numpy()}
        if tex is not None:
            got.update({k: ours for k, (ours, _) in cases.texture_grads(d, tex).items()})
        got.update({k: ours for k, (ours, _) in cases.light_grads(d, lts).items()})
        results.append(got)
    new, old = results
    assert np.abs(old["verts"]).max() > 0
    # Only the order of float32 sums differs: the table rows and the normals'
    # adjoint (and on CUDA the vertex-normal sums; on the cpu the atomic scatter
    # runs in the lists' order: bit-equal). Through the renderer's O(1)-conditioned
    # chain (normalisation, lighting, projection) that is a few ulps of the largest
    # entry times the ~10 terms per vertex (measured on the cpu: <= 5e-8): 1e-6.
    # On CUDA the other backward kernels' float atomics also add in another order
    # from run to run: 2e-5, as tests/test_renderer.py allows for the same scenes.
    rel = 1e-6 if wp.get_device(device).is_cpu else 2e-5
    for key in old:
        scale = np.abs(old[key]).max()
        np.testing.assert_allclose(new[key], old[key], rtol=0, atol=rel * scale, err_msg=key)


def test_shader_buffers_with_lists_refuse_other_faces(device):
    d, spec = cases.load("r03_softphong_directional_k8")
    _, _, mesh_renderer, verts, tex, _ = cases.warp_scene("r03_softphong_directional_k8", device)
    faces = d["faces_packed"].astype(np.int32)
    r = Renderer(cameras=mesh_renderer.rasterizer.cameras,
                 raster_settings=cases.raster_settings(spec), shader=mesh_renderer.shader,
                 faces=faces, mesh_to_face_first_idx=d["mesh_to_face_first_idx"],
                 num_faces_per_mesh=d["num_faces_per_mesh"], num_verts=len(verts))  # fmt: skip
    out = r.render(verts)
    with pytest.raises(ValueError, match="corner_lists"):
        mesh_renderer.shader(out.fragments, verts, faces[::-1].copy(), buffers=out.shading)


def test_corner_tables_past_32_bit_indexing_name_the_faces():
    """The corner gathers index 9 floats per face with 32-bit thread ids: a table
    of more than (2**31 - 1) / 9 faces is refused before any kernel runs (checked
    on a view of one real row: nothing that size is allocated)."""
    from warpraster.shading.params import float_rows

    one = wp.zeros(1, dtype=wp.mat33, device="cpu")
    huge = wp.array(ptr=one.ptr, dtype=wp.mat33, shape=(2**31 // 9 + 1,), device="cpu")
    with pytest.raises(ValueError, match="faces"):
        float_rows(huge)
    assert float_rows(wp.zeros(3, dtype=wp.mat33, device="cpu")).shape == (27,)
