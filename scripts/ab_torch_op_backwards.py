"""One-off A/B: forward + backward time of the functional torch ops on the cpu device,
old (b30fe41: the backward replays the Warp forward on a tape) against new (the
adjoint alone), alternated in one process; medians. The old ops.py is taken from git
and registered under another op namespace.

    python scripts/ab_torch_op_backwards.py [runs]          # 64x64 K=2, V=642, F=1280
    HW=8 K=1 V=12 F=20 T=8 python scripts/ab_torch_op_backwards.py [runs]   # tiny
"""

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
src = subprocess.run(
    ["git", "show", "b30fe41:warpraster/torch/ops.py"],
    cwd=ROOT,
    check=True,
    capture_output=True,
    text=True,
).stdout
for a, b in [
    ("from ..shading", "from warpraster.shading"),
    ("from .checks", "from warpraster.torch.checks"),
    ("from .eager", "from warpraster.torch.eager"),
    ("from .streams", "from warpraster.torch.streams"),
    ('"warpraster::', '"warpraster_old::'),
    ('f"warpraster::', 'f"warpraster_old::'),
]:
    src = src.replace(a, b)
path = os.path.join(tempfile.mkdtemp(), "old_ops.py")
with open(path, "w") as f:
    f.write(src)
spec = importlib.util.spec_from_file_location("old_ops", path)
old_ops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_ops)
from warpraster.torch import ops as new_ops  # noqa: E402

torch.manual_seed(0)
N, H, W, K = (
    1,
    int(os.environ.get("HW", 64)),
    int(os.environ.get("HW", 64)),
    int(os.environ.get("K", 2)),
)
V, F = int(os.environ.get("V", 642)), int(os.environ.get("F", 1280))
p2f = torch.randint(0, F, (N, H, W, K), dtype=torch.int32)
p2f[torch.rand(p2f.shape) < 0.3] = -1
bary = torch.rand(N, H, W, K, 3)
bary /= bary.sum(-1, keepdim=True)
faces = torch.randint(0, V, (F, 3), dtype=torch.int32)
verts = torch.randn(V, 3)
fattrs = torch.randn(F, 3, 3)
vattrs = torch.randn(V, 2)
ndc = torch.cat([torch.rand(V, 2) * 2 - 1, 1 + torch.rand(V, 1)], -1)
T = int(os.environ.get("T", 64))
maps = torch.rand(1, T, T, 3)
uvs = torch.rand(V, 2)


def case(name):
    if name == "interpolate_face_attributes":
        return (lambda m, a: m.interpolate_face_attributes(p2f, a[0], a[1]), [bary, fattrs])
    if name == "interpolate_vertex_attributes":
        return (
            lambda m, a: m.interpolate_vertex_attributes(p2f, a[0], a[1], faces),
            [bary, vattrs],
        )
    if name == "interpolate_vertex_attributes+ndc":
        return (
            lambda m, a: m.interpolate_vertex_attributes(p2f, a[0], a[1], faces, verts_ndc=a[2]),
            [bary, vattrs, ndc],
        )
    if name == "face_normals":
        return (lambda m, a: m.face_normals(a[0], faces), [verts])
    if name == "vertex_normals":
        return (lambda m, a: m.vertex_normals(a[0], faces), [verts])
    if name == "sample_textures_uv":
        return (lambda m, a: m.sample_textures_uv(p2f, a[0], a[1], faces, a[2]), [bary, maps, uvs])
    if name == "sample_textures_uv(maps only)":
        return (lambda m, a: m.sample_textures_uv(p2f, bary, a[0], faces, uvs), [maps])


names = [
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "interpolate_vertex_attributes+ndc",
    "face_normals",
    "vertex_normals",
    "sample_textures_uv",
    "sample_textures_uv(maps only)",
]
runs = int(sys.argv[1]) if len(sys.argv) > 1 else 300
print(
    f"{N}x{H}x{W}x{K} slots, V={V}, F={F}, maps {T}x{T}x3; torch threads {torch.get_num_threads()}; {runs} runs each, alternated; medians in us"  # noqa: E501
)
print(f"{'op':36s} {'old fwd+bwd':>11s} {'new fwd+bwd':>11s} {'old bwd':>8s} {'new bwd':>8s}")
for name in names:
    fn, inputs = case(name)
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    times = {m: ([], []) for m in ("old", "new")}
    mods = {"old": old_ops, "new": new_ops}
    outs = fn(new_ops, leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    ups = [torch.randn(o.shape) for o in outs]
    for i in range(runs + 20):
        for m in ("old", "new") if i % 2 == 0 else ("new", "old"):
            t0 = time.perf_counter()
            o = fn(mods[m], leaves)
            o = o if isinstance(o, tuple) else (o,)
            t1 = time.perf_counter()
            torch.autograd.grad(o, leaves, ups)
            t2 = time.perf_counter()
            if i >= 20:
                times[m][0].append(t2 - t0)
                times[m][1].append(t2 - t1)
    med = {m: [statistics.median(x) * 1e6 for x in times[m]] for m in times}
    print(
        f"{name:36s} {med['old'][0]:11.0f} {med['new'][0]:11.0f} {med['old'][1]:8.0f} {med['new'][1]:8.0f}"  # noqa: E501
    )
