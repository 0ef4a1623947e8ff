"""warpraster.usd: stages built in memory with pxr, checked against hand-computed values.

Truths: world points from the transform ops' matrices multiplied by hand in
float64 (not through XformCache), triangulations and primvar expansions written
out by hand, areas of polygons (shoelace), light directions from the rotation
written out by hand; the shaded pictures from a float64 NumPy re-computation of
every sample (materials, wrapped textures, lights) from the renderer's own fragments.
"""

import math
from dataclasses import replace
import warnings
from pathlib import Path

import numpy as np
import pytest

pxr = pytest.importorskip("pxr")
from conftest import DEVICES  # noqa: E402
from pxr import Gf, Sdf, Usd, UsdGeom, UsdLux, UsdShade, Vt  # noqa: E402

import warpraster.usd as wu  # noqa: E402

# one device is enough for scene reading (the rasterizer's own tests cover each device)
DEVICE = DEVICES[0]
from warpraster.usd.triangulate import triangulate  # noqa: E402

# float32 storage of positions: values of size ~10 carry ~1e-6 relative rounding
ATOL_POS = 1e-5


def _mesh(stage, path, points, counts, indices, **kw):
    m = UsdGeom.Mesh.Define(stage, path)
    m.CreatePointsAttr(Vt.Vec3fArray.FromNumpy(np.asarray(points, np.float32)))
    m.CreateFaceVertexCountsAttr(list(counts))
    m.CreateFaceVertexIndicesAttr(list(np.asarray(indices).ravel().tolist()))
    for k, v in kw.items():
        m.GetPrim().GetAttribute(k).Set(v) if m.GetPrim().HasAttribute(k) else None
    return m


def _rot_x(deg):
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    # USD row-vector rotation about X: p @ M
    return np.array([[1, 0, 0], [0, c, s], [0, -s, c]])


def _rot_y(deg):
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return np.array([[c, 0, -s], [0, 1, 0], [s, 0, c]])


def _area(p):
    """Signed area of a planar (z = 0) polygon or triangles (shoelace)."""
    x, y = p[..., 0], p[..., 1]
    return 0.5 * np.sum(x * np.roll(y, -1, -1) - np.roll(x, -1, -1) * y, axis=-1)


# ----------------------------------------------------------------------------- geometry
def test_world_points_follow_nested_transforms_by_hand():
    stage = Usd.Stage.CreateInMemory()
    parent = UsdGeom.Xform.Define(stage, "/A")
    parent.AddTranslateOp().Set(Gf.Vec3d(1.0, 2.0, 3.0))
    parent.AddRotateYOp().Set(30.0)
    child = UsdGeom.Xform.Define(stage, "/A/B")
    child.AddScaleOp().Set(Gf.Vec3f(2.0, 1.0, 0.5))
    child.AddRotateXOp().Set(-45.0)
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0.3, -0.2, 2.0]], np.float32)
    _mesh(stage, "/A/B/M", pts, [3, 3], [0, 1, 2, 0, 2, 3])
    scene = wu.load_stage(stage)
    # xformOpOrder [translate, rotate]: local matrix = R @ T in row-vector form
    # (the last op is applied first), and world = child_local @ parent_local
    t = np.array([1.0, 2.0, 3.0])
    p = pts.astype(np.float64)
    p = p @ _rot_x(-45.0)  # child: scale then rotateX -> rotate applied first
    p = p * np.array([2.0, 1.0, 0.5])
    p = p @ _rot_y(30.0) + t
    np.testing.assert_allclose(scene.meshes.verts, p, atol=ATOL_POS)
    assert scene.meshes.faces.tolist() == [[0, 1, 2], [0, 2, 3]]
    assert scene.meshes.names == ["/A/B/M"]


def test_fan_triangulation_of_convex_ngons_keeps_corners_and_polygon_rows():
    tri = triangulate([3, 4, 5, 2], np.arange(14))
    assert tri.vertex.tolist() == [
        [0, 1, 2],
        [3, 4, 5],
        [3, 5, 6],
        [7, 8, 9],
        [7, 9, 10],
        [7, 10, 11],
    ]
    assert tri.face.tolist() == [0, 1, 1, 2, 2, 2]  # the 2-gon gives no triangle
    assert tri.corner.tolist() == tri.vertex.tolist()  # identity indices here


def test_concave_polygon_is_ear_clipped_and_covers_it_exactly():
    # an L-shaped hexagon; a fan from corner 0 would leave it
    ring = np.array([[0, 0], [2, 0], [2, 1], [1, 1], [1, 2], [0, 2]], float)
    # corner 0 sees all others here, so rotate the ring to start at the reflex corner's neighbour
    ring = np.roll(ring, -2, axis=0)
    pts = np.concatenate([ring, np.zeros((6, 1))], axis=1)
    tri = triangulate([6], np.arange(6), pts)
    assert len(tri) == 4 and tri.num_concave == 1
    areas = _area(pts[tri.vertex][..., :2])
    assert (areas > 0).all()  # same (counter-clockwise) winding as the polygon
    assert areas.sum() == pytest.approx(_area(ring), abs=1e-12)  # exact cover: 3


def test_left_handed_and_mirrored_meshes_keep_front_faces_counter_clockwise():
    stage = Usd.Stage.CreateInMemory()
    pts = [[0, 0, 0], [1, 0, 0], [0, 1, 0]]
    _mesh(stage, "/R", pts, [3], [0, 1, 2])
    lh = _mesh(stage, "/L", pts, [3], [0, 2, 1])
    lh.CreateOrientationAttr(UsdGeom.Tokens.leftHanded)
    mirrored = _mesh(stage, "/M", pts, [3], [0, 1, 2])
    UsdGeom.Xformable(mirrored).AddScaleOp().Set(Gf.Vec3f(-1, 1, 1))
    m = wu.load_stage(stage).meshes
    for i in range(3):
        f = m.faces[m.face_first[i]]
        p = m.verts[f].astype(np.float64)
        n = np.cross(p[1] - p[0], p[2] - p[0])
        # R: +z front; L: authored clockwise (0,2,1) but left-handed -> +z; M: mirrored -> +z
        assert n[2] > 0, m.names[i]


def test_instances_and_visibility_and_purpose():
    stage = Usd.Stage.CreateInMemory()
    proto = UsdGeom.Xform.Define(stage, "/Proto")
    proto.GetPrim().SetSpecifier(Sdf.SpecifierClass)
    _mesh(stage, "/Proto/M", [[0, 0, 0], [1, 0, 0], [0, 1, 0]], [3], [0, 1, 2])
    for k, x in enumerate([10.0, 20.0]):
        inst = UsdGeom.Xform.Define(stage, f"/I{k}")
        inst.GetPrim().GetReferences().AddInternalReference("/Proto")
        inst.GetPrim().SetInstanceable(True)
        inst.AddTranslateOp().Set(Gf.Vec3d(x, 0, 0))
    hidden = _mesh(stage, "/Hidden", [[0, 0, 0], [1, 0, 0], [0, 1, 0]], [3], [0, 1, 2])
    UsdGeom.Imageable(hidden).MakeInvisible()
    guide = UsdGeom.Xform.Define(stage, "/Guide")
    guide.CreatePurposeAttr(UsdGeom.Tokens.guide)
    _mesh(stage, "/Guide/M", [[0, 0, 0], [1, 0, 0], [0, 1, 0]], [3], [0, 1, 2])
    m = wu.load_stage(stage).meshes
    assert m.names == ["/I0/M", "/I1/M"]
    np.testing.assert_allclose(m.verts[:3, 0], [10, 11, 10])
    np.testing.assert_allclose(m.verts[3:, 0], [20, 21, 20])


# ----------------------------------------------------------------------------- primvars
QUAD_PTS = [[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [2, 0, 0]]


def _uv_stage(interp, values, indices=None):
    stage = Usd.Stage.CreateInMemory()
    m = _mesh(stage, "/M", QUAD_PTS, [4, 3], [0, 1, 2, 3, 1, 4, 2])
    pv = UsdGeom.PrimvarsAPI(m).CreatePrimvar("st", Sdf.ValueTypeNames.TexCoord2fArray, interp)
    pv.Set(values)
    if indices is not None:
        pv.SetIndices(Vt.IntArray(indices))
    return stage


# triangles: (0,1,2) (0,2,3) from the quad [rows 0..3], (1,4,2) from the triangle [rows 4..6]
@pytest.mark.parametrize(
    "interp, values, indices, expected",
    [
        ("constant", [(0.25, 0.5)], None, [[(0.25, 0.5)] * 3] * 3),
        ("uniform", [(1, 0), (2, 0)], None, [[(1, 0)] * 3, [(1, 0)] * 3, [(2, 0)] * 3]),
        (
            "vertex",
            [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)],
            None,
            [[(0, 0), (1, 1), (2, 2)], [(0, 0), (2, 2), (3, 3)], [(1, 1), (4, 4), (2, 2)]],
        ),
        (
            "faceVarying",
            [(k, -k) for k in range(7)],
            None,
            [[(0, 0), (1, -1), (2, -2)], [(0, 0), (2, -2), (3, -3)], [(4, -4), (5, -5), (6, -6)]],
        ),
        (
            "faceVarying",
            [(0, 0), (9, 9)],
            [0, 1, 0, 1, 1, 1, 0],
            [[(0, 0), (9, 9), (0, 0)], [(0, 0), (0, 0), (9, 9)], [(9, 9), (9, 9), (0, 0)]],
        ),
        (
            "vertex",
            [(5, 5), (7, 7)],
            [0, 0, 1, 1, 0],
            [[(5, 5), (5, 5), (7, 7)], [(5, 5), (7, 7), (7, 7)], [(5, 5), (5, 5), (7, 7)]],
        ),
    ],
    ids=["constant", "uniform", "vertex", "faceVarying", "faceVarying-indexed", "vertex-indexed"],
)
def test_uvs_for_every_interpolation(interp, values, indices, expected):
    m = wu.load_stage(_uv_stage(interp, values, indices)).meshes
    np.testing.assert_array_equal(m.uvs, np.asarray(expected, np.float32))


def test_display_color_uniform_and_inherited_constant():
    stage = Usd.Stage.CreateInMemory()
    m = _mesh(stage, "/M", QUAD_PTS, [4, 3], [0, 1, 2, 3, 1, 4, 2])
    pv = UsdGeom.PrimvarsAPI(m).CreatePrimvar(
        "displayColor", Sdf.ValueTypeNames.Color3fArray, UsdGeom.Tokens.uniform
    )
    pv.Set([(1, 0, 0), (0, 0, 1)])
    parent = UsdGeom.Xform.Define(stage, "/P")
    UsdGeom.PrimvarsAPI(parent).CreatePrimvar(
        "displayColor", Sdf.ValueTypeNames.Color3fArray, UsdGeom.Tokens.constant
    ).Set([(0, 1, 0)])
    _mesh(stage, "/P/N", QUAD_PTS[:3], [3], [0, 1, 2])
    out = wu.load_stage(stage).meshes
    np.testing.assert_array_equal(out.colors[0, :, :3], [[1, 0, 0]] * 3)
    np.testing.assert_array_equal(out.colors[2, :, :3], [[0, 0, 1]] * 3)
    np.testing.assert_array_equal(out.colors[3, :, :3], [[0, 1, 0]] * 3)  # inherited
    assert (out.colors[..., 3] == 1).all()


def test_normals_authored_are_transformed_by_the_inverse_transpose_else_computed():
    stage = Usd.Stage.CreateInMemory()
    # a 45-degree slanted triangle; authored per-vertex normal = its true normal
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 1]], np.float64)
    n = np.cross(pts[1] - pts[0], pts[2] - pts[0])
    n /= np.linalg.norm(n)
    a = _mesh(stage, "/A", pts, [3], [0, 1, 2])
    a.CreateSubdivisionSchemeAttr(UsdGeom.Tokens.none)
    a.CreateNormalsAttr([tuple(n)] * 3)
    a.SetNormalsInterpolation(UsdGeom.Tokens.vertex)
    UsdGeom.Xformable(a).AddScaleOp().Set(Gf.Vec3f(1, 3, 1))
    b = _mesh(stage, "/B", pts, [3], [0, 1, 2])
    b.CreateSubdivisionSchemeAttr(UsdGeom.Tokens.none)
    UsdGeom.Xformable(b).AddScaleOp().Set(Gf.Vec3f(1, 3, 1))
    m = wu.load_stage(stage).meshes
    w = pts * np.array([1, 3, 1])
    true_n = np.cross(w[1] - w[0], w[2] - w[0])
    true_n /= np.linalg.norm(true_n)
    # float32 normals, unit length: 1e-6
    np.testing.assert_allclose(m.normals[0], [true_n] * 3, atol=1e-6)  # authored, transformed
    np.testing.assert_allclose(m.normals[1], [true_n] * 3, atol=1e-6)  # computed (flat)


# ----------------------------------------------------------------------------- materials
def _preview(stage, path, **inputs):
    mat = UsdShade.Material.Define(stage, path)
    sh = UsdShade.Shader.Define(stage, f"{path}/S")
    sh.CreateIdAttr("UsdPreviewSurface")
    for k, (tn, v) in inputs.items():
        sh.CreateInput(k, tn).Set(v)
    mat.CreateSurfaceOutput().ConnectToSource(sh.ConnectableAPI(), "surface")
    return mat, sh


def test_preview_surface_mapping_and_subset_binding():
    stage = Usd.Stage.CreateInMemory()
    m = _mesh(stage, "/M", QUAD_PTS, [4, 3], [0, 1, 2, 3, 1, 4, 2])
    red, _ = _preview(
        stage,
        "/Looks/Red",
        diffuseColor=(Sdf.ValueTypeNames.Color3f, (0.8, 0.1, 0.1)),
        roughness=(Sdf.ValueTypeNames.Float, 0.5),
    )
    gold, _ = _preview(
        stage,
        "/Looks/Gold",
        diffuseColor=(Sdf.ValueTypeNames.Color3f, (1.0, 0.7, 0.3)),
        metallic=(Sdf.ValueTypeNames.Float, 1.0),
        roughness=(Sdf.ValueTypeNames.Float, 1.0),
    )
    UsdShade.MaterialBindingAPI.Apply(m.GetPrim()).Bind(red)
    sub = UsdGeom.Subset.CreateGeomSubset(
        m, "Tri", UsdGeom.Tokens.face, [1], UsdShade.Tokens.materialBind
    )
    UsdShade.MaterialBindingAPI.Apply(sub.GetPrim()).Bind(gold)
    scene = wu.load_stage(stage)
    mats = {x.name: x for x in scene.materials}
    idx = [scene.materials.index(mats[n]) for n in ("/Looks/Red", "/Looks/Gold")]
    assert scene.meshes.face_material.tolist() == [idx[0], idx[0], idx[1]]
    assert scene.meshes.subsets["/M/Tri"].tolist() == [2]
    r, g = mats["/Looks/Red"], mats["/Looks/Gold"]
    np.testing.assert_allclose(r.diffuse, [0.8, 0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(r.specular, [0.04] * 3, rtol=1e-6)
    assert r.shininess == pytest.approx(2 / 0.5**4 - 2)  # 30: GGX alpha = r^2 -> Blinn-Phong
    np.testing.assert_allclose(g.diffuse, np.array([1.0, 0.7, 0.3]) * 0.5, rtol=1e-6)
    np.testing.assert_allclose(g.specular, [1.0, 0.7, 0.3], rtol=1e-6)  # metal: its own colour
    assert g.shininess == pytest.approx(0.0)


def _textured_stage(folder: Path, tex_rel: str, write_texture: bool):
    from PIL import Image

    stage = Usd.Stage.CreateNew(str(folder / "scene.usda"))
    m = _mesh(stage, "/M", QUAD_PTS[:4], [4], [0, 1, 2, 3])
    st = UsdGeom.PrimvarsAPI(m).CreatePrimvar("uv1", Sdf.ValueTypeNames.TexCoord2fArray, "vertex")
    st.Set([(0, 0), (1, 0), (1, 1), (0, 1)])
    mat, sh = _preview(stage, "/Looks/T")
    reader = UsdShade.Shader.Define(stage, "/Looks/T/R")
    reader.CreateIdAttr("UsdPrimvarReader_float2")
    reader.CreateInput("varname", Sdf.ValueTypeNames.String).Set("uv1")
    tex = UsdShade.Shader.Define(stage, "/Looks/T/Tex")
    tex.CreateIdAttr("UsdUVTexture")
    tex.CreateInput("file", Sdf.ValueTypeNames.Asset).Set(tex_rel)
    tex.CreateInput("wrapS", Sdf.ValueTypeNames.Token).Set("clamp")
    tex.CreateInput("sourceColorSpace", Sdf.ValueTypeNames.Token).Set("raw")
    tex.CreateInput("st", Sdf.ValueTypeNames.Float2).ConnectToSource(
        reader.ConnectableAPI(), "result"
    )
    sh.CreateInput("diffuseColor", Sdf.ValueTypeNames.Color3f).ConnectToSource(
        tex.ConnectableAPI(), "rgb"
    )
    UsdShade.MaterialBindingAPI.Apply(m.GetPrim()).Bind(mat)
    stage.Save()
    if write_texture:
        (folder / "textures").mkdir(exist_ok=True)
        img = np.zeros((2, 2, 3), np.uint8)
        img[0, 0] = (255, 0, 0)
        Image.fromarray(img).save(folder / "textures" / "t.png")
    return folder / "scene.usda"


def test_texture_resolved_relative_to_its_layer_and_uv_primvar_from_the_reader(
    tmp_path, monkeypatch
):
    path = _textured_stage(tmp_path, "textures/t.png", write_texture=True)
    monkeypatch.chdir(Path(path.anchor))  # resolution must not depend on the working folder
    scene = wu.load_stage(path)
    (mat,) = scene.materials
    assert Path(mat.texture.path).resolve() == (tmp_path / "textures" / "t.png").resolve()
    assert mat.uv_primvar == "uv1" and mat.texture.wrap_s == wu.WrapMode.CLAMP
    assert mat.texture.texels.shape == (2, 2, 4)
    np.testing.assert_array_equal(mat.texture.texels[0, 0], [1, 0, 0, 1])  # raw: no decoding
    np.testing.assert_array_equal(scene.meshes.uvs[0], [(0, 0), (1, 0), (1, 1)])


def test_missing_texture_warns_once_naming_it_and_draws_the_fallback_colour(tmp_path):
    """As usdview (Storm): the UsdUVTexture's fallback (default black) replaces its texels."""
    path = _textured_stage(tmp_path, "textures/nope.png", write_texture=False)
    with pytest.warns(wu.SceneWarning, match=r"/Looks/T.*nope\.png.*not found") as record:
        scene = wu.load_stage(path)
    assert len(record) == 1
    (mat,) = scene.materials
    assert mat.texture is None
    np.testing.assert_array_equal(mat.diffuse, [0, 0, 0])
    assert len(scene.warnings) == 1 and "fallback colour (0.0, 0.0, 0.0)" in scene.warnings[0]


def test_usd_diagnostics_are_collected_not_printed(tmp_path, capfd):
    path = tmp_path / "refs.usda"
    path.write_text('#usda 1.0\ndef "A" ( prepend references = @gone.usda@ ) {}\n')
    scene = wu.load_stage(path)
    assert capfd.readouterr().err == ""  # USD printed nothing itself
    (problem,) = scene.unresolved
    assert problem.startswith("Could not open asset @gone.usda@ for reference")
    assert len(scene.diagnostics) == 1 and "@gone.usda@" in scene.diagnostics[0]
    assert "0x" not in scene.diagnostics[0]  # the stage's address is dropped


def test_non_finite_points_load_silently_and_are_flagged_per_mesh():
    stage = Usd.Stage.CreateInMemory()
    _mesh(stage, "/Good", QUAD_PTS[:3], [3], [0, 1, 2])
    _mesh(stage, "/Bad", [(np.nan, 0, 0), (0, np.inf, 0), (0, 0, 0)], [3], [0, 1, 2])
    hidden = _mesh(stage, "/Hidden", QUAD_PTS[:3], [3], [0, 1, 2])
    vis = UsdGeom.Imageable(hidden).CreateVisibilityAttr()
    vis.Set(UsdGeom.Tokens.invisible, 1.0)  # animated: hidden at 1, shown at 2
    vis.Set(UsdGeom.Tokens.inherited, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        scene = wu.load_stage(stage, time=1.0)
    # a hidden mesh's points are NaN on purpose (never drawn), not a fault of the file
    assert scene.meshes.nonfinite_meshes() == ["/Bad"]


def test_stage_renderer_defaults_to_expand_aperture_and_single_sided_culling():
    import inspect

    params = inspect.signature(wu.StageRenderer).parameters
    assert params["conform"].default == wu.AspectConform.EXPAND_APERTURE
    assert params["double_sided"].default is False


# ----------------------------------------------------------------------------- lights
def test_lights_directions_positions_and_dome_as_ambient():
    stage = Usd.Stage.CreateInMemory()
    sun = UsdLux.DistantLight.Define(stage, "/Sun")
    sun.CreateIntensityAttr(2.0)
    sun.AddRotateXOp().Set(-90.0)  # -Z rotated about X by -90 degrees: pointing down (-Y)
    bulb = UsdLux.SphereLight.Define(stage, "/Bulb")
    bulb.CreateIntensityAttr(1.0)
    bulb.CreateColorAttr(Gf.Vec3f(1.0, 0.5, 0.0))
    bulb.AddTranslateOp().Set(Gf.Vec3d(1, 2, 3))
    dome = UsdLux.DomeLight.Define(stage, "/Sky")
    dome.CreateIntensityAttr(0.5)
    lights = wu.read_lights(stage, Usd.TimeCode.Default())
    np.testing.assert_allclose(lights.directional[0, 0], [0, -1, 0], atol=1e-6)
    np.testing.assert_allclose(lights.directional[0, 1], [1, 1, 1])  # brightest = 1
    np.testing.assert_allclose(lights.point[0], [[1, 2, 3], [0.5, 0.25, 0.0]])  # 1 / 2 of it
    np.testing.assert_allclose(lights.ambient, [0.25] * 3)  # 0.5 / 2
    assert not lights.headlight


def test_stage_without_lights_gets_a_headlight():
    stage = Usd.Stage.CreateInMemory()
    _mesh(stage, "/M", QUAD_PTS[:3], [3], [0, 1, 2])
    assert wu.load_stage(stage).lights.headlight


# ----------------------------------------------------------------------------- animation
def _animated_stage():
    stage = Usd.Stage.CreateInMemory()
    stage.SetStartTimeCode(1)
    stage.SetEndTimeCode(3)
    m = _mesh(stage, "/M", QUAD_PTS[:3], [3], [0, 1, 2])
    pts = np.asarray(QUAD_PTS[:3], np.float32)
    for t in (1, 3):
        m.GetPointsAttr().Set(Vt.Vec3fArray.FromNumpy(pts * t), t)
    op = UsdGeom.Xformable(m).AddTranslateOp()
    op.Set(Gf.Vec3d(0, 0, 0), 1)
    op.Set(Gf.Vec3d(0, 0, 10), 3)
    _mesh(stage, "/Static", QUAD_PTS[:3], [3], [0, 1, 2])
    return stage, pts


def test_animation_reads_interpolated_samples_into_the_same_device_buffers():
    stage, pts = _animated_stage()
    scene = wu.load_stage(stage)
    r = wu.StageRenderer(scene, image_size=(8, 8), device=DEVICE)
    anim = wu.StageAnimation(scene)
    assert anim.dynamic_meshes == ["/M"]
    arrays = [r.buffers.verts, r.buffers.corners, r.buffers.faces]
    ptrs = [a.ptr for a in arrays]
    host = scene.meshes.verts
    anim.frame(r, 2.0)
    # linear interpolation of both samples at t = 2: points x2, translate z = 5
    np.testing.assert_allclose(r.buffers.verts.numpy()[:3], pts * 2 + [0, 0, 5], atol=ATOL_POS)
    np.testing.assert_allclose(r.buffers.verts.numpy()[3:], pts, atol=0)  # static mesh kept
    assert [a.ptr for a in arrays] == ptrs and r.buffers.verts is arrays[0]
    assert scene.meshes.verts is host  # host arrays updated in place too


def test_round_trip_of_a_stage_written_by_warp_usd_renderer(tmp_path):
    import warp.render

    path = str(tmp_path / "warp.usda")
    ren = warp.render.UsdRenderer(path, up_axis="Y", fps=10)
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0.5]], np.float32)
    idx = np.array([0, 1, 2, 1, 3, 2], np.int32)
    for k in range(3):
        ren.begin_frame(k / 10)
        ren.render_mesh("cloth", pts + np.float32(k), idx, update_topology=(k == 0))
        ren.end_frame()
    ren.save()
    scene = wu.load_stage(path)
    assert scene.meshes.num_faces == 2
    anim = wu.StageAnimation(scene)
    t0 = scene.frame_range[0]
    for k in range(3):
        # Warp writes time codes of t * fps; the points come back exactly (float32 both ways)
        got = anim.positions(t0 + k)
        np.testing.assert_array_equal(got, pts + np.float32(k))


# ----------------------------------------------------------------------------- errors
def test_bad_input_is_one_line_naming_the_file_or_prim(tmp_path):
    with pytest.raises(wu.SceneError, match=r"nope\.usda: no such file"):
        wu.load_stage(tmp_path / "nope.usda")
    bad = tmp_path / "bad.usda"
    bad.write_bytes(b"\x00\x01 not usd \xff" * 20)
    with pytest.raises(wu.SceneError, match=r"bad\.usda: not a readable USD layer") as err:
        wu.load_stage(bad)
    assert "\n" not in str(err.value)
    stage = Usd.Stage.CreateInMemory()
    UsdGeom.Xform.Define(stage, "/Empty")
    with pytest.raises(wu.SceneError, match="no meshes to render"):
        wu.load_stage(stage, require_meshes=True)
    _mesh(stage, "/Empty/M", QUAD_PTS[:3], [3], [0, 1, 7])
    with pytest.raises(
        wu.SceneError, match=r"/Empty/M: faceVertexIndices refers to point 7 but the mesh has 3"
    ):
        wu.load_stage(stage)
    stage2 = Usd.Stage.CreateInMemory()
    _mesh(stage2, "/M", QUAD_PTS[:3], [4], [0, 1, 2])
    with pytest.raises(
        wu.SceneError, match=r"/M: faceVertexCounts sum to 4 but faceVertexIndices has 3"
    ):
        wu.load_stage(stage2)
    stage3 = Usd.Stage.CreateInMemory()
    m = _mesh(stage3, "/M", QUAD_PTS[:3], [3], [0, 1, 2])
    UsdGeom.PrimvarsAPI(m).CreatePrimvar("st", Sdf.ValueTypeNames.TexCoord2fArray, "vertex").Set(
        [(0, 0)]
    )
    with pytest.raises(
        wu.SceneError, match=r"/M primvars:st: vertex primvar has 1 values, needs 3"
    ):
        wu.load_stage(stage3)


def test_camera_path_that_is_not_a_camera():
    stage = Usd.Stage.CreateInMemory()
    _mesh(stage, "/M", QUAD_PTS[:3], [3], [0, 1, 2])
    with pytest.raises(wu.SceneError, match=r"/M: is a Mesh, not a Camera"):
        wu.read_camera(stage.GetPrimAtPath("/M"), Usd.TimeCode.Default())
    scene = wu.load_stage(stage)
    with pytest.raises(ValueError, match=r"/Cam: not a camera of"):
        wu.StageRenderer(scene, camera="/Cam", image_size=(4, 4), device=DEVICE)


# ----------------------------------------------------------------------------- implicit prims
def test_implicit_prims_are_tessellated_with_their_size_and_axis():
    stage = Usd.Stage.CreateInMemory()
    UsdGeom.Cube.Define(stage, "/Cube").CreateSizeAttr(3.0)
    UsdGeom.Sphere.Define(stage, "/Ball").CreateRadiusAttr(0.5)
    cyl = UsdGeom.Cylinder.Define(stage, "/Cyl")
    cyl.CreateAxisAttr("X")
    cyl.CreateRadiusAttr(0.25)
    cyl.CreateHeightAttr(4.0)
    UsdGeom.Capsule.Define(stage, "/Cap")  # fallbacks: radius 0.5, height 1, axis Z
    m = wu.load_stage(stage).meshes
    assert m.names == ["/Cube", "/Ball", "/Cyl", "/Cap"]

    def verts(i):
        return m.verts[m.vert_first[i] : m.vert_first[i] + m.vert_count[i]].astype(np.float64)

    assert m.face_count[0] == 12
    np.testing.assert_allclose(np.abs(verts(0)), 1.5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(verts(1), axis=1), 0.5, atol=1e-6)
    c = verts(2)
    np.testing.assert_allclose([c[:, 0].min(), c[:, 0].max()], [-2, 2], atol=1e-6)  # along X
    np.testing.assert_allclose(np.linalg.norm(c[:, 1:], axis=1), 0.25, atol=1e-6)
    cap = verts(3)
    np.testing.assert_allclose(
        [cap[:, 2].min(), cap[:, 2].max()], [-1, 1], atol=1e-6
    )  # 1 + 2 * 0.5
    # closed, outward-facing surfaces: the divergence theorem gives a positive volume
    for i in range(4):
        f = m.faces[m.face_first[i] : m.face_first[i] + m.face_count[i]]
        p = m.verts[f].astype(np.float64)
        vol = np.einsum("ij,ij->i", p[:, 0], np.cross(p[:, 1], p[:, 2])).sum() / 6
        assert vol > 0, m.names[i]


INSTALLED_STAGES = [
    ("warp", "examples/assets/bunny.usd"),
    ("warp", "tests/assets/torus.usda"),
    ("newton", "examples/assets/ant.usda"),
]


@pytest.mark.parametrize("package, rel", INSTALLED_STAGES, ids=[r for _, r in INSTALLED_STAGES])
def test_stages_shipped_with_installed_packages_render(package, rel):
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        pytest.skip(f"{package} is not installed")
    path = Path(spec.origin).parent / rel
    if not path.is_file():
        pytest.skip(f"{path} is not shipped with this version")
    scene = wu.load_stage(path, require_meshes=True)
    r = wu.StageRenderer(scene, image_size=(24, 32), device=DEVICE)
    out = r.render()
    # the default camera frames the bounds: something covers the middle, not everything
    assert 0.02 < out.coverage < 0.9
    assert (out.face_id[out.face_id >= 0] < scene.meshes.num_faces).all()
    assert np.isfinite(out.color).all() and (out.color[..., :3][out.face_id >= 0].sum(-1) > 0).all()


def test_import_warpraster_and_the_usd_containers_stay_free_of_pxr():
    import subprocess
    import sys

    code = (
        "import sys, warpraster, warpraster.usd, warpraster.usd.render, warpraster.cli; "
        "assert 'pxr' not in sys.modules, 'pxr imported'; "
        "warpraster.usd.load_stage; assert 'pxr' in sys.modules"  # first use imports it
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_render_device_is_capturable_and_replays_later_frames():
    import warp as wp

    stage, _ = _animated_stage()
    cam = UsdGeom.Camera.Define(stage, "/Cam")
    cam.AddTranslateOp().Set(Gf.Vec3d(0.5, 0.5, 8.0), 1)
    cam.GetPrim().GetAttribute("xformOp:translate").Set(Gf.Vec3d(1.0, 0.5, 9.0), 3)
    scene = wu.load_stage(stage)
    anim = wu.StageAnimation(scene)
    r = wu.StageRenderer(scene, camera="/Cam", image_size=(20, 24), spp=4, device=DEVICE)
    # eager reference of frame 3
    anim.frame(r, 3.0)
    want = r.render()
    # capture at frame 1 (warm: modules loaded), replay after writing frame 3
    anim.frame(r, 1.0)
    r.render_device()
    with wp.ScopedCapture(device=DEVICE, force_module_load=False) as cap:
        r.render_device()
    first = r.output()
    assert not np.array_equal(first.face_id, want.face_id)  # the frames differ
    anim.frame(r, 3.0)
    wp.capture_launch(cap.graph)
    got = r.output()
    np.testing.assert_array_equal(got.face_id, want.face_id)
    np.testing.assert_array_equal(got.color, want.color)  # same kernels, same inputs: bit-identical
    np.testing.assert_array_equal(got.depth, want.depth)


def test_render_device_replays_its_own_graph_and_follows_every_frame():
    """``StageRenderer.call_graphs`` (CUDA's default, forced here on the cpu device):
    from the second call on, ``render_device`` replays its launches as one graph.
    Over animated frames, a camera moved between frames and a back-and-forth in
    time, every output equals the launches one by one bit for bit (the same
    kernels on the same inputs), the graph really replays, and a call on a
    ``wp.Tape`` launches one by one."""
    import warp as wp

    stage, _ = _animated_stage()
    cam = UsdGeom.Camera.Define(stage, "/Cam")
    cam.AddTranslateOp().Set(Gf.Vec3d(0.5, 0.5, 8.0), 1)
    cam.GetPrim().GetAttribute("xformOp:translate").Set(Gf.Vec3d(1.0, 0.5, 9.0), 3)
    scene = wu.load_stage(stage)
    renderers = {}
    for mode in (False, True):
        r = wu.StageRenderer(scene, camera="/Cam", image_size=(20, 24), spp=4, antialias=True,
                             device=DEVICE)  # fmt: skip
        r.call_graphs = mode
        renderers[mode] = r
    anim = wu.StageAnimation(scene)
    anim.frame(renderers[True], 3.0)
    m = np.array(renderers[True].camera.cam_to_world, np.float64)
    m[3, :3] += (0.3, -0.1, 0.5)
    moved = replace(renderers[True].camera, cam_to_world=m, focal_length=45.0)
    replays = 0
    colors = []
    for step, t in enumerate((1.0, 1.0, 2.0, 3.0, 3.0, 2.0)):
        outs = {}
        for mode, r in renderers.items():
            anim.frame(r, t)
            if step == 4:
                r.set_frame(camera=moved)
            r.render_device()
            outs[mode] = r.output()
        replays += renderers[True]._call_graph._graph is not None
        colors.append(outs[False].color)
        for name in ("color", "depth", "face_id", "mesh_id"):
            np.testing.assert_array_equal(getattr(outs[True], name), getattr(outs[False], name),
                                          err_msg=f"frame {t} (step {step}) {name}")  # fmt: skip
    assert replays >= 4  # captured on the second call, replayed from then on
    # the replays had something to follow: each new frame, and the moved camera
    for i, j in ((1, 2), (2, 3), (3, 4), (4, 5)):
        assert not np.array_equal(colors[i], colors[j]), (i, j)
    assert renderers[False]._call_graph._graph is None
    with wp.Tape():
        renderers[True].render_device()  # on a tape: one by one (nothing to replay into)
    np.testing.assert_array_equal(renderers[True].output().color, outs[True].color)


def test_scene_meshes_as_packed_batches_rasterize_like_the_renderer():
    import warpraster as wr

    stage = Usd.Stage.CreateInMemory()
    _mesh(stage, "/A", [[-1, -1, 0], [1, -1, 0], [0, 1, 0]], [3], [0, 1, 2])
    _mesh(stage, "/B", [[-1, -1, -1], [1, -1, -1], [1, 1, -1], [-1, 1, -1]], [4], [0, 1, 2, 3])
    scene = wu.load_stage(stage)
    one = scene.meshes.packed(device=DEVICE)
    per = scene.meshes.packed(per_mesh=True, device=DEVICE)
    assert (one.num_meshes, per.num_meshes, one.num_faces) == (1, 2, 3)
    assert per.num_faces_per_mesh.numpy().tolist() == [1, 2]
    cam = wu.CameraParams(name="c", cam_to_world=np.diag([1.0, 1.0, 1.0, 1.0]))
    cam.cam_to_world[3, :3] = (0, 0, 5)
    r = wu.StageRenderer(scene, camera=cam, image_size=(16, 16), device=DEVICE)
    want = r.fragments().pix_to_face.numpy()
    ras = wr.MeshRasterizer(r._cameras, r._rasterizer.raster_settings)
    got = ras(one.verts, one.faces, one.mesh_to_face_first_idx, one.num_faces_per_mesh).numpy()
    np.testing.assert_array_equal(got["pix_to_face"], want)


def test_point_instancer_places_each_prototype_instance_by_hand():
    stage = Usd.Stage.CreateInMemory()
    pi = UsdGeom.PointInstancer.Define(stage, "/PI")
    UsdGeom.Xformable(pi).AddTranslateOp().Set(Gf.Vec3d(0, 0, 10))
    tri = UsdGeom.Xform.Define(stage, "/PI/Protos/Tri")
    tri.AddScaleOp().Set(Gf.Vec3f(2, 2, 2))
    _mesh(stage, "/PI/Protos/Tri/M", [[0, 0, 0], [1, 0, 0], [0, 1, 0]], [3], [0, 1, 2])
    _mesh(stage, "/PI/Protos/Quad", QUAD_PTS[:4], [4], [0, 1, 2, 3])
    pi.CreatePrototypesRel().SetTargets(["/PI/Protos/Tri", "/PI/Protos/Quad"])
    pi.CreateProtoIndicesAttr([1, 0, 0])
    pi.CreatePositionsAttr([(0, 5, 0), (1, 0, 0), (3, 0, 0)])
    pi.CreateOrientationsAttr([Gf.Quath(1, 0, 0, 0), Gf.Quath(1, 0, 0, 0), Gf.Quath(0, 0, 0, 1)])
    m = wu.load_stage(stage).meshes
    # the prototypes are drawn only through the instancer: 3 instances, not 5 meshes
    assert m.names == ["/PI[0]/PI/Protos/Quad", "/PI[1]/PI/Protos/Tri/M", "/PI[2]/PI/Protos/Tri/M"]
    tri_pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], float)
    rot_z180 = np.diag([-1.0, -1.0, 1.0])  # quaternion (w=0, z=1): 180 degrees about Z
    np.testing.assert_allclose(m.verts[:4], np.asarray(QUAD_PTS[:4]) + [0, 5, 10], atol=ATOL_POS)
    np.testing.assert_allclose(m.verts[4:7], tri_pts * 2 + [1, 0, 10], atol=ATOL_POS)
    np.testing.assert_allclose(m.verts[7:10], (tri_pts * 2) @ rot_z180 + [3, 0, 10], atol=ATOL_POS)


def test_animated_visibility_hides_a_mesh_on_the_frames_it_is_invisible():
    stage = Usd.Stage.CreateInMemory()
    m = _mesh(stage, "/M", [[-1, -1, 0], [1, -1, 0], [0, 1, 0]], [3], [0, 1, 2])
    vis = UsdGeom.Imageable(m).CreateVisibilityAttr()
    vis.Set(UsdGeom.Tokens.inherited, 1)
    vis.Set(UsdGeom.Tokens.invisible, 2)
    stage.SetStartTimeCode(1)
    stage.SetEndTimeCode(2)
    scene = wu.load_stage(stage)
    cam = wu.CameraParams(name="c", cam_to_world=np.eye(4))
    cam.cam_to_world[3, :3] = (0, 0, 5)
    r = wu.StageRenderer(scene, camera=cam, image_size=(12, 12), device=DEVICE)
    anim = wu.StageAnimation(scene)
    anim.frame(r, 1)
    assert (r.render().face_id >= 0).sum() > 10
    anim.frame(r, 2)
    assert (r.render().face_id >= 0).sum() == 0
    anim.frame(r, 1)
    assert (r.render().face_id >= 0).sum() > 10


def test_usdz_package_with_its_texture_inside(tmp_path):
    from pxr import UsdUtils

    from warpraster.cli import default_scene_path

    usdz = tmp_path / "scene.usdz"
    assert UsdUtils.CreateNewUsdzPackage(Sdf.AssetPath(str(default_scene_path())), str(usdz))
    scene = wu.load_stage(usdz)
    (tex,) = [m.texture for m in scene.materials if m.texture is not None]
    assert tex.path.endswith("checker.png]")  # resolved inside the package
    from PIL import Image

    from warpraster.usd.materials import srgb_to_linear

    png = np.asarray(Image.open(default_scene_path().parent / "checker.png").convert("RGB"))
    np.testing.assert_array_equal(tex.texels[..., :3], srgb_to_linear(png / 255.0))
    assert scene.meshes.num_faces == 3622


@pytest.mark.parametrize(
    "spp, grid", [(1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (6, (2, 3)), (7, (1, 7))]
)
def test_spp_grid_is_as_square_as_possible(spp, grid):
    from warpraster.usd.render import parse_spp

    assert parse_spp(spp) == grid


# ----------------------------------------------------------------------------- shading
def _wrap_ref(i, n, mode):
    """UsdUVTexture wrap of texel index ``i`` into [0, n); None outside for black."""
    if mode == wu.WrapMode.CLAMP:
        return min(max(i, 0), n - 1)
    if mode == wu.WrapMode.MIRROR:
        p = i % (2 * n)
        return 2 * n - 1 - p if p >= n else p
    if mode == wu.WrapMode.BLACK:
        return i if 0 <= i < n else None
    return i % n


def _texture_ref(tex, uv):
    """Bilinear texel at ``uv`` (v = 0 the bottom row, texel centres at half-integers)."""
    h, w = tex.texels.shape[:2]
    x, y = uv[0] * w - 0.5, (1.0 - uv[1]) * h - 0.5
    x0, y0 = math.floor(x), math.floor(y)
    fx, fy = x - x0, y - y0
    out = np.zeros(4)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            ix, iy = _wrap_ref(x0 + dx, w, tex.wrap_s), _wrap_ref(y0 + dy, h, tex.wrap_t)
            texel = [0, 0, 0, 1] if ix is None or iy is None else tex.texels[iy, ix]
            out += wy * wx * np.asarray(texel, np.float64)
    return out


def _unit(v):
    return v / max(np.linalg.norm(v), 1e-6)  # PyTorch3D's F.normalize epsilon


def _phong_ref(p, n, d, light, cam, kd, ks, shininess):
    """PyTorch3D's Lambert and Phong terms of one light (``d`` toward the light)."""
    n, d = _unit(n), _unit(d)
    cos = n @ d
    reflect = -d + 2.0 * cos * n
    a = max(_unit(cam - p) @ reflect, 0.0) if cos > 0 else 0.0
    power = a**shininess if a > 0 else (1.0 if shininess == 0 else 0.0)
    return light * max(cos, 0.0) * kd + light * power * ks


def _sample_ref(scene, f, bary, eye, forward, ortho):
    """Premultiplied RGBA of one covered sample, in float64."""
    m = scene.meshes
    b = np.maximum(np.asarray(bary, np.float64), 0.0)
    b = b / b.sum() if b.sum() > 0 else b
    p = b @ m.verts[m.faces[f]].astype(np.float64)
    n = b @ m.normals[f].astype(np.float64)
    col = b @ m.colors[f].astype(np.float64)
    uv = b @ m.uvs[f].astype(np.float64)
    if n @ (-forward if ortho else eye - p) < 0:
        n = -n  # two-sided: toward the viewer
    cam = p - forward * 1e6 if ortho else eye
    kd, ks, shininess, alpha = col[:3], np.zeros(3), 10.0, col[3]
    if m.face_material[f] >= 0:
        mat = scene.materials[m.face_material[f]]
        kd, ks = np.asarray(mat.diffuse, np.float64), np.asarray(mat.specular, np.float64)
        shininess, alpha = mat.shininess / 4.0, mat.opacity  # Blinn-Phong -> Phong exponent
        if mat.texture is not None:
            t = _texture_ref(mat.texture, uv)
            kd = kd * (t[:3] * mat.texture.scale[:3] + mat.texture.bias[:3])
    lights = scene.lights
    rgb = np.asarray(lights.ambient, np.float64) * kd
    for direction, light in lights.directional.astype(np.float64):
        rgb = rgb + _phong_ref(p, n, -direction, light, cam, kd, ks, shininess)
    for position, light in lights.point.astype(np.float64):
        rgb = rgb + _phong_ref(p, n, position - p, light, cam, kd, ks, shininess)
    alpha = min(max(alpha, 0.0), 1.0)
    return np.append(rgb * alpha, alpha)


def _render_ref(r):
    """The renderer's pictures from its own fragments: shading, box filter and ids in float64."""
    frags = r.fragments()
    p2f = frags.pix_to_face.numpy()[0, ..., 0]
    zbuf = frags.zbuf.numpy()[0, ..., 0]
    bary = frags.bary_coords.numpy()[0, :, :, 0]
    eye, forward, far = r.buffers.view.numpy().astype(np.float64)
    ortho = r.camera.projection == wu.Projection.ORTHOGRAPHIC
    sy, sx = r.grid
    h, w = r.image_size
    hit = (p2f >= 0) & (zbuf <= far[0])
    rgba = np.zeros((*p2f.shape, 4))
    for ys, xs in zip(*np.nonzero(hit), strict=True):
        f = p2f[ys, xs]
        rgba[ys, xs] = _sample_ref(r.scene, f, bary[ys, xs], eye, forward, ortho)
    mean = rgba.reshape(h, sy, w, sx, 4).mean(axis=(1, 3))
    a = mean[..., 3:]
    color = np.where(a > 0, np.concatenate([mean[..., :3] / np.where(a > 0, a, 1), a], -1), 0)
    centre = (slice(sy // 2, None, sy), slice(sx // 2, None, sx))
    face = np.where(hit[centre], p2f[centre], -1)
    mesh = np.where(face >= 0, r.scene.meshes.face_mesh[np.maximum(face, 0)], -1)
    depth = np.where(face >= 0, zbuf[centre], np.inf)
    return color, depth, face, mesh


def _shading_scene():
    """A bumpy grid with per-corner colours and UVs beyond [0, 1], textured materials
    in every wrap mode, a plain material, faces without one, and three lights."""
    rng = np.random.default_rng(7)
    n = 4
    xs, ys = np.meshgrid(np.linspace(-2, 2, n), np.linspace(-2, 2, n))
    verts = np.stack([xs.ravel(), ys.ravel(), 0.4 * rng.standard_normal(n * n)], 1)
    faces = []
    for i in range(n - 1):
        for j in range(n - 1):
            a = i * n + j
            faces += [[a, a + 1, a + n + 1], [a, a + n + 1, a + n]]
    scene = wu.scene_from_arrays(verts, np.array(faces), smooth=True)
    m = scene.meshes
    m.uvs[:] = rng.uniform(-1.5, 2.5, m.uvs.shape)
    m.colors[..., :3] = rng.uniform(0, 1, (m.num_faces, 3, 3))
    m.colors[..., 3] = rng.uniform(0.3, 1, (m.num_faces, 3))
    W = wu.WrapMode
    for k, (ws, wt) in enumerate([(W.REPEAT, W.CLAMP), (W.MIRROR, W.BLACK), (W.BLACK, W.MIRROR)]):
        texels = rng.uniform(0, 1, (3 + k, 4 - k, 4)).astype(np.float32)
        tex = wu.TextureImage(f"t{k}", texels, ws, wt, (1.0, 0.5, 2.0, 1.0), (0.0, 0.1, -0.2, 0.0))
        scene.materials.append(
            wu.Material(f"m{k}", rng.uniform(0, 1, 3), rng.uniform(0, 1, 3), 20.0 + 15 * k,
                        0.6 + 0.1 * k, tex)
        )  # fmt: skip
    scene.materials.append(wu.Material("plain", shininess=7.0))
    m.face_material[:] = np.arange(m.num_faces) % (len(scene.materials) + 1) - 1
    directional = [[[0.2, -0.3, -1.0], [0.7, 0.6, 0.5]], [[-1.0, 0.0, -0.2], [0.1, 0.3, 0.2]]]
    scene.lights = wu.LightSet(
        directional=np.array(directional, np.float32),
        point=np.array([[[0.5, 0.5, 3.0], [2.0, 1.5, 1.0]]], np.float32),
        ambient=np.array([0.05, 0.1, 0.07], np.float32),
        names=["d0", "d1", "p0"],
    )
    return scene


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("projection", list(wu.Projection), ids=lambda p: p.name.lower())
def test_shading_matches_a_float64_reference_of_the_samples(projection, device):
    scene = _shading_scene()
    # the far distance cuts through the bumps (z within +-1 of 0): samples beyond it are empty
    cam = wu.CameraParams(name="c", cam_to_world=np.eye(4), projection=projection, far=12.1)
    cam.cam_to_world[3, :3] = (0.3, -0.2, 12.0)
    if projection == wu.Projection.ORTHOGRAPHIC:
        cam.horizontal_aperture = cam.vertical_aperture = 50.0  # 5 scene units across
    # both apertures across the whole 12 x 10 image (the view this test's coverage
    # bounds were chosen for; the default, expandAperture, would show more around it)
    r = wu.StageRenderer(scene, camera=cam, image_size=(10, 12), spp=4, device=device,
                         conform=wu.AspectConform.ADJUST_PIXEL_ASPECT_RATIO)  # fmt: skip
    out = r.render()
    color, depth, face, mesh = _render_ref(r)
    assert 0.3 < out.coverage < 1.0  # empty and covered pixels both checked
    np.testing.assert_array_equal(out.face_id, face)
    np.testing.assert_array_equal(out.mesh_id, mesh)
    np.testing.assert_array_equal(out.depth, depth.astype(np.float32))
    # float32 kernel vs float64: values of order 1 through pow(x, shininess <= 17) and
    # a division by alpha >= 0.3 / 4: a few float32 ulps, amplified up to ~20x (2.2e-6
    # measured on cpu); 2e-5 leaves room for CUDA's powf / rsqrt rounding
    np.testing.assert_allclose(out.color, color, rtol=0, atol=2e-5)


def test_a_renderer_reused_over_frames_draws_each_frame_as_a_fresh_one():
    """The bundled scene's frames through one StageRenderer (its buffers, faces'
    winding and back-face cull rewritten in place every frame, its raster
    workspaces reused) equal each frame drawn by a renderer made for it alone,
    bit for bit (the same kernels on the same inputs)."""
    path = Path(wu.__file__).resolve().parents[1] / "assets" / "default_scene.usda"
    scene = wu.load_stage(str(path))
    anim = wu.StageAnimation(scene)
    size = (48, 72)
    reused = wu.StageRenderer(scene, image_size=size, spp=1, device=DEVICE)
    for t in (1.0, 2.0, 9.0, 4.0):
        anim.frame(reused, t)
        got = reused.render()
        fresh = wu.StageRenderer(scene, image_size=size, spp=1, device=DEVICE)
        anim.frame(fresh, t)
        want = fresh.render()
        assert (want.face_id >= 0).mean() > 0.3  # the scene fills the picture
        np.testing.assert_array_equal(got.face_id, want.face_id, err_msg=f"frame {t}")
        np.testing.assert_array_equal(got.color, want.color, err_msg=f"frame {t}")
        np.testing.assert_array_equal(got.depth, want.depth, err_msg=f"frame {t}")
