"""`warpraster render` as a pipeline: the files of frame t are written on worker
threads while frame t + 1 renders (warpraster/frame_writer.py). The files are
those of a frame-by-frame render (bytes at Pillow's default level 6, pixels at
every level), each frame is written once, a failed write on a worker is the
command's one-line error, and Ctrl-C leaves only whole files.

The bundled scene at 32 x 21 pixels, 1 sample per pixel, a few of its frames.
"""

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("pxr", reason="the bundled scene is a USD stage (usd-core)")

from warpraster import frame_writer  # noqa: E402
from warpraster.cli import default_scene_path, main  # noqa: E402

SIZE = ["--size", "32x21", "--spp", "1", "--no-progress"]


def _run(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _frame_by_frame(device, frames):
    """Colour, depth and ids of each frame, rendered and encoded one after another
    as the command did before the pipeline: PNG bytes at Pillow's default level."""
    from warpraster.cli_files import _encode_ids
    from warpraster.usd import load_stage
    from warpraster.usd.animation import StageAnimation
    from warpraster.usd.render import StageRenderer

    scene = load_stage(default_scene_path(), require_meshes=True)
    anim = StageAnimation(scene)
    anim.evaluate(frames[0])
    cam = StageRenderer.resolve_camera(scene, None)
    renderer = StageRenderer(scene, camera=cam, image_size=(21, 32), spp=1, device=device)
    files = {}
    for t in frames:
        anim.frame(renderer, t)
        out = renderer.render()
        images = {"color": frame_writer.srgb8(out.color), "face_id": _encode_ids(out.face_id),
                  "mesh_id": _encode_ids(out.mesh_id)}  # fmt: skip
        for key, image in images.items():
            buf = io.BytesIO()
            Image.fromarray(image).save(buf, format="PNG")
            files[f"{key}.{int(t):04d}.png"] = buf.getvalue()
    return files


def test_files_are_the_frame_by_frame_files_byte_for_byte_at_level_6(tmp_path, capsys, cli_device):
    want = _frame_by_frame(cli_device, [1.0, 2.0, 3.0, 4.0, 5.0])
    code, out, err = _run(capsys, "render", "--frames", "1:5", *SIZE, "--ids", "--png-level", "6",
                          "--device", cli_device, "--out", tmp_path / "six")  # fmt: skip
    assert code == 0, err
    assert "wrote 15 files" in out
    got = {p.name: p.read_bytes() for p in (tmp_path / "six").iterdir()}
    assert got.keys() == want.keys()  # every frame once, nothing else (no temporary files)
    assert all(got[k] == want[k] for k in want)
    code, _, err = _run(capsys, "render", "--frames", "1:5", *SIZE, "--ids",
                        "--device", cli_device, "--out", tmp_path / "one")  # fmt: skip
    assert code == 0, err
    for name, data in want.items():  # the default level: other bytes, the same pixels
        a = np.asarray(Image.open(io.BytesIO(data)))
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "one" / name)), a)


def test_a_write_failing_on_a_worker_is_the_commands_one_line_error(
    tmp_path, capsys, monkeypatch, cli_device
):
    save_png = frame_writer._save_png

    def full_disk_at_frame_3(path, array, **kwargs):
        if path.name == "color.0003.png":
            raise OSError(28, "No space left on device", str(path))
        save_png(path, array, **kwargs)

    monkeypatch.setattr(frame_writer, "_save_png", full_disk_at_frame_3)
    out = tmp_path / "o"
    code, _, err = _run(capsys, "render", "--frames", "1:8", *SIZE, "--device", cli_device,
                        "--out", out)  # fmt: skip
    assert code == 1
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [f"error: {out}: cannot write color.0003.png (No space left on device)"]
    names = sorted(p.name for p in out.iterdir())
    assert "color.0003.png" not in names and not [n for n in names if n.endswith(".tmp")]
    assert {"color.0001.png", "color.0002.png"} <= set(names)


def test_ctrl_c_while_frames_are_written_leaves_whole_files(
    tmp_path, capsys, monkeypatch, cli_device
):
    from warpraster.usd.animation import StageAnimation

    frame = StageAnimation.frame

    def interrupted_at_frame_4(self, renderer, t, camera=None):
        if t == 4.0:
            raise KeyboardInterrupt
        return frame(self, renderer, t, camera)

    monkeypatch.setattr(StageAnimation, "frame", interrupted_at_frame_4)
    out = tmp_path / "o"
    code, _, err = _run(capsys, "render", "--frames", "1:8", *SIZE, "--device", cli_device,
                        "--out", out)  # fmt: skip
    assert code == 130 and err == "error: interrupted\n"
    files = sorted(Path(out).iterdir())
    assert {p.name for p in files} <= {f"color.000{i}.png" for i in (1, 2, 3)}
    for p in files:  # whole PNGs: written under a temporary name, renamed when complete
        assert np.asarray(Image.open(p)).shape == (21, 32, 4)


def test_bench_usd_suite_times_the_pipelined_command(tmp_path, capsys):
    import json

    from warpraster import bench

    path = tmp_path / "usd.json"
    code = bench.main(["--suite", "usd", "--device", "cpu", "--runs", "1", "--frames", "1:3",
                       "--width", "32", "--json", str(path)])  # fmt: skip
    assert code == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "frame ms" in header and "frames/s" in header
    (row,) = json.loads(path.read_text())
    assert row["frames"] == 3 and row["spp"] == 4
    assert row["frames_per_s"] == pytest.approx(1e3 / row["frame_ms"])  # one figure, two units


def test_a_frame_that_cannot_be_read_keeps_the_frames_before_it(
    tmp_path, capsys, monkeypatch, cli_device
):
    from warpraster.usd.animation import StageAnimation
    from warpraster.usd.errors import SceneError

    frame = StageAnimation.frame

    def unreadable_at_frame_4(self, renderer, t, camera=None):
        if t == 4.0:
            raise SceneError("/World/Ball", "topology changes at time 4")
        return frame(self, renderer, t, camera)

    monkeypatch.setattr(StageAnimation, "frame", unreadable_at_frame_4)
    out = tmp_path / "o"
    code, _, err = _run(capsys, "render", "--frames", "1:8", *SIZE, "--device", cli_device,
                        "--out", out)  # fmt: skip
    assert code == 1 and err.startswith("error: ") and "topology changes" in err
    assert sorted(p.name for p in out.iterdir()) == [f"color.000{i}.png" for i in (1, 2, 3)]
