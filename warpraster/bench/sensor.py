"""The sensor suite: W worlds x C cameras of a posed 2,000-triangle body, colour + depth.

    warpraster bench --suite sensor [--device cuda:0] [--worlds 64] [--cameras 2]
        [--size 128] [--runs 50] [--newton] [--generated-backward] [--profile]
        [--json out.json]

Times one :meth:`~warpraster.sim.CameraSensor.update` (forward) and one update +
image loss + ``tape.backward`` (forward + backward), eagerly and captured in a
graph and replayed (cpu too: the replay of a graph is the eager call there), as
milliseconds per call (the mean over ``--runs`` calls after a warm-up) and
images per second (graph), once with the loss as two ``image_loss`` calls and
once fused into the sensor's backward (``frame_loss``), the sensor writing colour
and depth (``channels``, the outputs Newton's sensor is timed with), then fused
with all seven channels written ("7 ch"); with ``--newton`` also Newton's
``SensorTiledCamera`` (colour + depth, its own update, eager) on the same scene.
The sensor's backward is its deterministic one unless ``--generated-backward``
(Warp's generated adjoints and the rasterizer's atomic backward) is given.
"""

from __future__ import annotations

import json
import time
import warnings

import numpy as np
import warp as wp

from ..primitives import torus
from ..sim.frame import SensorFrame
from ..sim.geometry import SensorGeometry
from ..sim.loss import frame_loss, image_loss
from ..sim.sensor import CameraSensor, look_at_transform

__all__ = ["bench_newton", "bench_sensor", "run"]

#: The channels timed against Newton's sensor (its colour and depth outputs).
COMPARED = ("color", "depth")


def _scene(worlds: int, cameras: int, seed: int = 0):
    verts, faces = torus(0.3, 0.1, rings=40, sides=25)  # 2,000 triangles
    rng = np.random.default_rng(seed)
    bodies = []
    for _ in range(worlds):
        axis = rng.normal(size=3)
        axis /= np.linalg.norm(axis)
        q = wp.quat_from_axis_angle(wp.vec3(*axis), float(rng.uniform(0, np.pi)))
        bodies.append((*rng.uniform(-0.1, 0.1, 2), 0.5, *q))
    eyes = [(1.2, -1.0, 1.0), (-0.9, -1.1, 1.3), (0.0, 1.4, 0.9), (1.3, 0.6, 1.2)]
    cams = [look_at_transform(eyes[c % len(eyes)], (0.0, 0.0, 0.5)) for c in range(cameras)]
    return verts, faces, bodies, cams


def _timed(fn, runs: int, device) -> float:
    """Milliseconds per call of ``fn``, after three warm-up calls (an eager update
    launches, then captures its graph on the second call: the mean is of the
    replays a loop runs, not of the one-off capture)."""
    for _ in range(3):
        fn()
    wp.synchronize_device(device)
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    wp.synchronize_device(device)
    return (time.perf_counter() - t0) * 1e3 / runs


def _materials(geo: SensorGeometry, device):
    """A textured material for every torus (a 64² texture wrapped around it by ring
    and side) and the core's lights (ambient, directional, point): the
    ``--materials`` variant, timing the texture read and the light list."""
    from ..shading.lighting import LightKind, LightList  # noqa: PLC0415

    rng = np.random.default_rng(1)
    material = geo.add_material((0.9, 0.8, 0.7), rng.uniform(0.2, 1.0, (64, 64, 3)))
    rings, sides = 40, 25  # _scene's torus: 2,000 triangles
    uv = np.stack(np.meshgrid(np.arange(rings) / rings, np.arange(sides) / sides,
                              indexing="ij"), -1).reshape(-1, 2)  # fmt: skip
    lights = LightList(
        kinds=[LightKind.AMBIENT, LightKind.DIRECTIONAL, LightKind.POINT],
        param=[(0.0, 0.0, 0.0), (0.3, -0.5, 0.8), (0.6, -0.8, 1.2)],
        ambient=[(0.05, 0.05, 0.05), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)],
        diffuse=[(0.0, 0.0, 0.0), (0.4, 0.4, 0.4), (0.5, 0.5, 0.5)],
        specular=[(0.0, 0.0, 0.0)] * 3, device=device,
    )  # fmt: skip
    return dict(material=material, uvs=uv), lights


def bench_sensor(*, worlds=64, cameras=2, size=128, runs=50, device=None,
                 deterministic=True, profile=False, fused_loss=False,
                 near_clip=None, materials=False, channels=COMPARED) -> dict:  # fmt: skip
    """Times the sensor scene; ``fused_loss``: the loss is :func:`frame_loss` (its
    gradient computed inside the sensor's backward, no channel gradient buffers)
    instead of two :func:`image_loss` calls; ``near_clip``: the sensor's (None: its
    default); ``materials``: each torus textured and the core's lights on;
    ``channels``: the channels the sensor writes (None: all seven)."""
    device = wp.get_device(device)
    verts, faces, bodies, cams = _scene(worlds, cameras)
    geo = SensorGeometry()
    shape_options, lights = ({}, None) if not materials else _materials(geo, device)
    for w in range(worlds):
        geo.add_body_mesh(w, verts, faces, world=w, shape_index=0, color=(0.8, 0.4, 0.2),
                          **shape_options)  # fmt: skip
    sensor = CameraSensor(geo, world_count=worlds, camera_count=cameras, image_size=size,
                          light_direction=(-0.577, 0.577, -0.577), device=device,
                          requires_grad=True,
                          grad_channels=() if fused_loss else ("color", "depth"),
                          channels=channels,
                          deterministic=deterministic, lights=lights,
                          **({} if near_clip is None else {"near_clip": near_clip}))  # fmt: skip
    body_q = wp.array(bodies, dtype=wp.transform, device=device, requires_grad=True)
    cam_q = wp.array([[c] * worlds for c in cams], dtype=wp.transform, device=device)
    fovs = wp.array([0.8] * cameras, dtype=wp.float32, device=device)
    frame = sensor.frames[0]
    tgt_c = wp.zeros_like(frame.color, requires_grad=False)
    tgt_d = wp.zeros_like(frame.depth, requires_grad=False)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    tape = wp.Tape()

    def forward():
        sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)

    def forward_loss():
        tape.reset()
        loss.zero_()
        with tape:
            forward()
            if fused_loss:
                frame_loss(sensor, 0, loss, color_target=tgt_c, depth_target=tgt_d)
            else:
                image_loss(frame.color, tgt_c, loss)
                image_loss(frame.depth, tgt_d, loss)

    def forward_backward():
        forward_loss()
        tape.backward(loss)

    rows = {}
    for name, fn in (("fwd", forward), ("fwd_loss", forward_loss), ("fwd_bwd", forward_backward)):
        rows[f"eager_{name}_ms"] = _timed(fn, runs, device)  # its warm-up loads the modules
        with wp.ScopedCapture(device=device, force_module_load=False) as cap:
            fn()
        graph = cap.graph
        rows[f"{name}_ms"] = _timed(lambda g=graph: wp.capture_launch(g), runs, device)
    if profile and device.is_cuda:
        # one eager forward + backward, every kernel timed by CUDA events (launched one
        # by one: a replayed graph would time as one launch)
        sensor.call_graphs = False
        for fr in sensor.frames:
            for ws in (fr.workspace, fr.soft_workspace):
                if ws is not None:
                    ws.tuning = ws.tuning.replace(call_graphs=False)
        wp.timing_begin(cuda_filter=wp.TIMING_KERNEL)
        forward_backward()
        wp.timing_print(wp.timing_end())
    images = worlds * cameras
    covered = float((frame.depth.numpy() != 0.0).mean())  # (clear_depth 0)
    return {
        "scene": f"sensor_{worlds}w_{cameras}c_torus2k_{size}" + ("_tex_lit" if materials else ""),
        "device": str(device),
        "backward": "deterministic" if deterministic else "generated",
        "loss": ("frame_loss (fused)" if fused_loss else "image_loss x2")
        + ("" if channels == COMPARED else " 7 ch" if channels is None else " *"),
        "channels": list(SensorFrame.CHANNELS if channels is None else channels),
        "images": images,
        "coverage": covered,
        **rows,
        "fwd_images_per_s": images / rows["fwd_ms"] * 1e3,
        "fwd_bwd_images_per_s": images / rows["fwd_bwd_ms"] * 1e3,
    }


def bench_newton(*, worlds=64, cameras=2, size=128, runs=50, device=None) -> dict:
    """Newton's SensorTiledCamera (colour + depth) on the same scene, eager (its
    images per second too)."""
    import newton  # noqa: PLC0415 - optional
    from newton.sensors import SensorTiledCamera  # noqa: PLC0415

    device = wp.get_device(device)
    verts, faces, bodies, cams = _scene(worlds, cameras)
    main = newton.ModelBuilder()
    for w in range(worlds):
        b = newton.ModelBuilder()
        body = b.add_body(xform=wp.transform(bodies[w][:3], bodies[w][3:]))
        b.add_shape_mesh(body, mesh=newton.Mesh(verts, faces.reshape(-1)))
        main.add_world(b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = main.finalize(device=device)
        sensor = SensorTiledCamera(model)
    state = model.state()
    rays = sensor.utils.compute_camera_rays_pinhole(
        size, size, camera_fovs=np.full(cameras, 0.8, np.float32)
    )
    cam_q = wp.array([[c] * worlds for c in cams], dtype=wp.transformf, device=device)
    color = sensor.utils.create_color_image_output(size, size, cameras)
    depth = sensor.utils.create_depth_image_output(size, size, cameras)

    def update():
        sensor.update(state, cam_q, rays, color_image=color, depth_image=depth)

    ms = _timed(update, runs, device)
    images = worlds * cameras
    return {"scene": f"newton_sensor_{worlds}w_{cameras}c_torus2k_{size}", "device": str(device),
            "images": images, "eager_fwd_ms": ms,
            "fwd_images_per_s": images / ms * 1e3}  # fmt: skip


#: The table's numeric columns: (row key, width, format).
_COLUMNS = (
    ("eager_fwd_ms", 9, ".3f"),
    ("eager_fwd_bwd_ms", 9, ".3f"),
    ("fwd_ms", 9, ".3f"),
    ("fwd_bwd_ms", 10, ".3f"),
    ("fwd_images_per_s", 10, ".0f"),
    ("fwd_bwd_images_per_s", 11, ".0f"),
)


def _cell(row: dict, key: str, width: int, fmt: str) -> str:
    return f"{row[key]:>{width}{fmt}}" if key in row else f"{'-':>{width}}"


def run(args, argv: list[str]) -> int:
    """The suite for the parsed options ``args``."""
    kw = dict(worlds=args.worlds, cameras=args.cameras, size=args.size, runs=args.runs,
              device=args.device)  # fmt: skip
    rows = [bench_sensor(**kw, deterministic=not args.generated_backward, profile=args.profile,
                         fused_loss=fused, near_clip=args.near_clip,
                         materials=args.materials, channels=channels)
            for fused, channels in ((False, COMPARED), (True, COMPARED), (True, None))]  # fmt: skip
    if args.newton:
        rows.append(bench_newton(**kw))
    device = wp.get_device(args.device)
    print(f"warpraster bench --suite sensor on {device} ({getattr(device, 'name', '')})")
    print(f"{'scene':<34}{'loss':<24}{'fwd ms':>9}{'f+b ms':>9}{'graph f':>9}{'graph f+b':>10}"
          f"{'img/s f':>10}{'img/s f+b':>11}")  # fmt: skip
    for r in rows:
        cells = [_cell(r, key, w, fmt) for key, w, fmt in _COLUMNS]
        print(f"{r['scene']:<34}{r.get('loss', '-'):<24}" + "".join(cells), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0
