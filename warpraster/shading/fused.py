"""Per-pixel shading and blending in one kernel, with a hand-written adjoint.

One thread per pixel walks its K slots once: it lights each filled slot
(PyTorch3D's Phong or flat model summed over the image's lights,
:mod:`warpraster.shading.slot_light`) or reads a given colour, and blends them
(PyTorch3D's ``hard_rgb_blend`` or ``softmax_rgb_blend``, see
:mod:`warpraster.shading.blending` for the formulas) straight into the RGBA
image. No (N, H, W, K) colour array is written: at K = 8 and 512² for 8 images
that array is 200 MB, written once and read twice by separate shading and
blending kernels (and its gradient as much again).

The adjoint is one kernel too (:mod:`warpraster.shading.fused_adjoint`),
recorded on the tape by :func:`launch_shade_blend`. The structs both read are
in :mod:`warpraster.shading.shade_inputs`.

Blend, colour source and the other flags of :class:`ShadeInputs` are ints,
uniform across a launch. On CUDA both kernels run as variants with them (and, in
the adjoint, the gradients asked for) compiled in as constants
(:func:`~warpraster.shading.shade_inputs.inputs_pin`), so a PyTorch3D shader's
kernel carries neither the stage renderer's paths nor the camera's gradient it
was not asked for; the CPU reads them at run time from one generic kernel each.
"""

from __future__ import annotations

import warp as wp

from ..aggregated import launch_reduce_stripes, striped_partials, stripes_for
from ..backward.tape import active_tape, record_func
from ..patches import patch_launch_size, patch_pixel
from ..structs import placeholder
from ..variants import kernel_family, variant_kernel, variants_on
from .fused_adjoint import (
    ADJOINT_MAX_REGISTERS,
    ADJOINT_PATCH_W,
    add_camera_sums,
    shade_blend_adjoint,
)
from .modes import BlendMode, TexelSource
from .params import row
from .pixel_args import PixelFragments
from .shade_inputs import (
    BLEND_EPS,
    NESTED,
    ImageGrad,
    ShadeGrads,
    ShadeInputs,
    Want,
    camera_centre,
    inputs_pin,
    material_row,
    new_inputs,
    pinned_values,
    prob,
    zinv,
)
from .slot_light import (
    depth_range,
    hard_hit,
    lit_colour_toward,
    pixel_eye,
    slot_colour,
    slot_opacity,
    softmax_denominator,
    softmax_sums,
    write_rgba,
)

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "ADJOINT_MAX_REGISTERS",
    "BLEND_EPS",
    "ImageGrad",
    "ShadeGrads",
    "ShadeInputs",
    "camera_centre",
    "launch_shade_blend",
    "lit_colour_toward",
    "material_row",
    "new_inputs",
    "prob",
    "slot_colour",
    "zinv",
]

#: Former private names, kept for the modules that import them from here.
_write_rgba = write_rgba
_NESTED = NESTED


# ----------------------------------------------------------------------------- kernels
#: CUDA register cap of both pixel kernels (the adjoint's own: ADJOINT_MAX_REGISTERS).
#: Uncapped they take ~112 (forward) and ~118 (adjoint) registers: 2 blocks of 256 per
#: SM, and they wait on their gathers. Capped at 80 (H200, `python
#: scripts/gpu_render_regs.py`, graph replay, median of 20): K=8 soft Phong 0.775 ->
#: 0.739 ms forward, 1.789 -> 1.712 ms forward + backward; the adjoint alone at 80:
#: 1.749; both at 64: 0.749 / 1.749.
PIXEL_MAX_REGISTERS = 80
#: Pixel patches of the two pixel kernels (:mod:`warpraster.patches`): each
#: warp's 32 threads take a patch of ``patch_w`` x (32 / ``patch_w``) pixels of one
#: image (32: a row segment, as a 3-d launch). H200, graph replay, median of 20,
#: image alone, both kernels at one width (32 / 16 / 8 / 4): K=8 forward
#: 0.655-0.659 / 0.641 / 0.633-0.636 / 0.634 ms, forward + backward 1.358-1.364 /
#: 1.354 / 1.362-1.370 / 1.371: the forward (lighting, faces gathered) gains from
#: square patches, the adjoint (atomics into the faces' rows) loses; forward at 8
#: with the adjoint at 32 / 16: 0.636-0.642 / 0.639 forward, 1.345-1.350 /
#: 1.360-1.366 forward + backward (docs/PERF.md). Since the adjoint sums each
#: warp's corner rows before its atomics (warpraster/aggregated.py), adjoint at
#: 32 / 16 / 8: K=8 forward + backward 1.178-1.179 / 1.173-1.175 / 1.181, K=1
#: 1.498-1.501 / 1.493-1.494 / 1.503 ms.
FORWARD_PATCH_W = wp.constant(8)


@kernel_family
def _shade_blend_kernel(pins: tuple[int, ...] | None) -> wp.Kernel:
    """The pixel kernel with ``ShadeInputs``' :data:`PINNED_FIELDS` compiled in as
    ``pins``, or read at run time (None: the generic kernel)."""
    pin = inputs_pin(pins)

    def shade_blend(
        # Fragments in:
        frag: PixelFragments,
        # Shading in:
        a: ShadeInputs,
        # Data out:
        image_out: wp.array4d(dtype=wp.float32),
    ):
        n, y, x, inside = patch_pixel(
            wp.tid(), image_out.shape[0], image_out.shape[1], image_out.shape[2], FORWARD_PATCH_W
        )
        if not inside:
            return
        a = wp.static(pin)(a)
        eye = pixel_eye(a, n)
        bg = a.background[row(n, a.background.shape[0])]
        if a.blend == BlendMode.HARD:
            f0 = hard_hit(a, frag, n, y, x)
            if f0 >= 0:
                c0 = slot_colour(a, n, y, x, 0, f0, frag.bary_coords[n, y, x, 0], eye)
                al = slot_opacity(a, n, y, x, 0)
                if a.premultiply != 0:
                    c0 = c0 * al
                write_rgba(image_out, n, y, x, c0, al)
            else:
                write_rgba(image_out, n, y, x, bg, 0.0)
            return
        zn, zf = depth_range(a, n)
        zraw, _kmax, _used, keep, wsum, csum = softmax_sums(frag, a, n, y, x, eye, zn, zf, 1)
        _zmax, _dexp, delta, denom = softmax_denominator(zraw, wsum, a.gamma)
        write_rgba(image_out, n, y, x, (csum + delta * bg) / denom, 1.0 - keep)

    return variant_kernel(shade_blend, "shade_blend", pins, PIXEL_MAX_REGISTERS)


# ----------------------------------------------------------------------------- launcher
def _has_grad(arr: wp.array) -> bool:
    # (an empty array's gradient: nothing to zero, and ``tape.record_func`` refuses it)
    return arr is not None and arr.requires_grad and arr.grad is not None and arr.size > 0


def _grad_or(arr: wp.array, fallback: wp.array) -> tuple[wp.array, bool]:
    """(``arr.grad``, True) when it carries one, else (``fallback``, False)."""
    if _has_grad(arr):
        return arr.grad, True
    return fallback, False


def with_grad(*arrays) -> list:
    """The arrays that carry a gradient (what ``tape.record_func`` may zero)."""
    return [a for a in arrays if _has_grad(a)]


def launch_image_kernel(kernel, dim, inputs: list, image_out: wp.array, device):
    """Launches ``kernel`` writing the RGBA ``image_out`` outside the tape (its
    adjoint is recorded by hand): the active tape when ``image_out`` carries a
    gradient (the adjoint is then to be recorded on it), else None."""
    wp.launch(kernel, dim=dim, inputs=inputs, outputs=[image_out], device=device, record_tape=False)
    tape = active_tape()
    if tape is None or image_out.grad is None:
        return None
    return tape


#: The nested structs written as a whole (every array, once any has a gradient), by Want bit.
_GROUPS = {Want.CAMERA: "cam", Want.LIGHT: "light", Want.MATERIAL: "mat"}


def _shade_grads(frag: PixelFragments, inputs: ShadeInputs) -> tuple[ShadeGrads, list]:
    """The :class:`ShadeGrads` of a launch (``want`` set) and the arrays it writes into."""
    g = ShadeGrads()
    want = Want(0)
    sources = []
    # the colour gradient goes to the given colours, or to the texel array
    colours = inputs.colors if inputs.lit == 0 else inputs.texels
    g.frag.pix_to_face = frag.pix_to_face  # not written
    singles = [  # (struct, field, array, Want bit)
        (g.frag, "bary_coords", frag.bary_coords, Want.BARY),
        (g.frag, "zbuf", frag.zbuf, Want.ZBUF),
        (g.frag, "dists", frag.dists, Want.DISTS),
        (g, "colors", colours, Want.COLORS),
        (g, "background", inputs.background, Want.BACKGROUND),
        (g.faces, "pos", inputs.faces.pos, Want.FACE_POS),
        (g.faces, "nrm", inputs.faces.nrm, Want.FACE_NRM),
        (g.faces, "col", inputs.faces.col, Want.FACE_COL),
        (g, "alpha", inputs.alpha, Want.ALPHA),
    ]
    for target, name, arr, bit in singles:
        grad, has = _grad_or(arr, arr)
        setattr(target, name, grad)
        if has:
            sources.append(arr)
            want |= bit
    for bit, group in _GROUPS.items():
        given = getattr(inputs, group)
        arrays = {
            name: getattr(given, name)
            for name, var in NESTED[group].vars.items()
            if wp.types.is_array(var.type) and var.type.dtype != wp.int32  # not kinds, first
        }
        grads = getattr(g, group)
        written = [arr for arr in arrays.values() if _has_grad(arr)]
        sources.extend(written)
        for name, arr in arrays.items():
            if _has_grad(arr):
                setattr(grads, name, arr.grad)
            elif written and inputs.lit != 0:
                # every array of a group is written: a member without a gradient gets
                # a scratch one (made while recording, not per backward)
                setattr(grads, name, wp.zeros_like(arr))
            else:
                setattr(grads, name, arr)
        if written and inputs.lit != 0:
            want |= bit
    if inputs.lit == 0:
        want &= ~(Want.FACE_POS | Want.FACE_NRM | Want.FACE_COL)
    elif inputs.texel_source != TexelSource.PIXEL:
        want &= ~Want.COLORS
    if inputs.lit != 0 and inputs.texel_source != TexelSource.VERTEX:
        want &= ~Want.FACE_COL
    if inputs.blend == BlendMode.HARD:
        want &= ~(Want.ZBUF | Want.DISTS)
    if inputs.slot_alpha == 0:
        want &= ~Want.ALPHA
    g.want = int(want)
    g.cam_part = placeholder(wp.float32, 2, frag.pix_to_face.device)
    g.cam_stripes = 1
    return g, sources


def launch_shade_blend(
    frag: PixelFragments,
    inputs: ShadeInputs,
    image_out: wp.array,
    image_grad: ImageGrad | None = None,
    *,
    specialize: bool | None = None,
) -> wp.Tape | None:
    """Launches the pixel kernel (outside the tape) and records its adjoint.

    Args:
        frag: the render's fragments (:func:`~warpraster.shading.pixel_args.pixel_fragments`).
        inputs: a filled :class:`ShadeInputs` (no checks here).
        image_out: (N, H, W, 4) float32 RGBA.
        image_grad: the :class:`ImageGrad` the adjoint reads (kept by the caller,
            e.g. :class:`~warpraster.shading.shaders.ShadingBuffers`, so that a
            fused loss can set its MSE fields after this call and before the
            backward); reset here to ``image_out.grad`` alone. None: one of this call's.
        specialize: launch kernel variants with ``inputs``' flags
            (:data:`~warpraster.shading.shade_inputs.PINNED_FIELDS`) and the
            adjoint's requested gradients compiled in: None = on CUDA (each variant
            is a compile of its own, seconds on the CPU), True / False = always / never.

    Returns:
        The tape an adjoint reading ``image_grad`` was recorded on, or None.

    The adjoint adds into the ``.grad`` of every array of ``inputs`` and of the
    fragments (``bary_coords``, ``zbuf``, ``dists``) that carries one. It reads
    ``image_out`` (the softmax blend's colour), which must then hold this
    forward's image until the backward has run.
    """
    if inputs.slot_alpha != 0 and inputs.blend != BlendMode.HARD:
        raise ValueError(
            "slot_alpha: per-slot opacity is a hard blend's (the softmax blend has none)"
        )
    p2f = frag.pix_to_face
    n, h, w, _ = p2f.shape
    device = p2f.device
    dim = patch_launch_size(n, h, w, FORWARD_PATCH_W)
    pins = pinned_values(inputs) if variants_on(device, specialize) else None
    tape = launch_image_kernel(_shade_blend_kernel(pins), dim, [frag, inputs], image_out, device)
    if tape is None:
        return None
    g, sources = _shade_grads(frag, inputs)
    if g.want == 0:
        return None
    adjoint = shade_blend_adjoint(pins, None if pins is None else g.want)
    ig = ImageGrad() if image_grad is None else image_grad
    ig.grad = image_out.grad
    ig.mse = 0
    dim = patch_launch_size(n, h, w, ADJOINT_PATCH_W)
    camera = (g.want & Want.CAMERA) != 0
    if camera:
        g.cam_stripes = stripes_for(dim, n)
        g.cam_part, cam_sums = striped_partials(device, n, g.cam_stripes, 12)

    def backward():
        if camera:
            g.cam_part.zero_()
            cam_sums.zero_()
        wp.launch(
            adjoint,
            dim=dim,
            inputs=[frag, inputs, image_out, ig],
            outputs=[g],
            device=device,
        )
        if camera:
            launch_reduce_stripes(g.cam_part, cam_sums, g.cam_stripes)
            wp.launch(
                add_camera_sums,
                dim=n,
                inputs=[cam_sums],
                outputs=[g.cam.R, g.cam.T, int(inputs.orthographic == 0)],
                device=device,
            )

    record_func(tape, backward, arrays=with_grad(image_out, *sources))
    return tape
