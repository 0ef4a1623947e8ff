"""The command line (render, bench) and the examples, run as a user would."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def _run(args, cwd):
    out = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_render_command_writes_images_of_the_default_scene(tmp_path, cli_device):
    _run(
        [
            "-m",
            "warpraster.cli",
            "render",
            "--out",
            str(tmp_path),
            "--height",
            "60",
            "--width",
            "80",
            "--spp",
            "1",
            "--frames",
            "1",
            "--fragments",
            "--device",
            cli_device,
        ],
        ROOT,
    )
    color = np.asarray(Image.open(tmp_path / "color.0001.png"))
    assert color.shape == (60, 80, 4)  # RGBA, alpha = coverage
    frags = np.load(tmp_path / "fragments.0001.npz")
    hit = frags["pix_to_face"][0, ..., 0] >= 0
    assert 0.2 < hit.mean() < 0.9  # the scene is in view and does not fill the frame
    # one sample per pixel: covered pixels are opaque and lit, the others fully transparent
    assert (color[hit, 3] == 255).all() and (color[hit, :3].sum(-1) > 0).all()
    assert (color[~hit] == 0).all()
    assert frags["pix_to_face"].max() < 3622  # triangles of the bundled scene


def test_bench_command_checks_itself_and_writes_json(tmp_path, cli_device):
    out = tmp_path / "bench.json"
    _run(
        [
            "-m",
            "warpraster.bench",
            "--device",
            cli_device,
            "--runs",
            "1",
            "--scenes",
            "ico4x1_256_k1",
            "--json",
            str(out),
        ],
        ROOT,
    )
    rows = json.loads(out.read_text())
    assert rows[0]["check_mismatches"] == 0 and rows[0]["check_pixels"] > 1000
    assert rows[0]["fwd_ms"] > 0 and rows[0]["coverage"] > 0.2


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_fit_mesh_depth_example_converges(graph, cli_device):
    args = ["examples/fit_mesh_depth.py", "--test", "--device", cli_device]
    _run(args + (["--graph"] if graph else []), ROOT)


def test_cloth_wind_test_mode_recovers_within_its_tolerance_and_is_quiet(cli_device):
    """``--test`` prints a recovery line only within the example's own TOLERANCE
    (exit 1 otherwise), and no Warp banner or module-load lines (as the CLI)."""
    out = subprocess.run(
        [sys.executable, "examples/sim_cloth_wind.py", "--test", "--device", cli_device],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Warp" not in out.stdout + out.stderr and "Module" not in out.stdout
    last = out.stdout.strip().splitlines()[-1]
    got = json.loads(last.split("recovered=")[1].split(" truth=")[0])
    truth = json.loads(last.split(" truth=")[1].split(" (")[0])
    tolerance = 0.15  # examples/sim_cloth_wind.py TOLERANCE: a tenth of the 1.5 m/s component
    assert f"<= {tolerance} m/s" in last
    np.testing.assert_allclose(got, truth, atol=tolerance)
