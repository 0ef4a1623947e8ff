"""examples/usd_fit_material.py: a stage's material colours recovered from a picture."""

import subprocess
import sys


def test_usd_fit_material_short_run_converges(cli_device):
    out = subprocess.run(
        [sys.executable, "examples/usd_fit_material.py", "--test", "--device", cli_device],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # the example's own check: every colour within 0.01 of the stage's (from 0.5 off)
    assert "largest colour error: 0.5000 at the start" in out.stdout
    assert out.stderr == ""  # Warp started quietly (warpraster.cli.init_warp)
