"""`warpraster render` under torchrun: frames sharded over ranks (RANK / WORLD_SIZE
from the environment, as torchrun sets them), each frame written by exactly one
rank, none lost. The ranks run as separate processes, as under torchrun (no
process group is needed: every rank knows its share from the environment)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("pxr", reason="the bundled scene is a USD stage (usd-core)")


@pytest.mark.parametrize("world", [2, 3])
def test_render_shards_frames_over_ranks_without_loss_or_duplicates(tmp_path, cli_device, world):
    frames = range(1, 6)  # 5 frames: uneven over 2 and 3 ranks
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world))  # fmt: skip
        cmd = [sys.executable, "-m", "warpraster", "render", "--frames", "1:5", "--size", "16x12",
               "--spp", "1", "--no-progress", "--device", cli_device,
               "--out", str(tmp_path / f"rank{rank}")]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    written = []
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        assert out.startswith(f"rank {rank}/{world}: rendered"), out
        written += sorted(f.name for f in (tmp_path / f"rank{rank}").iterdir())
    assert sorted(written) == [f"color.{f:04d}.png" for f in frames]  # each frame once
