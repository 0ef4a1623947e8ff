"""K=8 blur renderer scene: forward time and fragments by bin size (CUDA)."""

import functools
import statistics

import warp as wp

import warpraster.bench_render as br
from warpraster.rasterizer import RasterizationSettings
from warpraster.timing import timer

wp.config.quiet = True
wp.init()
dev = wp.get_device("cuda:0")
ref = None
for b in (None, 4, 8, 16):
    br.RasterizationSettings = functools.partial(RasterizationSettings, bin_size=b)
    r, verts = br.make_renderer("softphong_ico5x8_512_k8_blur", dev)
    out = r.render(verts)
    ws = out.workspace.raster
    t = timer(dev)
    for _ in range(3):
        r.render(verts)
    ms = statistics.median(t(lambda r=r, v=verts: r.render(v)) for _ in range(10))
    p2f = out.fragments.pix_to_face.numpy().copy()
    z = out.fragments.zbuf.numpy().copy()
    same = None if ref is None else bool((p2f == ref[0]).all() and (z == ref[1]).all())
    ref = ref or (p2f, z)
    print(
        f"bin_size {b}: fwd {ms:.3f} ms, overflowed {int(ws.overflow.numpy()[0])}, "
        f"list entries {int(ws.bin_count.numpy().sum())} / {ws.bin_faces.shape[0]}, "
        f"fragments equal to bin_size=None: {same}"
    )
br.RasterizationSettings = RasterizationSettings
