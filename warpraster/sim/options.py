"""The Warp module options of the sensor's kernels, in one place.

A module sets them with ``wp.set_module_options``; its kernels built in modules
of their own (``module="unique"``) take no options from that module, so they
pass the same dict as ``module_options``.
"""

#: The forward kernels' (:mod:`warpraster.sim.render`): no FMA contraction, so
#: CPU and CUDA round the projection alike.
FORWARD_OPTIONS = {"fuse_fp": False}
#: The hand-written backward's and the reductions': no FMA contraction and no
#: generated adjoint (nothing in them is recorded on a tape).
NO_ADJOINT_OPTIONS = {"fuse_fp": False, "enable_backward": False}
