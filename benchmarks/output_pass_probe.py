"""Where the output pass's time goes (diagnostic, CUDA).

Renders one benchmark scene, then times variants of a per-slot output kernel on
its ``pix_to_face``: the full computation, without the edge distance, without
the barycentric divisions (stores only), and the stores alone. The differences
say whether the pass is bound by arithmetic or by its stores.

    python benchmarks/output_pass_probe.py --device cuda:0 [--scene ico5x8_512_k8]
"""

from __future__ import annotations

import argparse
import statistics

import warp as wp

from warpraster import bench, raster
from warpraster.fragments import fragment_values
from warpraster.geometry import pixel_centre

wp.set_module_options({"enable_backward": False, "fuse_fp": False})


@wp.kernel
def _probe(ps: raster._Pass, mode: int):
    i = wp.tid()
    k = ps.faces_per_pixel
    q = i // k
    s = i - q * k
    f = ps.pix_to_face[q, s]
    if mode == 3 or f < 0:  # stores only
        ps.zq[q, s] = -1.0
        ps.bary[q, s] = wp.vec3(-1.0, -1.0, -1.0)
        ps.dists[q, s] = -1.0
        return
    r = q % (ps.height * ps.width)
    p = pixel_centre(r // ps.width, r % ps.width, ps.height, ps.width)
    m = ps.face_verts[f]
    v0 = wp.vec3(m[0, 0], m[0, 1], m[0, 2])
    v1 = wp.vec3(m[1, 0], m[1, 1], m[1, 2])
    v2 = wp.vec3(m[2, 0], m[2, 1], m[2, 2])
    if mode == 0:  # the full computation (as _write_outputs)
        z, bary, d = fragment_values(p, v0, v1, v2, ps.perspective, ps.clip_bary)
        ps.zq[q, s] = z
        ps.bary[q, s] = bary
        ps.dists[q, s] = d
    elif mode == 1:  # no edge distance
        z, bary, d = fragment_values(p, v0, v1, v2, ps.perspective, ps.clip_bary)
        ps.zq[q, s] = z
        ps.bary[q, s] = bary
        ps.dists[q, s] = 0.0
    else:  # mode 2: loads and pixel centre, no barycentrics
        ps.zq[q, s] = v0[2] + p[0]
        ps.bary[q, s] = v1
        ps.dists[q, s] = v2[0] + p[1]


@wp.kernel
def _fill(a: wp.array(dtype=wp.float32)):
    a[wp.tid()] = 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--scene", default="ico5x8_512_k8")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    device = wp.get_device(args.device)
    sc = next(s for s in bench.GPU_SCENES + bench.CPU_SCENES if s.name == args.scene)
    v, f, first, count = bench.make_scene(sc)
    verts = wp.array(v, dtype=wp.vec3, device=device)
    meshes = raster.pack_meshes(verts, wp.array(f, dtype=wp.int32, device=device), first, count)
    ws = raster.RasterWorkspace(
        num_meshes=sc.copies, num_faces=len(f), image_size=(sc.height, sc.width),
        faces_per_pixel=sc.k, bin_size=8, device=device,
    )  # fmt: skip
    kw = dict(blur_radius=sc.blur, perspective_correct=False, clip_barycentric_coords=False,
              cull_backfaces=False)  # fmt: skip
    out = raster.rasterize_packed(meshes, ws, **kw)
    ps = raster._make_pass(meshes, ws, sc.blur, False, False, out.pix_to_face, out.zbuf,
                           out.bary_coords, out.dists)  # fmt: skip
    timed = bench._timer(device)
    slots = out.pix_to_face.size
    filled = float((out.pix_to_face.numpy() >= 0).mean())
    print(f"{sc.name}: {slots} slots, {filled:.2f} filled, {slots * 24 / 1e6:.0f} MB written")
    names = ["full", "no dist", "loads only", "stores only"]
    for mode in range(4):

        def go(mode=mode):
            wp.launch(_probe, dim=slots, inputs=[ps, mode], device=device)

        go()
        t = statistics.median(timed(go) for _ in range(args.runs))
        print(f"  {names[mode]:<12} {t:.3f} ms  {slots * 24 / t / 1e9:.2f} TB/s")
    write = raster._write_outputs_kernel(device, False, False)
    go = lambda: wp.launch(write, dim=slots, inputs=[ps], device=device)  # noqa: E731
    go()
    t = statistics.median(timed(go) for _ in range(args.runs))
    print(f"  {'_write_outputs':<12} {t:.3f} ms")
    # The write floor: one float32 per thread into a 400 MB array, and a memset.
    big = wp.empty(100_000_000, dtype=wp.float32, device=device)
    go = lambda: wp.launch(_fill, dim=big.size, inputs=[big], device=device)  # noqa: E731
    go()
    t = statistics.median(timed(go) for _ in range(args.runs))
    print(f"  {'store kernel':<12} {t:.3f} ms  {big.size * 4 / t / 1e9:.2f} TB/s (400 MB)")
    go = lambda: big.fill_(1.0)  # noqa: E731
    go()
    t = statistics.median(timed(go) for _ in range(args.runs))
    print(f"  {'fill_':<12} {t:.3f} ms  {big.size * 4 / t / 1e9:.2f} TB/s (400 MB)")
    src = wp.full(100_000_000, 2.0, dtype=wp.float32, device=device)
    go = lambda: wp.copy(big, src)  # noqa: E731
    go()
    t = statistics.median(timed(go) for _ in range(args.runs))
    print(f"  {'copy':<12} {t:.3f} ms  {2 * big.size * 4 / t / 1e9:.2f} TB/s (read + write)")


if __name__ == "__main__":
    main()
