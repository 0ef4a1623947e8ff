"""The renderer bench (image alone) under launch shapes that are module
constants: the thread block of the output-array queue pass when it serves only
split-face bins (``raster.launch.ORDERED_ONLY_BLOCK``) and the thread count of
the clipped path's map back (``clip.MAP_BACK_THREADS``).

``python scripts/gpu_launch_shapes.py BLOCK THREADS [bench_render options]``;
one process per shape (captured graphs of several renderers in one process
failed to instantiate on Warp 1.19), run alternately to compare.
"""

import sys

from warpraster import bench_render, clip
from warpraster.raster import launch

if __name__ == "__main__":
    launch.ORDERED_ONLY_BLOCK = int(sys.argv[1])
    clip.MAP_BACK_THREADS = int(sys.argv[2])
    print(f"ordered-only block {launch.ORDERED_ONLY_BLOCK}, map-back threads "
          f"{clip.MAP_BACK_THREADS}")  # fmt: skip
    sys.exit(bench_render.main(["--channels", "none", *sys.argv[3:]]))
