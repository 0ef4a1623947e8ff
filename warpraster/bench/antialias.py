"""The antialias suite: :class:`~warpraster.Antialias` alone on the textured K = 1 render.

``warpraster bench --suite antialias [--device cuda:0] [--runs 20] [--nvdiffrast]``
(also ``python -m warpraster.bench --suite antialias``).

The scene is the renderer suite's ``hardphong_mip1024_ico5x8_512_k1`` (8
icospheres of 20,480 faces, 512², K = 1, a 1024² mip-mapped UV texture per
image), rendered once; its shaded colour (the first three channels, copied
contiguous, as nvdiffrast's ``antialias`` is timed on RGB), fragments
(``pix_to_face``, ``zbuf``) and projected vertices are the op's inputs. Rows, one
per forward:

* ``sparse``: the default (``deterministic=False``): the colour copied, then one
  pass over the pixel pairs adding each blending pair with atomics;
* ``gather``: ``sparse=False``: pair records, then every pixel gathers its pairs
  (the forward before the sparse one; vertex gradients with atomics as ``sparse``);
* ``deterministic``: ``deterministic=True``: the gather and fixed-order vertex
  gradients.

Columns: the op's call (forward) and a recorded call + an upstream gradient
copied into ``out.grad`` + ``tape.backward`` (forward + backward; the caller's
``color.grad`` and ``verts.grad`` zeroed first), eagerly and replayed from a
captured graph; medians of ``--runs`` calls after warm-up, every row and column
timed in turn each round (CUDA events on a GPU, the wall clock on the CPU). The
issue's targets are half of nvdiffrast's ``antialias`` on an H200 (0.094 ms
forward, 0.538 forward + backward). ``pairs``: the fraction of pixels a pair
changes. Before timing, each row's image is checked against ``deterministic``'s
(within float32 rounding of the summation order) and its gradients too.

``--nvdiffrast`` (CUDA, torch and nvdiffrast): also ``nvdiffrast.torch.antialias``
on the same colour, its ``rast`` made from the same fragments (local face id + 1,
depth from ``zbuf``) and the same vertices as clip positions (w = 1), its
topology hash built once; eager, CUDA events; with the fraction of pixels it
changes and its largest difference from our image.
"""

from __future__ import annotations

import json
import statistics

import numpy as np
import warp as wp

from ..antialiasing import Antialias
from ..timing import timer
from .renderer import make_renderer
from .torch_timing import torch_timer

__all__ = ["SCENE", "TARGETS_MS", "make_inputs", "run"]

#: The renderer suite's textured K = 1 scene.
SCENE = "hardphong_mip1024_ico5x8_512_k1"
#: The issue's targets (ms, forward / forward + backward): half of nvdiffrast
#: 0.4.0's ``antialias`` on this scene on one H200 (0.094 / 0.538).
TARGETS_MS = (0.047, 0.269)
#: row name -> the Antialias keywords
VARIANTS = {
    "sparse": {},
    "gather": {"sparse": False},
    "deterministic": {"deterministic": True},
}


def make_inputs(device) -> dict:
    """The scene rendered once: the op's inputs (``color`` (8, 512, 512, 3) with a
    gradient, ``pix_to_face``, ``zbuf``, ``verts`` (NDC, with a gradient), ``faces``,
    ``first``: each image's first face) and an upstream gradient ``grad_out``."""
    r, world = make_renderer(SCENE, device, channels=())
    o = r.render(world)
    rgb = o.shaded.numpy()[..., :3].copy()
    g = np.random.default_rng(2).uniform(-1.0, 1.0, rgb.shape).astype(np.float32)
    return {
        "color": wp.array(rgb, dtype=wp.float32, device=device, requires_grad=True),
        "pix_to_face": wp.clone(o.fragments.pix_to_face),
        "zbuf": wp.clone(o.fragments.zbuf),
        "verts": wp.array(o.verts_ndc.numpy(), dtype=wp.vec3, device=device, requires_grad=True),
        "faces": r.faces,
        "first": r.first.numpy(),
        "grad_out": wp.array(g, dtype=wp.float32, device=device),
    }


def _steps(op: Antialias, x: dict):
    """(forward, forward + backward) of ``op`` on the inputs ``x``."""
    c, p, v, z, g = x["color"], x["pix_to_face"], x["verts"], x["zbuf"], x["grad_out"]

    def forward():
        op(c, p, v, zbuf=z)

    def forward_backward():
        c.grad.zero_()
        v.grad.zero_()
        tape = wp.Tape()
        with tape:
            out = op(c, p, v, zbuf=z)
        wp.copy(out.grad, g)
        tape.backward()

    return forward, forward_backward


def _check(ops: dict, x: dict) -> dict:
    """Each op's image and gradients of one recorded call against ``deterministic``'s
    (max abs differences), and the fraction of pixels a pair changes."""
    results = {}
    for name, op in ops.items():
        _steps(op, x)[1]()
        results[name] = [a.numpy().copy() for a in (op.out, x["color"].grad, x["verts"].grad)]
    ref = results["deterministic"]
    diffs = {}
    for name, got in results.items():
        d = [float(np.abs(a - b).max()) for a, b in zip(got, ref, strict=True)]
        # the image: a pixel's 2-4 pairs summed in another order (a few ulps of
        # values <= 3); vertex gradients: atomics against a fixed-order sum
        if d[0] > 1e-6 or d[1] > 1e-6 or d[2] > 1e-3 * max(1.0, float(np.abs(ref[2]).max())):
            raise AssertionError(f"antialias {name} differs from deterministic: {d}")
        diffs[name] = d
    code = ops["deterministic"].pair_code.numpy()
    alpha = ops["deterministic"].pair_alpha.numpy()
    live = code >= 0
    hit = live & (alpha > 0)
    changed = hit.any(-1)
    changed[:, :, 1:] |= (live & ~(alpha > 0))[:, :, :-1, 0]
    changed[:, 1:, :] |= (live & ~(alpha > 0))[:, :-1, :, 1]
    return {"max_diff": diffs, "pairs": float(changed.mean())}


def _nvdiffrast(x: dict, device, runs: int, ours: np.ndarray) -> dict:
    """nvdiffrast's ``antialias`` forward and forward + backward medians (ms), the
    fraction of pixels it changes and its largest difference from ``ours`` (our
    image of the same inputs)."""
    import nvdiffrast.torch as dr
    import torch

    tdev = torch.device(str(device))
    color = torch.from_numpy(x["color"].numpy()).to(tdev).requires_grad_(True)
    n, h, w, _ = color.shape
    p2f = x["pix_to_face"].numpy()[..., 0].astype(np.int64)
    first = np.asarray(x["first"], np.int64).reshape(n, 1, 1)
    faces = x["faces"].numpy().reshape(-1, 3)
    nf = len(faces) // n
    ids = np.where(p2f >= 0, p2f - first + 1, 0).astype(np.float32)
    rast = np.zeros((n, h, w, 4), np.float32)
    rast[..., 2] = x["zbuf"].numpy()[..., 0]
    rast[..., 3] = ids
    rast_t = torch.from_numpy(rast).to(tdev)
    ndc = x["verts"].numpy().reshape(n, -1, 3)
    m = min(h, w)
    pos = np.stack([-ndc[..., 0] * np.float32(m / w), -ndc[..., 1] * np.float32(m / h),
                    ndc[..., 2], np.ones_like(ndc[..., 0])], -1)  # fmt: skip
    pos_t = torch.from_numpy(pos.astype(np.float32)).to(tdev).requires_grad_(True)
    tri = torch.from_numpy(faces[:nf].astype(np.int32)).to(tdev)  # mesh 0: vertices from 0
    topo = dr.antialias_construct_topology_hash(tri)
    g = torch.from_numpy(x["grad_out"].numpy()).to(tdev)

    def forward():
        with torch.no_grad():
            dr.antialias(color, rast_t, pos_t, tri, topology_hash=topo)

    def forward_backward():
        color.grad = None
        pos_t.grad = None
        dr.antialias(color, rast_t, pos_t, tri, topology_hash=topo).backward(g)

    timed = torch_timer(tdev)

    with torch.no_grad():
        img = dr.antialias(color, rast_t, pos_t, tri, topology_hash=topo).cpu().numpy()
    for _ in range(3):
        forward()
        forward_backward()
    return {
        "fwd_ms": statistics.median(timed(forward) for _ in range(runs)),
        "fwd_bwd_ms": statistics.median(timed(forward_backward) for _ in range(runs)),
        "pairs": float((img != x["color"].numpy()).any(-1).mean()),
        "max_diff_image": float(np.abs(img - ours).max()),
    }


def run(args, argv: list[str]) -> int:
    """The suite for the parsed options ``args``."""
    device = wp.get_device(args.device)
    print(f"warpraster bench --suite antialias on {device} ({getattr(device, 'name', '')}): "
          f"{SCENE}, 3 channels")  # fmt: skip
    x = make_inputs(device)
    shape = tuple(x["color"].shape)
    nv = x["verts"].shape[0]
    ops = {k: Antialias(x["faces"], nv, shape, device, **kw) for k, kw in VARIANTS.items()}
    info = _check(ops, x)
    cells = {}  # (row, column) -> a call
    for name, op in ops.items():
        fwd, both = _steps(op, x)
        fwd()
        both()  # warm-up: every module loaded
        cells[name, "fwd_ms"] = fwd
        cells[name, "fwd_bwd_ms"] = both
        for col, fn in (("graph_fwd_ms", fwd), ("graph_fwd_bwd_ms", both)):
            try:
                with wp.ScopedCapture(device=device, force_module_load=False) as cap:
                    fn()
            except Exception as e:  # noqa: BLE001 (CPU capture is experimental)
                print(f"  {name} {col}: no graph ({type(e).__name__}: {e})")
                continue
            cells[name, col] = lambda g=cap.graph: wp.capture_launch(g)
    timed = timer(device)
    times = {k: [] for k in cells}
    for _ in range(args.runs):  # every cell once per round: A/B on a shared machine
        for k, fn in cells.items():
            times[k].append(timed(fn))
    cols = ("fwd_ms", "fwd_bwd_ms", "graph_fwd_ms", "graph_fwd_bwd_ms")
    print(f"{'forward':<16}{'fwd ms':>9}{'f+b ms':>9}{'graph f':>9}{'graph f+b':>10}"
          f"{'target f / f+b':>16}{'max diff img / grad':>22}")  # fmt: skip
    rows = []
    for name in ops:
        row = {"name": name, "pairs": info["pairs"]}
        for col in cols:
            row[col] = statistics.median(times[name, col]) if (name, col) in times else None
        d = info["max_diff"][name]
        row["max_diff_image"], row["max_diff_verts_grad"] = d[0], d[2]
        rows.append(row)
        vals = "".join(f"{row[c]:>{10 if c == 'graph_fwd_bwd_ms' else 9}.3f}"
                       if row[c] is not None else f"{'-':>9}" for c in cols)  # fmt: skip
        print(f"{name:<16}{vals}{f'{TARGETS_MS[0]} / {TARGETS_MS[1]}':>16}"
              f"{f'{d[0]:.1e} / {d[2]:.1e}':>22}", flush=True)  # fmt: skip
    print(f"pixels changed by a pair: {info['pairs']:.4f}")
    if getattr(args, "nvdiffrast", False) and not device.is_cuda:
        print("--nvdiffrast: nvdiffrast's antialias needs a CUDA device: skipped")
    elif getattr(args, "nvdiffrast", False):
        ours = ops["deterministic"].out.numpy()
        nv_row = {"name": "nvdiffrast", **_nvdiffrast(x, device, args.runs, ours)}
        rows.append(nv_row)
        print(f"{'nvdiffrast':<16}{nv_row['fwd_ms']:>9.3f}{nv_row['fwd_bwd_ms']:>9.3f}"
              f"  (eager; pixels changed {nv_row['pairs']:.4f}, max diff from ours "
              f"{nv_row['max_diff_image']:.1e})")  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0
