"""Where the output pass's time goes (diagnostic, CUDA).

Renders one benchmark scene, then times variants of a per-slot output kernel on
its ``pix_to_face``: the full computation, without the edge distance, without
the barycentric divisions (stores only), and the stores alone; variants of the
four-slots-per-thread pass (its memory traffic alone, loads hoisted, empty
groups skipped); and the write floor (one float / one float4 per thread, a
memset, a copy). The differences say whether a pass is bound by arithmetic,
by latency or by its stores.

    python benchmarks/output_pass_probe.py --device cuda:0 [--scene ico5x8_512_k8]
"""

from __future__ import annotations

import argparse
import statistics

import warp as wp

from warpraster import bench
from warpraster.fragments import fragment_values
from warpraster.geometry import pixel_centre
from warpraster.meshes import pack_meshes
from warpraster.raster import RasterWorkspace, rasterize_packed
from warpraster.raster.coverage import PassArgs
from warpraster.raster.outputs import write_outputs_kernel
from warpraster.raster.stores import store4
from warpraster.raster.workspace import make_pass
from warpraster.settings import Tuning

wp.set_module_options({"enable_backward": False, "fuse_fp": False})


@wp.kernel
def _probe(ps: PassArgs, mode: int):
    i = wp.tid()
    k = ps.faces_per_pixel
    q = i // k
    s = i - q * k
    f = ps.pix_to_face[q, s]
    if mode == 3 or f < 0:  # stores only
        ps.zbuf[q, s] = -1.0
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
        z, bary, d = fragment_values(
            p, v0, v1, v2, ps.perspective_correct, ps.clip_barycentric_coords
        )
        ps.zbuf[q, s] = z
        ps.bary[q, s] = bary
        ps.dists[q, s] = d
    elif mode == 1:  # no edge distance
        z, bary, d = fragment_values(
            p, v0, v1, v2, ps.perspective_correct, ps.clip_barycentric_coords
        )
        ps.zbuf[q, s] = z
        ps.bary[q, s] = bary
        ps.dists[q, s] = 0.0
    else:  # mode 2: loads and pixel centre, no barycentrics
        ps.zbuf[q, s] = v0[2] + p[0]
        ps.bary[q, s] = v1
        ps.dists[q, s] = v2[0] + p[1]


@wp.func
def _values(ps: PassArgs, e: int, f: int, m: wp.mat33):
    """Fragment values of flat slot e holding face f (records m), or the -1 fill."""
    k = ps.faces_per_pixel
    r = (e // k) % (ps.height * ps.width)
    p = pixel_centre(r // ps.width, r % ps.width, ps.height, ps.width)
    v0 = wp.vec3(m[0, 0], m[0, 1], m[0, 2])
    v1 = wp.vec3(m[1, 0], m[1, 1], m[1, 2])
    v2 = wp.vec3(m[2, 0], m[2, 1], m[2, 2])
    z, bary, d = fragment_values(p, v0, v1, v2, 0, 0)
    if f < 0:
        z = -1.0
        bary = wp.vec3(-1.0, -1.0, -1.0)
        d = -1.0
    return z, bary, d


@wp.func
def _hoisted_group(ps: PassArgs, g: int, f4: wp.vec4i):
    """Group g's four face records loaded before any arithmetic (no branch)."""
    m0 = ps.face_verts[wp.max(f4[0], 0)]
    m1 = ps.face_verts[wp.max(f4[1], 0)]
    m2 = ps.face_verts[wp.max(f4[2], 0)]
    m3 = ps.face_verts[wp.max(f4[3], 0)]
    z0, b0, d0 = _values(ps, 4 * g, f4[0], m0)
    z1, b1, d1 = _values(ps, 4 * g + 1, f4[1], m1)
    z2, b2, d2 = _values(ps, 4 * g + 2, f4[2], m2)
    z3, b3, d3 = _values(ps, 4 * g + 3, f4[3], m3)
    ps.zbuf4[g] = wp.vec4(z0, z1, z2, z3)
    ps.dists4[g] = wp.vec4(d0, d1, d2, d3)
    ps.bary4[3 * g] = wp.vec4(b0[0], b0[1], b0[2], b1[0])
    ps.bary4[3 * g + 1] = wp.vec4(b1[1], b1[2], b2[0], b2[1])
    ps.bary4[3 * g + 2] = wp.vec4(b2[2], b3[0], b3[1], b3[2])


@wp.kernel
def _wide_hoisted(ps: PassArgs):
    """Four slots per thread: one load of their faces, the four face records
    loaded before any arithmetic (no branch). Warp's 4-byte-aligned vec4 stores
    (as the pass before v15)."""
    g = wp.tid()
    _hoisted_group(ps, g, ps.pix_to_face4[g])


@wp.kernel
def _wide_skip(ps: PassArgs):
    """_wide_hoisted, but a group with no face is filled without loading
    anything more (most slots are empty at K = 8)."""
    g = wp.tid()
    f4 = ps.pix_to_face4[g]
    if f4[0] < 0 and f4[1] < 0 and f4[2] < 0 and f4[3] < 0:
        fill = wp.vec4(-1.0, -1.0, -1.0, -1.0)
        ps.zbuf4[g] = fill
        ps.dists4[g] = fill
        ps.bary4[3 * g] = fill
        ps.bary4[3 * g + 1] = fill
        ps.bary4[3 * g + 2] = fill
        return
    _hoisted_group(ps, g, f4)


@wp.kernel
def _wide_stores_only(ps: PassArgs):
    """The wide pass's memory traffic alone: its 16-byte face load, constant stores."""
    g = wp.tid()
    f = ps.pix_to_face4[g]
    c = float(f[0] + f[1] + f[2] + f[3]) * 0.0 - 1.0
    v = wp.vec4(c, c, c, c)
    store4(ps.zbuf4, g, v)
    store4(ps.dists4, g, v)
    store4(ps.bary4, 3 * g, v)
    store4(ps.bary4, 3 * g + 1, v)
    store4(ps.bary4, 3 * g + 2, v)


@wp.kernel
def _narrow_branchfree(ps: PassArgs):
    """One slot per thread, its face record loaded without a branch."""
    e = wp.tid()
    k = ps.faces_per_pixel
    q = e // k
    s = e - q * k
    f = ps.pix_to_face[q, s]
    z, b, d = _values(ps, e, f, ps.face_verts[wp.max(f, 0)])
    ps.zbuf[q, s] = z
    ps.bary[q, s] = b
    ps.dists[q, s] = d


@wp.kernel
def _fill(a: wp.array(dtype=wp.float32)):
    a[wp.tid()] = 1.0


@wp.kernel
def _fill4(a: wp.array(dtype=wp.vec4)):
    a[wp.tid()] = wp.vec4(1.0, 1.0, 1.0, 1.0)


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
    meshes = pack_meshes(verts, wp.array(f, dtype=wp.int32, device=device), first, count)
    settings = bench.scene_settings(sc, 8)
    ws = RasterWorkspace(num_meshes=sc.copies, num_faces=len(f), settings=settings,
                         device=device)  # fmt: skip
    out = rasterize_packed(meshes, ws, settings)
    ps = make_pass(meshes, ws, settings, out.pix_to_face, out.zbuf, out.bary_coords, out.dists)
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
    tuning = Tuning()
    write = write_outputs_kernel(device, False, False, False, sc.k, tuning)
    go = lambda: wp.launch(write, dim=slots, inputs=[ps], device=device)  # noqa: E731
    go()
    t = statistics.median(timed(go) for _ in range(args.runs))
    print(f"  {'_write_outputs':<12} {t:.3f} ms")
    for name, kern, dim in (
        ("wide stores", _wide_stores_only, slots // 4),
        ("wide hoisted", _wide_hoisted, slots // 4),
        ("wide skip", _wide_skip, slots // 4),
        ("narrow nobranch", _narrow_branchfree, slots),
        ("_write_outputs4", write_outputs_kernel(device, False, False, True, sc.k, tuning),
         slots // 4),
    ):
        go = lambda kern=kern, dim=dim: wp.launch(kern, dim=dim, inputs=[ps], device=device)  # noqa: E731
        go()
        t = statistics.median(timed(go) for _ in range(args.runs))
        print(f"  {name:<12} {t:.3f} ms  {slots * 24 / t / 1e9:.2f} TB/s")
    # The write floor: one float32 per thread into a 400 MB array, and a memset.
    big = wp.empty(100_000_000, dtype=wp.float32, device=device)
    go = lambda: wp.launch(_fill, dim=big.size, inputs=[big], device=device)  # noqa: E731
    go()
    t = statistics.median(timed(go) for _ in range(args.runs))
    print(f"  {'store kernel':<12} {t:.3f} ms  {big.size * 4 / t / 1e9:.2f} TB/s (400 MB)")
    big4 = wp.array(ptr=big.ptr, dtype=wp.vec4, shape=big.size // 4, device=device)
    go = lambda: wp.launch(_fill4, dim=big4.size, inputs=[big4], device=device)  # noqa: E731
    go()
    t = statistics.median(timed(go) for _ in range(args.runs))
    print(f"  {'vec4 stores':<12} {t:.3f} ms  {big.size * 4 / t / 1e9:.2f} TB/s (400 MB)")
    go = lambda: big.zero_()  # noqa: E731
    go()
    t = statistics.median(timed(go) for _ in range(args.runs))
    print(f"  {'zero_':<12} {t:.3f} ms  {big.size * 4 / t / 1e9:.2f} TB/s (400 MB)")
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
