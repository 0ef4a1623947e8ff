"""Times variants of the clipped path's unclip map (forward and adjoint) on the
K=8 renderer bench scene's real fragments: the 4-d launch, a flat one-slot-per-
thread launch, and 16-byte (4 slots) per thread. Checks each against the 4-d one.

``python scripts/gpu_unclip_variants.py`` (CUDA).
"""

import numpy as np
import warp as wp

from warpraster.bench_render import make_renderer
from warpraster.clip import (
    _KEEP,
    ClippedFaces,
    FaceCases,
    _unclip_in_place,
    _unclip_in_place_adjoint,
)
from warpraster.stores import load4i, store4i

wp.set_module_options({"enable_backward": False})


@wp.kernel
def flat1(
    pix: wp.array(dtype=wp.int32),
    clipped: ClippedFaces,
    cases: FaceCases,
    conversion: wp.array(dtype=wp.mat33),
    out: wp.array(dtype=wp.int32),
    bary: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    p = pix[i]
    u = int(-1)
    if p >= 0:
        u = clipped.to_unclipped[p]
        if cases.face_case[u] != _KEEP:
            bary[i] = conversion[p] * bary[i]
    out[i] = u


@wp.kernel
def flat4(
    pix: wp.array(dtype=wp.vec4i),
    clipped: ClippedFaces,
    cases: FaceCases,
    conversion: wp.array(dtype=wp.mat33),
    out: wp.array(dtype=wp.vec4i),
    bary: wp.array(dtype=wp.vec3),
):
    j = wp.tid()
    p = load4i(pix, j)
    u = wp.vec4i(-1, -1, -1, -1)
    for l in range(4):
        q = p[l]
        if q >= 0:
            v = clipped.to_unclipped[q]
            u[l] = v
            if cases.face_case[v] != _KEEP:
                bary[4 * j + l] = conversion[q] * bary[4 * j + l]
    store4i(out, j, u)


@wp.kernel
def flat4_adj(
    pix: wp.array(dtype=wp.vec4i),
    clipped: ClippedFaces,
    cases: FaceCases,
    conversion: wp.array(dtype=wp.mat33),
    bary_grad: wp.array(dtype=wp.vec3),
):
    j = wp.tid()
    p = load4i(pix, j)
    for l in range(4):
        q = p[l]
        if q >= 0:
            if cases.face_case[clipped.to_unclipped[q]] != _KEEP:
                bary_grad[4 * j + l] = wp.transpose(conversion[q]) * bary_grad[4 * j + l]


@wp.kernel
def flat1_adj(
    pix: wp.array(dtype=wp.int32),
    clipped: ClippedFaces,
    cases: FaceCases,
    conversion: wp.array(dtype=wp.mat33),
    bary_grad: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    p = pix[i]
    if p >= 0:
        if cases.face_case[clipped.to_unclipped[p]] != _KEEP:
            bary_grad[i] = wp.transpose(conversion[p]) * bary_grad[i]


def timed(fn, runs=50):
    fn()
    wp.synchronize()
    ts = []
    for _ in range(runs):
        with wp.ScopedTimer("x", print=False, cuda_filter=wp.TIMING_KERNEL, synchronize=True) as t:
            fn()
        ts.append(sum(r.elapsed for r in t.timing_results))
    return float(np.median(ts))


def main():
    wp.config.quiet = True
    dev = wp.get_device("cuda:0")
    r, verts = make_renderer("softphong_ico5x8_512_k8", dev)
    r.render(verts)
    wp.synchronize()
    ws = r.render(verts).workspace
    inner = ws.raster.fragments
    buf = ws.clip
    pix = inner.pix_to_face
    n = pix.size
    shape = tuple(pix.shape)
    flat_pix = pix.flatten()
    bary = inner.bary_coords
    flat_bary = bary.flatten()
    out = wp.empty_like(pix)
    out_flat = out.flatten()
    pix4 = wp.array(ptr=flat_pix.ptr, dtype=wp.vec4i, shape=(n // 4,), device=dev)
    out4 = wp.array(ptr=out_flat.ptr, dtype=wp.vec4i, shape=(n // 4,), device=dev)
    conv = buf.barycentric_conversion
    filled = (pix.numpy() >= 0).mean()
    print(f"slots {n}, filled {filled:.3f}, split faces {(buf.cases.face_case.numpy() > 1).sum()}")
    ref = None
    for name, fn in (
        (
            "4d",
            lambda: wp.launch(
                _unclip_in_place,
                dim=shape,
                inputs=[pix, buf.clipped, buf.cases, conv],
                outputs=[out, bary],
                device=dev,
            ),
        ),
        (
            "flat1",
            lambda: wp.launch(
                flat1,
                dim=n,
                inputs=[flat_pix, buf.clipped, buf.cases, conv, out_flat, flat_bary],
                device=dev,
            ),
        ),
        (
            "flat4",
            lambda: wp.launch(
                flat4,
                dim=n // 4,
                inputs=[pix4, buf.clipped, buf.cases, conv, out4, flat_bary],
                device=dev,
            ),
        ),
    ):
        out.fill_(-7)
        fn()
        got = out.numpy()
        if ref is None:
            ref = got
        print(f"fwd {name:6s} {timed(fn):.4f} ms equal={np.array_equal(got, ref)}")
    g = wp.zeros_like(bary)
    gflat = g.flatten()
    cg = wp.zeros_like(conv)
    for name, fn in (
        (
            "4d",
            lambda: wp.launch(
                _unclip_in_place_adjoint,
                dim=shape,
                inputs=[pix, buf.clipped, buf.cases, conv, ws.raster.face_verts, 1, 0],
                outputs=[g, cg],
                device=dev,
            ),
        ),
        (
            "flat1",
            lambda: wp.launch(
                flat1_adj, dim=n, inputs=[flat_pix, buf.clipped, buf.cases, conv, gflat], device=dev
            ),
        ),
        (
            "flat4",
            lambda: wp.launch(
                flat4_adj,
                dim=n // 4,
                inputs=[pix4, buf.clipped, buf.cases, conv, gflat],
                device=dev,
            ),
        ),
    ):
        print(f"adj {name:6s} {timed(fn):.4f} ms")


if __name__ == "__main__":
    main()
