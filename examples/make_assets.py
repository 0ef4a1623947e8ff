"""Builds the bundled USD scene, ``warpraster/assets/default_scene.usda``, and its texture.

What it holds (every kind of thing ``warpraster render`` reads):

* ``/World/Ground``: a quad (a 4-gon, fan-triangulated) with face-varying ``st``
  and a ``UsdPreviewSurface`` whose diffuse colour is a ``UsdUVTexture``
  (``checker.png``, repeated 4 x 4);
* ``/World/Torus``: a torus spinning a full turn about +Y over frames 1-48
  (time-sampled transform), red plastic, smooth (Catmull-Clark) normals;
* ``/World/Ball``: an icosphere of gold metal (``metallic`` = 1);
* ``/World/Crates/Crate_0..2``: three instances (``instanceable``) of one cube
  prototype, whose top face is a ``GeomSubset`` bound to its own material;
* ``/World/Camera`` (a 35 mm lens on a 36 x 24 aperture), a distant light, a
  sphere light and a dome light.

``assets/default_scene.usda`` at the top of the repository is a one-line layer
that sublayers this file, so ``warpraster render assets/default_scene.usda``
works from a checkout too.

Run from anywhere: ``python examples/make_assets.py`` (``--out DIR`` writes
elsewhere; ``--help`` only prints this).
"""

from __future__ import annotations

import argparse
from os.path import relpath as os_relpath
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ASSETS = ROOT / "warpraster" / "assets"
FRAMES = (1, 48)


def checker(size: int = 64, squares: int = 8) -> np.ndarray:
    """(size, size, 3) uint8 two-tone checkerboard with a thin grid line."""
    i = np.arange(size) * squares // size
    board = (i[:, None] + i[None, :]) % 2
    light = np.array([226, 220, 205], np.uint8)
    dark = np.array([70, 92, 120], np.uint8)
    img = np.where(board[..., None] == 1, light, dark)
    edge = (np.arange(size) % (size // squares)) == 0
    img[edge, :] = img[edge, :] // 2 + 40
    img[:, edge] = img[:, edge] // 2 + 40
    return img


def _mesh(stage, path, points, counts, indices, *, scheme="none"):
    from pxr import UsdGeom, Vt

    mesh = UsdGeom.Mesh.Define(stage, path)
    mesh.CreatePointsAttr(Vt.Vec3fArray.FromNumpy(np.asarray(points, np.float32)))
    mesh.CreateFaceVertexCountsAttr(Vt.IntArray.FromNumpy(np.asarray(counts, np.int32)))
    mesh.CreateFaceVertexIndicesAttr(Vt.IntArray.FromNumpy(np.asarray(indices, np.int32).ravel()))
    mesh.CreateSubdivisionSchemeAttr(scheme)
    pts = np.asarray(points, np.float32)
    mesh.CreateExtentAttr([tuple(pts.min(0).tolist()), tuple(pts.max(0).tolist())])
    return mesh


def _material(stage, path, *, color=None, texture=None, roughness=0.5, metallic=0.0):
    from pxr import Sdf, UsdShade

    mat = UsdShade.Material.Define(stage, path)
    surf = UsdShade.Shader.Define(stage, f"{path}/Surface")
    surf.CreateIdAttr("UsdPreviewSurface")
    surf.CreateInput("roughness", Sdf.ValueTypeNames.Float).Set(roughness)
    surf.CreateInput("metallic", Sdf.ValueTypeNames.Float).Set(metallic)
    diffuse = surf.CreateInput("diffuseColor", Sdf.ValueTypeNames.Color3f)
    if texture is None:
        diffuse.Set(tuple(color))
    else:
        reader = UsdShade.Shader.Define(stage, f"{path}/StReader")
        reader.CreateIdAttr("UsdPrimvarReader_float2")
        reader.CreateInput("varname", Sdf.ValueTypeNames.Token).Set("st")
        tex = UsdShade.Shader.Define(stage, f"{path}/Texture")
        tex.CreateIdAttr("UsdUVTexture")
        tex.CreateInput("file", Sdf.ValueTypeNames.Asset).Set(texture)
        tex.CreateInput("wrapS", Sdf.ValueTypeNames.Token).Set("repeat")
        tex.CreateInput("wrapT", Sdf.ValueTypeNames.Token).Set("repeat")
        tex.CreateInput("sourceColorSpace", Sdf.ValueTypeNames.Token).Set("sRGB")
        tex.CreateInput("st", Sdf.ValueTypeNames.Float2).ConnectToSource(
            reader.ConnectableAPI(), "result"
        )
        diffuse.ConnectToSource(tex.ConnectableAPI(), "rgb")
    mat.CreateSurfaceOutput().ConnectToSource(surf.ConnectableAPI(), "surface")
    return mat


def build_stage(texture_name: str = "checker.png"):
    """The default scene as an in-memory ``Usd.Stage`` (its texture path is relative)."""
    from pxr import Gf, Sdf, Usd, UsdGeom, UsdLux, UsdShade

    from warpraster.primitives import ico_sphere, torus

    stage = Usd.Stage.CreateInMemory()
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.y)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    stage.SetStartTimeCode(FRAMES[0])
    stage.SetEndTimeCode(FRAMES[1])
    stage.SetTimeCodesPerSecond(24)
    world = UsdGeom.Xform.Define(stage, "/World")
    stage.SetDefaultPrim(world.GetPrim())

    looks = {
        "ground": _material(stage, "/World/Looks/Checker", texture=texture_name, roughness=0.8),
        "red": _material(
            stage, "/World/Looks/RedPlastic", color=(0.70, 0.06, 0.04), roughness=0.35
        ),
        "gold": _material(
            stage, "/World/Looks/Gold", color=(1.0, 0.71, 0.29), roughness=0.3, metallic=1.0
        ),
        "wood": _material(stage, "/World/Looks/Wood", color=(0.45, 0.28, 0.13), roughness=0.7),
        "teal": _material(stage, "/World/Looks/Teal", color=(0.05, 0.45, 0.42), roughness=0.5),
    }

    # ground: one quad, face-varying st repeating the texture 4 x 4
    s = 3.0
    ground = _mesh(
        stage, "/World/Ground", [(-s, 0, s), (s, 0, s), (s, 0, -s), (-s, 0, -s)], [4], [0, 1, 2, 3]
    )
    st = UsdGeom.PrimvarsAPI(ground).CreatePrimvar(
        "st", Sdf.ValueTypeNames.TexCoord2fArray, UsdGeom.Tokens.faceVarying
    )
    st.Set([(0, 0), (4, 0), (4, 4), (0, 4)])
    UsdShade.MaterialBindingAPI.Apply(ground.GetPrim()).Bind(looks["ground"])

    # torus: spins about +Y over the frame range
    tv, tf = torus(major_radius=0.75, minor_radius=0.28, rings=48, sides=24)
    tor = _mesh(stage, "/World/Torus", tv, np.full(len(tf), 3), tf, scheme="catmullClark")
    xf = UsdGeom.Xformable(tor)
    xf.AddTranslateOp().Set(Gf.Vec3d(-0.55, 1.0, 0.2))
    spin = xf.AddRotateYOp()
    spin.Set(0.0, FRAMES[0])
    spin.Set(360.0, FRAMES[1])
    xf.AddRotateXOp().Set(65.0)
    UsdShade.MaterialBindingAPI.Apply(tor.GetPrim()).Bind(looks["red"])

    # ball
    sv, sf = ico_sphere(3)
    ball = _mesh(stage, "/World/Ball", sv * 0.6, np.full(len(sf), 3), sf, scheme="catmullClark")
    UsdGeom.Xformable(ball).AddTranslateOp().Set(Gf.Vec3d(0.95, 0.6, -0.35))
    UsdShade.MaterialBindingAPI.Apply(ball.GetPrim()).Bind(looks["gold"])

    # crate prototype (quads), instanced three times; its top face is a subset
    proto = UsdGeom.Xform.Define(stage, "/Prototypes/Crate")
    proto.GetPrim().SetSpecifier(Sdf.SpecifierClass)
    c = 0.25
    cube_pts = [(x, y, z) for x in (-c, c) for y in (0, 2 * c) for z in (-c, c)]
    quads = [[0, 1, 3, 2], [4, 6, 7, 5], [0, 4, 5, 1], [2, 3, 7, 6], [0, 2, 6, 4], [1, 5, 7, 3]]
    box = _mesh(stage, "/Prototypes/Crate/Box", cube_pts, [4] * 6, quads)
    UsdShade.MaterialBindingAPI.Apply(box.GetPrim()).Bind(looks["wood"])
    top = UsdGeom.Subset.CreateGeomSubset(
        box, "Top", UsdGeom.Tokens.face, [3], familyName=UsdShade.Tokens.materialBind
    )
    UsdShade.MaterialBindingAPI.Apply(top.GetPrim()).Bind(looks["teal"])
    UsdGeom.Xform.Define(stage, "/World/Crates")
    for k, (x, z, yaw) in enumerate(
        [(-1.9, -1.2, 10.0), (-1.25, -1.75, 35.0), (1.95, 0.95, -20.0)]
    ):
        inst = UsdGeom.Xform.Define(stage, f"/World/Crates/Crate_{k}")
        inst.GetPrim().GetReferences().AddInternalReference("/Prototypes/Crate")
        inst.GetPrim().SetInstanceable(True)
        inst.AddTranslateOp().Set(Gf.Vec3d(x, 0.0, z))
        inst.AddRotateYOp().Set(yaw)

    # camera: a 35 mm lens on a 36 x 24 mm aperture, looking at the middle of the set
    cam = UsdGeom.Camera.Define(stage, "/World/Camera")
    cam.CreateFocalLengthAttr(35.0)
    cam.CreateHorizontalApertureAttr(36.0)
    cam.CreateVerticalApertureAttr(24.0)
    cam.CreateClippingRangeAttr(Gf.Vec2f(0.1, 100.0))
    eye, target = np.array([2.6, 2.9, 5.4]), np.array([0.0, 0.55, 0.0])
    from warpraster.usd.cameras import look_at_matrix

    m = look_at_matrix(eye, target, (0.0, 1.0, 0.0))
    cam.AddTransformOp().Set(Gf.Matrix4d(m.tolist()))

    # lights
    sun = UsdLux.DistantLight.Define(stage, "/World/Lights/Sun")
    sun.CreateIntensityAttr(3.0)
    sun.CreateColorAttr(Gf.Vec3f(1.0, 0.96, 0.9))
    sun.AddRotateXYZOp().Set(Gf.Vec3f(-50.0, 35.0, 0.0))
    fill = UsdLux.SphereLight.Define(stage, "/World/Lights/Fill")
    fill.CreateIntensityAttr(1.2)
    fill.CreateRadiusAttr(0.2)
    fill.CreateColorAttr(Gf.Vec3f(0.75, 0.85, 1.0))
    fill.AddTranslateOp().Set(Gf.Vec3d(-4.0, 3.0, 2.0))
    dome = UsdLux.DomeLight.Define(stage, "/World/Lights/Sky")
    dome.CreateIntensityAttr(0.5)
    dome.CreateColorAttr(Gf.Vec3f(0.55, 0.6, 0.7))
    return stage


def write(out_dir: Path) -> list[Path]:
    """Writes ``default_scene.usda`` and ``checker.png`` into ``out_dir``."""
    from PIL import Image

    out_dir.mkdir(parents=True, exist_ok=True)
    tex = out_dir / "checker.png"
    Image.fromarray(checker()).save(tex)
    stage = build_stage(tex.name)
    usda = out_dir / "default_scene.usda"
    stage.GetRootLayer().documentation = "warpraster default scene (examples/make_assets.py)"
    stage.GetRootLayer().Export(str(usda))
    return [usda, tex]


def write_pointer(path: Path, target: Path) -> Path:
    """A layer at ``path`` that sublayers ``target`` (relative), with the same stage metadata."""
    from pxr import Sdf

    rel = Path(os_relpath(target, path.parent)).as_posix()
    layer = Sdf.Layer.CreateAnonymous(".usda")
    src = Sdf.Layer.FindOrOpen(str(target))
    layer.subLayerPaths.append(rel)
    for key in (
        "defaultPrim",
        "startTimeCode",
        "endTimeCode",
        "timeCodesPerSecond",
        "upAxis",
        "metersPerUnit",
    ):
        if src.pseudoRoot.HasInfo(key):
            layer.pseudoRoot.SetInfo(key, src.pseudoRoot.GetInfo(key))
    layer.documentation = f"warpraster default scene: sublayers {rel} (examples/make_assets.py)"
    path.parent.mkdir(parents=True, exist_ok=True)
    layer.Export(str(path))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Writes default_scene.usda and checker.png (needs usd-core and pillow).",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=PACKAGE_ASSETS,
        help=f"folder to write to (default: {PACKAGE_ASSETS.relative_to(ROOT)})",
    )
    args = ap.parse_args(argv)
    paths = write(args.out)
    if args.out.resolve() == PACKAGE_ASSETS.resolve():
        paths.append(write_pointer(ROOT / "assets" / "default_scene.usda", paths[0]))
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
