"""The ``warpraster`` command: outputs, and one clear line + a non-zero exit for bad input.

Most calls run ``main([...])`` in-process (fast); a few run ``python -m
warpraster`` in a subprocess to see exactly what a user sees on the terminal.
Images are tiny to keep the test time modest.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from warpraster.cli import default_scene_path, main

ROOT = Path(__file__).resolve().parents[1]
pxr = pytest.importorskip("pxr")


def _run(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _fail(capsys, *args, code, match):
    got, out, err = _run(capsys, *args)
    assert got == code, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err  # one line, no traceback
    assert match in lines[0], lines[0]
    return lines[0]


def _tiny_stage(path: Path, *, indices=(0, 1, 2), camera=True, translate=(0.0, 0.0, 0.0)):
    from pxr import Gf, Usd, UsdGeom

    stage = Usd.Stage.CreateNew(str(path))
    m = UsdGeom.Mesh.Define(stage, "/World/Tri")
    m.CreatePointsAttr([(-1, -1, 0), (1, -1, 0), (0, 1, 0)])
    m.CreateFaceVertexCountsAttr([3])
    m.CreateFaceVertexIndicesAttr(list(indices))
    UsdGeom.Xformable(m).AddTranslateOp().Set(Gf.Vec3d(*translate))
    if camera:
        c = UsdGeom.Camera.Define(stage, "/World/Cam")
        c.AddTranslateOp().Set(Gf.Vec3d(0, 0, 5))
    stage.Save()
    return path


# ----------------------------------------------------------------------------- outputs
def test_render_bundled_scene_writes_rgba_depth_and_ids(tmp_path, capsys, cli_device):
    code, out, err = _run(
        capsys,
        "render",
        "--size",
        "48x32",
        "--spp",
        "4",
        "--frames",
        "1:2",
        "--depth",
        "--depth-format",
        "png",
        "--ids",
        "--out",
        tmp_path,
        "--device",
        cli_device,
    )
    assert code == 0, err
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [
        f"{k}.{f:04d}.png" for k in ("color", "depth", "face_id", "mesh_id") for f in (1, 2)
    ]
    rgba = np.asarray(Image.open(tmp_path / "color.0001.png"))
    assert rgba.shape == (32, 48, 4)
    ids = np.asarray(Image.open(tmp_path / "face_id.0001.png")).astype(np.int64)
    face = ids[..., 0] + 256 * ids[..., 1] + 65536 * ids[..., 2] - 1
    hit = face >= 0
    assert 0.2 < hit.mean() < 0.95  # the scene is in view and does not fill the frame
    assert face.max() < 3622  # triangles of the bundled scene
    # alpha is coverage: opaque where the centre sample hit, transparent where no sample did
    assert (rgba[hit, 3] > 0).all() and (rgba[..., 3][~hit] < 255).all()
    assert (rgba[hit, :3].sum(-1) > 0).all()
    depth = np.asarray(Image.open(tmp_path / "depth.0001.png"))
    assert depth.dtype == np.uint16 and ((depth > 0) == hit).all()
    assert "rendered 2 frames" in out and "3,622 triangles" in out
    assert f"{tmp_path}/color.0001.png" in out  # paths reported with their folder
    assert not list(tmp_path.glob(".*.tmp"))  # temporary names renamed


def test_depth_exr_holds_view_depth_when_openexr_is_installed(tmp_path, capsys, cli_device):
    from warpraster.cli import _openexr

    exr = _openexr()
    if exr is None:
        pytest.skip("openexr (3.x) is not installed")
    code, _, err = _run(
        capsys,
        "render",
        "--size",
        "24x16",
        "--spp",
        "1",
        "--frames",
        "1",
        "--depth",
        "--depth-format",
        "exr",
        "--ids",
        "--out",
        tmp_path,
        "--device",
        cli_device,
    )
    assert code == 0, err
    with exr.File(str(tmp_path / "depth.0001.exr")) as f:
        z = f.channels()["Z"].pixels
    ids = np.asarray(Image.open(tmp_path / "face_id.0001.png")).astype(np.int64)
    hit = (ids[..., 0] + 256 * ids[..., 1] + 65536 * ids[..., 2]) > 0
    assert z.shape == (16, 24) and (np.isfinite(z) == hit).all()
    cam = np.array([2.6, 2.9, 5.4])  # the bundled camera's eye; the scene is ~2-9 units away
    assert (z[hit] > 1.0).all() and (z[hit] < 2 * np.linalg.norm(cam)).all()


def test_animation_moves_the_torus_between_frames(tmp_path, capsys, cli_device):
    code, _, err = _run(
        capsys,
        "render",
        "--size",
        "40x27",
        "--spp",
        "1",
        "--frames",
        "1:13:12",
        "--ids",
        "--out",
        tmp_path,
        "--device",
        cli_device,
    )
    assert code == 0, err
    a = np.asarray(Image.open(tmp_path / "mesh_id.0001.png"))[..., 0]
    b = np.asarray(Image.open(tmp_path / "mesh_id.0013.png"))[..., 0]
    torus = 2  # mesh index 1 (+1 in the encoding): /World/Torus in `info` order
    assert (a == torus).sum() > 20 and ((a == torus) != (b == torus)).sum() > 10


def test_fragments_only_on_request_and_obj_meshes(tmp_path, capsys, cli_device):
    obj = tmp_path / "tri.obj"
    obj.write_text("v -1 -1 5\nv 1 -1 5\nv 0 1 5\nf 1 2 3\n")
    code, out, err = _run(
        capsys,
        "render",
        obj,
        "--size",
        "16x16",
        "--spp",
        "1",
        "--out",
        tmp_path / "a",
        "--device",
        cli_device,
    )
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["color.0000.png"]
    code, out, err = _run(
        capsys,
        "render",
        obj,
        "--size",
        "16x16",
        "--spp",
        "1",
        "--fragments",
        "--out",
        tmp_path / "b",
        "--device",
        cli_device,
    )
    assert code == 0, err
    frags = np.load(tmp_path / "b" / "fragments.0000.npz")
    assert frags["pix_to_face"].shape == (1, 16, 16, 1) and (frags["pix_to_face"] == 0).any()


def test_info_lists_meshes_materials_cameras_lights_and_frames(capsys):
    code, out, _ = _run(capsys, "info")
    assert code == 0
    for text in (
        "frames 1-48",
        "meshes: 6",
        "/World/Torus",
        "[animated]",
        "[instance]",
        "subset /World/Crates/Crate_0/Box/Top",
        "materials: 5",
        "checker.png",
        "/World/Camera: perspective",
        "/World/Lights/Sun",
    ):
        assert text in out, text


def test_empty_view_says_why(tmp_path, capsys, cli_device):
    scene = _tiny_stage(tmp_path / "behind.usda", translate=(0.0, 0.0, 20.0))  # behind the camera
    code, out, err = _run(
        capsys, "render", scene, "--size", "16x12", "--out", tmp_path / "o", "--device", cli_device
    )
    assert code == 0, err
    assert "nothing drawn" in out and "behind the camera" in out
    scene = _tiny_stage(tmp_path / "aside.usda", translate=(40.0, 0.0, 0.0))
    code, out, _ = _run(
        capsys, "render", scene, "--size", "16x12", "--out", tmp_path / "o", "--device", cli_device
    )
    assert "outside the camera's field of view" in out


def test_python_m_warpraster_is_quiet_unless_verbose(tmp_path, cli_device):
    def run(*extra):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "warpraster",
                "render",
                "--size",
                "16x12",
                "--spp",
                "1",
                "--frames",
                "1",
                "--out",
                str(tmp_path),
                "--device",
                cli_device,
                *extra,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )

    quiet = run()
    assert quiet.returncode == 0, quiet.stderr
    assert "Warp" not in quiet.stdout + quiet.stderr and "Module" not in quiet.stdout
    # the second run finds every kernel in the cache: no compilation claim
    assert "kernel compilation" not in quiet.stdout
    assert len(quiet.stdout.strip().splitlines()) == 3
    loud = run("--verbose")
    assert "Warp 1.19" in loud.stdout + loud.stderr


def test_bench_passes_its_options_through_and_shows_its_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--runs" in out and "--scenes" in out  # the benchmark's real options


def test_make_assets_help_does_not_rewrite_the_assets():
    usda = default_scene_path()
    before = usda.stat().st_mtime_ns
    out = subprocess.run(
        [sys.executable, "examples/make_assets.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "usage:" in out.stdout
    assert usda.stat().st_mtime_ns == before


def test_bundled_scene_is_package_data_and_the_checkout_pointer_works(capsys):
    assert default_scene_path().is_file()
    assert (default_scene_path().parent / "checker.png").is_file()
    code, out, _ = _run(capsys, "info", ROOT / "assets" / "default_scene.usda")
    assert code == 0 and "meshes: 6" in out and "frames 1-48" in out


# ----------------------------------------------------------------------------- failures
@pytest.mark.parametrize(
    "args, match",
    [
        (["--height", "0"], "--height must be >= 1, got 0"),
        (["--width", "-3"], "--width must be >= 1, got -3"),
        (["--size", "0x0"], "--size must be at least 1x1, got '0x0'"),
        (["--size", "32"], "--size must be WxH"),
        (["--spp", "0"], "--spp must be >= 1, got 0"),
        (["--frames", "5:1"], "--frames needs A <= B"),
        (["--frames", "a:b"], "--frames must be A, A:B or A:B:STEP"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, match):
    _fail(capsys, "render", "--out", tmp_path / "o", *args, code=2, match=match)
    assert not (tmp_path / "o").exists()


def test_unavailable_device(tmp_path, capsys):
    import warp as wp

    if wp.is_cuda_available():
        pytest.skip("a GPU is present: cuda:0 is available")
    _fail(
        capsys,
        "render",
        "--device",
        "cuda:0",
        "--out",
        tmp_path / "o",
        code=2,
        match="--device cuda:0: not available on this machine (Warp sees: cpu)",
    )
    assert not (tmp_path / "o").exists()


def test_bad_files_exit_1_naming_the_file(tmp_path, capsys):
    out = tmp_path / "o"
    _fail(
        capsys,
        "render",
        tmp_path / "nope.usda",
        "--out",
        out,
        code=1,
        match="nope.usda: no such file",
    )
    bad = tmp_path / "bad.usda"
    bad.write_bytes(b"\x00\x01\x02 binary \xff\xfe" * 50)
    _fail(capsys, "render", bad, "--out", out, code=1, match="bad.usda: not a readable USD layer")
    binary = tmp_path / "mesh.obj"
    binary.write_bytes(b"\x7fELF\x00\x00\x01" * 40)
    _fail(capsys, "render", binary, "--out", out, code=1, match="mesh.obj: not a text OBJ file")
    ply = tmp_path / "mesh.ply"
    ply.write_text("ply\nformat ascii 1.0\nend_header\n")
    _fail(
        capsys, "render", ply, "--out", out, code=1, match="mesh.ply: unsupported file type '.ply'"
    )
    obj = tmp_path / "range.obj"
    obj.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 9\n")
    _fail(
        capsys,
        "render",
        obj,
        "--out",
        out,
        code=1,
        match="range.obj: a face refers to vertex 9 but the file has 3 vertices",
    )
    usd = _tiny_stage(tmp_path / "range.usda", indices=(0, 1, 5))
    _fail(
        capsys,
        "render",
        usd,
        "--out",
        out,
        code=1,
        match="/World/Tri: faceVertexIndices refers to point 5 but the mesh has 3 points",
    )
    _fail(capsys, "info", tmp_path / "nope.usdc", code=1, match="nope.usdc: no such file")
    assert not out.exists()  # nothing written, not even the folder


def test_scene_problems_exit_1_naming_the_prim(tmp_path, capsys):
    from pxr import Usd, UsdGeom

    out = tmp_path / "o"
    empty = tmp_path / "empty.usda"
    stage = Usd.Stage.CreateNew(str(empty))
    UsdGeom.Xform.Define(stage, "/World")
    stage.Save()
    _fail(capsys, "render", empty, "--out", out, code=1, match="empty.usda: no meshes to render")
    scene = _tiny_stage(tmp_path / "s.usda")
    _fail(
        capsys,
        "render",
        scene,
        "--camera",
        "/World/Tri",
        "--out",
        out,
        code=1,
        match="/World/Tri: is a Mesh, not a camera",
    )
    _fail(
        capsys,
        "render",
        scene,
        "--camera",
        "/World/Nope",
        "--out",
        out,
        code=1,
        match="/World/Nope: no such camera in",
    )
    assert not out.exists()


def test_subprocess_error_is_one_line_without_traceback(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "warpraster", "render", str(tmp_path / "x.usda")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert res.returncode == 1
    assert res.stderr.strip() == f"error: {tmp_path / 'x.usda'}: no such file"
    assert res.stdout == ""


def test_render_settings_choose_camera_resolution_and_conform(tmp_path, capsys, cli_device):
    from pxr import Gf, Usd, UsdGeom, UsdRender

    path = _tiny_stage(tmp_path / "rs.usda")
    stage = Usd.Stage.Open(str(path))
    other = UsdGeom.Camera.Define(stage, "/World/Other")  # not first by path: /World/Cam is
    other.AddTranslateOp().Set(Gf.Vec3d(0, 0, 6))
    rs = UsdRender.Settings.Define(stage, "/Render/Settings")
    rs.CreateResolutionAttr(Gf.Vec2i(30, 10))
    rs.CreateAspectRatioConformPolicyAttr("cropAperture")
    rs.CreateCameraRel().SetTargets(["/World/Other"])
    stage.SetMetadata("renderSettingsPrimPath", "/Render/Settings")
    stage.Save()
    import warpraster.usd as wu

    scene = wu.load_stage(path)
    s = scene.render_settings
    assert (s.camera, s.resolution, s.conform) == (
        "/World/Other",
        (30, 10),
        wu.AspectConform.CROP_APERTURE,
    )
    code, out, err = _run(capsys, "render", path, "--spp", "1", "--out", tmp_path / "o",
                          "--device", cli_device)  # fmt: skip
    assert code == 0, err
    assert "through /World/Other" in out and "30x10" in out
    assert np.asarray(Image.open(tmp_path / "o" / "color.0000.png")).shape == (10, 30, 4)


def test_topology_changing_over_time_is_one_line(tmp_path, capsys, cli_device):
    from pxr import Usd, UsdGeom

    path = _tiny_stage(tmp_path / "grow.usda")
    stage = Usd.Stage.Open(str(path))
    pts = UsdGeom.Mesh(stage.GetPrimAtPath("/World/Tri")).GetPointsAttr()
    pts.Set([(-1, -1, 0), (1, -1, 0), (0, 1, 0)], 1)
    pts.Set([(-1, -1, 0), (1, -1, 0), (0, 1, 0), (5, 5, 5)], 2)
    stage.Save()
    _fail(capsys, "render", path, "--frames", "1:2", "--size", "8x8", "--out", tmp_path / "o",
          "--device", cli_device, code=1,
          match="/World/Tri: has 4 points at time 2")  # fmt: skip
    assert not list((tmp_path / "o").glob(".*.tmp"))  # no half-written file left behind
