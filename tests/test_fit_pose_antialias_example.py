"""examples/fit_pose_antialias.py: a pose recovered from a hard silhouette with
K = 1 + antialias; without antialias the silhouette has no gradient and stays put."""

import subprocess
import sys


def _run(*extra):
    return subprocess.run(
        [sys.executable, "examples/fit_pose_antialias.py", "--test", *extra],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_pose_is_recovered_with_antialias(cli_device):
    r = _run("--device", cli_device)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pose recovered" in r.stdout


def test_silhouette_does_not_move_without_antialias(cli_device):
    r = _run("--device", cli_device, "--no-antialias")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "silhouette unchanged without antialias" in r.stdout
