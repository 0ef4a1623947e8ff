"""What a new user meets first: output folders, foreign USD assets, start-up.

Each test runs ``main([...])`` in-process on a tiny stage written into
``tmp_path`` (a few triangles, images of at most 48 x 24 pixels), except the
start-up checks, which need a fresh interpreter.
"""

import errno
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from warpraster.cli import main

ROOT = Path(__file__).resolve().parents[1]
pxr = pytest.importorskip("pxr")
from pxr import Gf, Sdf, Usd, UsdGeom, UsdShade  # noqa: E402


def _run(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err  # one line, no traceback
    return lines[0]


def _quad_stage(path: Path, *, double_sided=None, cameras=("front",), ball=False):
    """A unit quad in the z = 0 plane, counter-clockwise seen from +Z (USD's
    rightHanded front), and cameras: "front" at z = +5 looking down -Z (USD's
    camera default), "back" at z = -5 turned 180 degrees about Y to look at +Z."""
    stage = Usd.Stage.CreateNew(str(path))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.y)
    if ball:
        s = UsdGeom.Sphere.Define(stage, "/World/Ball")
        s.CreateRadiusAttr(1.0)
    else:
        m = UsdGeom.Mesh.Define(stage, "/World/Quad")
        m.CreatePointsAttr([(-1, -1, 0), (1, -1, 0), (1, 1, 0), (-1, 1, 0)])
        m.CreateFaceVertexCountsAttr([4])
        m.CreateFaceVertexIndicesAttr([0, 1, 2, 3])
        if double_sided is not None:
            m.CreateDoubleSidedAttr(double_sided)
    for name in cameras:
        c = UsdGeom.Camera.Define(stage, f"/World/{name.capitalize()}")
        c.CreateHorizontalApertureAttr(20.0)
        c.CreateVerticalApertureAttr(20.0)  # square aperture
        c.CreateFocalLengthAttr(35.0)
        x = UsdGeom.Xformable(c)
        if name == "back":
            x.AddTranslateOp().Set(Gf.Vec3d(0, 0, -5))
            x.AddRotateYOp().Set(180.0)
        else:
            x.AddTranslateOp().Set(Gf.Vec3d(0, 0, 5))
    stage.Save()
    return path


def _alpha(folder: Path, label="0000") -> np.ndarray:
    return np.asarray(Image.open(folder / f"color.{label}.png"))[..., 3]


# ----------------------------------------------------------------------------- 1: --out
def test_an_out_folder_that_cannot_be_written_fails_at_once(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    missing = tmp_path / "nope.usda"  # never read: the --out check comes first
    code, _, err = _run(capsys, "render", missing, "--out", a_file / "sub")
    assert code == 2
    assert f"--out {a_file / 'sub'}: cannot make the folder: {a_file} is a file" in _error_line(err)
    code, _, err = _run(capsys, "render", missing, "--out", a_file)
    assert code == 2 and f"--out {a_file}: is a file, not a folder" in _error_line(err)


def test_an_os_error_while_writing_is_one_line(tmp_path, capsys, monkeypatch, cli_device):
    def full_disk(self, fp, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Image.Image, "save", full_disk)
    path = _quad_stage(tmp_path / "q.usda")
    out = tmp_path / "o"
    code, _, err = _run(capsys, "render", path, "--size", "8x8", "--spp", "1", "--out", out,
                        "--device", cli_device, "--no-progress")  # fmt: skip
    assert code == 1
    line = _error_line(err)
    assert line == f"error: {out}: cannot write color.0000.png ({os.strerror(errno.ENOSPC)})"
    assert not list(out.glob(".*.tmp"))  # the temporary file is removed


# ----------------------------------------------------------------------------- 2: aspect
def test_a_ball_stays_round_when_the_image_aspect_differs_from_the_aperture(
    tmp_path, capsys, cli_device
):
    """A sphere through a square aperture into a 48 x 24 image: UsdRender's fallback
    policy (expandAperture) keeps pixels square, so the ball is as wide as it is high;
    adjustPixelAspectRatio (the former default) stretches it to twice its height."""
    path = _quad_stage(tmp_path / "ball.usda", ball=True)

    def extent(*extra):
        out = tmp_path / ("o" + "".join(extra))
        code, _, err = _run(capsys, "render", path, "--size", "48x24", "--spp", "1", "--out",
                            out, "--device", cli_device, "--no-progress", *extra)  # fmt: skip
        assert code == 0, err
        rows, cols = np.nonzero(_alpha(out))
        return cols.max() - cols.min() + 1, rows.max() - rows.min() + 1

    w, h = extent()
    # the tessellated sphere's silhouette covers whole pixels: one pixel each way
    assert abs(w - h) <= 1, (w, h)
    w, h = extent("--conform", "adjust-pixel-aspect-ratio")  # still selectable
    assert abs(w - 2 * h) <= 2, (w, h)


# ----------------------------------------------------------------------------- 3: syntax
def test_a_usda_syntax_error_gives_the_parsers_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.usda"
    bad.write_text(
        '#usda 1.0\ndef Mesh "M" {\n    point3f[] points = [(0, 0, 0), (1, 0, 0)\n'
        "    int[] faceVertexCounts = [3]\n}\n"
    )
    code, _, err = _run(capsys, "info", bad)
    assert code == 1
    line = _error_line(err)
    assert "bad.usda: not a readable USD layer (line 4, column 5: parse error" in line, line
    assert "pxrInternal" not in line and "Failed to open layer" not in line


# ----------------------------------------------------------------------------- 4: texture
def test_a_missing_texture_is_one_warning_and_its_fallback_colour(tmp_path, capsys, cli_device):
    path = _quad_stage(tmp_path / "tex.usda")
    stage = Usd.Stage.Open(str(path))
    mat = UsdShade.Material.Define(stage, "/Mat")
    sh = UsdShade.Shader.Define(stage, "/Mat/S")
    sh.CreateIdAttr("UsdPreviewSurface")
    sh.CreateInput("roughness", Sdf.ValueTypeNames.Float).Set(1.0)
    tex = UsdShade.Shader.Define(stage, "/Mat/T")
    tex.CreateIdAttr("UsdUVTexture")
    tex.CreateInput("file", Sdf.ValueTypeNames.Asset).Set("missing.png")
    tex.CreateInput("fallback", Sdf.ValueTypeNames.Float4).Set(Gf.Vec4f(0, 1, 0, 1))
    sh.CreateInput("diffuseColor", Sdf.ValueTypeNames.Color3f).ConnectToSource(
        tex.ConnectableAPI(), "rgb"
    )
    mat.CreateSurfaceOutput().ConnectToSource(sh.ConnectableAPI(), "surface")
    for prim in ("/World/Quad",):
        UsdShade.MaterialBindingAPI.Apply(stage.GetPrimAtPath(prim)).Bind(mat)
    stage.Save()
    out = tmp_path / "o"
    code, _, err = _run(capsys, "render", path, "--size", "8x8", "--spp", "1", "--frames", "1:3",
                        "--out", out, "--device", cli_device, "--no-progress")  # fmt: skip
    assert code == 0, err
    warns = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warns) == 1, err  # once, not once per frame
    assert "/Mat (T): texture file 'missing.png' not found" in warns[0]
    assert "fallback colour (0.0, 1.0, 0.0)" in warns[0]
    rgba = np.asarray(Image.open(out / "color.0001.png"))
    lit = rgba[..., 3] == 255
    assert lit.any()
    # green diffuse; red and blue only from the dielectric's 4% grey specular highlight
    g, rb = rgba[lit, 1].astype(int), rgba[lit][:, [0, 2]].astype(int)
    assert (g > 200).all() and (rb < g[:, None] / 3).all(), rgba[lit]
    code, out_text, err = _run(capsys, "info", path)
    assert code == 0 and "missing.png" in err and "meshes: 1" in out_text


# ----------------------------------------------------------------------------- 5: references
def test_unresolved_references_are_one_summary_line_and_listed_by_info(tmp_path, capfd):
    scene = tmp_path / "refs.usda"
    body = "".join(
        f'    def "R{i}" ( prepend references = @parts/missing_{i}.usda@ ) {{}}\n' for i in range(5)
    )
    scene.write_text(f'#usda 1.0\ndef Xform "World"\n{{\n{body}}}\n')
    code = main(["info", str(scene)])
    out, err = capfd.readouterr()  # file-descriptor level: USD's own printing included
    assert code == 0
    assert "Could not open asset" not in err  # no raw USD line
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line == (
        f"warning: USD reported 5 problems reading {scene}, 5 of them unresolved "
        "(references, payloads or sublayers); --verbose lists them"
    )
    assert "unresolved: 5" in out and "meshes: 0" in out
    for i in range(5):
        assert f"@parts/missing_{i}.usda@" in out
    code = main(["info", str(scene), "--verbose"])
    _, err = capfd.readouterr()
    assert code == 0 and len([ln for ln in err.splitlines() if "Could not open asset" in ln]) == 5
    code = main(["render", str(scene), "--out", str(tmp_path / "o")])
    _, err = capfd.readouterr()
    assert code == 1
    assert "no meshes to render (no visible UsdGeom.Mesh with faces; 5 unresolved" in err
    assert len(err.strip().splitlines()) == 1, err  # the error line only: no raw USD lines


# ----------------------------------------------------------------------------- 6: NaN / inf
def test_non_finite_points_are_named_without_numpy_warnings(tmp_path, capsys, cli_device):
    path = tmp_path / "nan.usda"
    path.write_text(
        '#usda 1.0\ndef Mesh "Bad" {\n'
        "    point3f[] points = [(nan, nan, nan), (nan, 0, 0), (0, inf, 0)]\n"
        "    int[] faceVertexCounts = [3]\n    int[] faceVertexIndices = [0, 1, 2]\n}\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a NumPy warning fails the test
        code, out, err = _run(capsys, "render", path, "--size", "8x8", "--spp", "1", "--out",
                              tmp_path / "o", "--device", cli_device, "--no-progress")  # fmt: skip
        assert code == 0, err
        assert "every mesh has non-finite points (NaN or inf)" in out
        assert "behind the camera" not in out
        assert "warning: 1 mesh with non-finite points (NaN or inf" in err and "/Bad" in err
        code, out, _ = _run(capsys, "info", path)
    assert (
        code == 0
        and "/Bad: 1 triangles, 3 points, material displayColor [non-finite points]" in out
    )


# ----------------------------------------------------------------------------- 7: back faces
def test_single_sided_meshes_hide_their_back_faces_as_in_usdview(tmp_path, capsys, cli_device):
    """The quad is counter-clockwise seen from +Z: the front camera sees its front,
    the back camera its back, which only a doubleSided mesh (or --double-sided) shows."""

    said = {}

    def coverage(path, camera, *extra):
        out = tmp_path / f"o_{path.stem}_{camera}{''.join(extra)}"
        code, text, err = _run(capsys, "render", path, "--camera", f"/World/{camera}", "--size",
                               "16x16", "--spp", "1", "--out", out, "--device", cli_device,
                               "--no-progress", *extra)  # fmt: skip
        assert code == 0, err
        said[path.stem, camera] = text
        return (_alpha(out) > 0).mean()

    single = _quad_stage(tmp_path / "single.usda", cameras=("front", "back"))
    double = _quad_stage(tmp_path / "double.usda", cameras=("front", "back"), double_sided=True)
    front = coverage(single, "Front")
    assert front > 0.2  # the quad fills the middle of the view
    assert coverage(single, "Back") == 0.0
    assert (
        "seen from behind" in said["single", "Back"] and "--double-sided" in said["single", "Back"]
    )
    assert coverage(single, "Back", "--double-sided") == front  # mirrored, same pixel count
    assert coverage(double, "Front") == front and coverage(double, "Back") == front


def test_a_left_handed_quad_has_its_front_on_the_other_side(tmp_path, capsys, cli_device):
    path = _quad_stage(tmp_path / "left.usda", cameras=("front", "back"))
    stage = Usd.Stage.Open(str(path))
    UsdGeom.Mesh(stage.GetPrimAtPath("/World/Quad")).CreateOrientationAttr(
        UsdGeom.Tokens.leftHanded
    )
    stage.Save()
    seen = {}
    for cam in ("Front", "Back"):
        out = tmp_path / cam
        code, _, err = _run(capsys, "render", path, "--camera", f"/World/{cam}", "--size", "16x16",
                            "--spp", "1", "--out", out, "--device", cli_device,
                            "--no-progress")  # fmt: skip
        assert code == 0, err
        seen[cam] = (_alpha(out) > 0).mean()
    assert seen["Front"] == 0.0 and seen["Back"] > 0.2


# ----------------------------------------------------------------------------- 10: start-up
def test_version_and_a_missing_command(capsys):
    import warpraster

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert (
        exc.value.code == 0 and capsys.readouterr().out == f"warpraster {warpraster.__version__}\n"
    )
    code, _, err = _run(capsys)
    assert code == 2
    assert "required: cmd (a command: render, info or bench)" in _error_line(err)


def test_bench_scenes_are_listed_and_checked(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    assert "ico4x1_256_k1" in capsys.readouterr().out.replace("\n", " ")
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--scenes", "nope,ico4x1_256_k1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--scenes: no scene named nope" in err and "ico5x1_256_k8" in err


_PROBE = """
import sys
from warpraster.cli import main
for argv in (["--help"], ["render", "--help"], ["--version"], ["render", "--size", "0x0"], []):
    try:
        main(argv)
    except SystemExit:
        pass
heavy = sorted(m for m in ("warp", "pxr", "torch", "warpraster.shading") if m in sys.modules)
print("heavy:", heavy)
"""


def test_help_version_and_argument_errors_import_no_warp():
    res = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "heavy: []"


_INTERRUPT = """
import sys

class CtrlC:  # Ctrl-C arriving while Warp is being imported (start-up)
    def find_spec(self, name, path=None, target=None):
        if name == "warp":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
from warpraster.cli import main
sys.exit(main(["render", "--size", "8x8", "--out", sys.argv[1]]))
"""


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path):
    res = subprocess.run([sys.executable, "-c", _INTERRUPT, str(tmp_path / "o")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 130, res.stderr
    assert res.stderr == "error: interrupted\n"
