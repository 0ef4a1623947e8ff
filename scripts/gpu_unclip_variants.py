"""Times the clipped path's map back (forward and adjoint) on the K=8 renderer bench
scene's real fragments: the library's kernels (four slots a thread, 16-byte
accesses) against the two layouts they replaced, a 4-d launch (one thread per
slot, as before) and a flat one-slot-per-thread launch. Checks the maps agree.

``python scripts/gpu_unclip_variants.py`` (CUDA). docs/PERF.md has the figures.
"""

import numpy as np
import warp as wp

from warpraster.bench_render import make_renderer
from warpraster.clip import (
    _KEEP,
    ClippedFaces,
    ClippedRows,
    FaceCases,
    InPlaceGrads,
    SlotPair,
    _struct,
    _unclip_in_place,
    _unclip_in_place_adjoint,
)

wp.set_module_options({"enable_backward": False})


@wp.func
def _map(clipped: ClippedFaces, cases: FaceCases, conversion: wp.array(dtype=wp.mat33),
         p: int, b: wp.vec3):  # fmt: skip
    """(input face, converted barycentrics) of a slot holding clipped face p."""
    if p < 0:
        return -1, b
    u = clipped.to_unclipped[p]
    if cases.face_case[u] != _KEEP:
        return u, conversion[p] * b
    return u, b


@wp.kernel
def four_d(pix: wp.array4d(dtype=wp.int32), clipped: ClippedFaces, cases: FaceCases,
           conversion: wp.array(dtype=wp.mat33), out: wp.array4d(dtype=wp.int32),
           bary: wp.array4d(dtype=wp.vec3)):  # fmt: skip
    n, y, x, k = wp.tid()
    u, b = _map(clipped, cases, conversion, pix[n, y, x, k], bary[n, y, x, k])
    out[n, y, x, k] = u
    bary[n, y, x, k] = b


@wp.kernel
def flat1(pix: wp.array(dtype=wp.int32), clipped: ClippedFaces, cases: FaceCases,
          conversion: wp.array(dtype=wp.mat33), out: wp.array(dtype=wp.int32),
          bary: wp.array(dtype=wp.vec3)):  # fmt: skip
    i = wp.tid()
    u, b = _map(clipped, cases, conversion, pix[i], bary[i])
    out[i] = u
    bary[i] = b


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
    ws = r.render(verts).workspace
    inner, buf = ws.raster.fragments, ws.clip
    pix, bary = inner.pix_to_face, inner.bary_coords
    conv = buf.barycentric_conversion
    out = wp.empty_like(pix)
    slots = buf.slot_views(pix)
    pair = _struct(SlotPair, src=slots, dst=buf.slot_views(out), fill=buf.no_fill,
                   now=buf.no_fill)  # fmt: skip
    n = pix.size
    print(f"slots {n}, filled {(pix.numpy() >= 0).mean():.3f}, "
          f"split faces {(buf.cases.face_case.numpy() > 1).sum()}")  # fmt: skip
    common = [buf.clipped, buf.cases, conv]
    variants = {
        "4d": lambda: wp.launch(
            four_d, dim=pix.shape, inputs=[pix, *common, out, bary], device=dev
        ),  # fmt: skip
        "flat1": lambda: wp.launch(
            flat1, dim=n, inputs=[pix.flatten(), *common, out.flatten(), bary.flatten()], device=dev
        ),  # fmt: skip
        "library": lambda: wp.launch(
            _unclip_in_place,
            dim=(n + 3) // 4,
            inputs=[pair, buf.map, (n + 3) // 4, (n + 3) // 4, bary.flatten()],
            device=dev,
        ),  # fmt: skip
    }
    ref = None
    for name, fn in variants.items():
        out.fill_(-7)
        fn()
        got = out.numpy()
        ref = got if ref is None else ref
        print(f"fwd {name:8s} {timed(fn):.4f} ms equal={np.array_equal(got, ref)}")
    g = wp.zeros_like(bary)
    cg = wp.zeros_like(conv)
    rows = _struct(ClippedRows, face_verts=ws.raster.face_verts, size=wp.vec3i(*pix.shape[1:]),
                   perspective_correct=1, clip_barycentric_coords=0)  # fmt: skip
    grads = _struct(InPlaceGrads, bary=g.flatten(), conversion=cg)
    adj = lambda: wp.launch(  # noqa: E731
        _unclip_in_place_adjoint, dim=(n + 3) // 4, inputs=[slots, buf.map, rows, grads],
        device=dev,
    )  # fmt: skip
    print(f"adj library  {timed(adj):.4f} ms")


if __name__ == "__main__":
    main()
