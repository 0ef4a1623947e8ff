"""What the pixel kernel and its adjoint read and write: the argument structs.

:class:`ShadeInputs` is one launch's inputs besides the fragments (the per-face
corner tables, texels, camera, lights, materials and the blend's fields);
:class:`ShadeGrads` nests the same structs for the gradients the adjoint adds
(same field names: the gradient of ``a.mat.diffuse`` is ``g.mat.diffuse``);
:class:`ImageGrad` is the image gradient the adjoint reads. The forward
(:mod:`warpraster.shading.fused`) and the adjoint
(:mod:`warpraster.shading.fused_adjoint`) exchange these.
"""

from __future__ import annotations

import functools
import operator
from enum import IntFlag

import warp as wp

from ..structs import fill_placeholders, new_struct
from ..variants import same_struct, struct_ints, variant_name
from .lighting import LightRows
from .params import row
from .pixel_args import CameraRT, FaceCorners, MaterialRows, PixelFragments

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "BLEND_EPS",
    "PINNED_FIELDS",
    "ImageGrad",
    "ShadeGrads",
    "ShadeInputs",
    "Want",
    "camera_centre",
    "camera_centre_precise",
    "inputs_pin",
    "material_row",
    "new_inputs",
    "pinned_values",
    "prob",
    "zinv",
]

#: PyTorch3D's ``eps`` in ``softmax_rgb_blend``.
BLEND_EPS = wp.constant(1.0e-10)


class Want(IntFlag):
    """Bits of :attr:`ShadeGrads.want`: which gradients the adjoint writes."""

    BARY = 1
    ZBUF = 2
    DISTS = 4
    COLORS = 8  # given colours, or the texel array (TexelSource.PIXEL)
    FACE_POS = 16
    FACE_NRM = 32
    FACE_COL = 64
    CAMERA = 128
    LIGHT = 256
    MATERIAL = 512
    BACKGROUND = 1024
    ALPHA = 2048  # the per-slot opacity array (slot_alpha)


@wp.struct
class ShadeInputs:
    """What the pixel kernel reads besides the fragments.

    ``lit`` = 0: the slot colours are ``colors`` (blend only). ``lit`` = 1: each
    slot is lit: surface from the per-face corner tables ``faces``, the texel
    from ``texel_source``, camera ``cam``, ``light`` and material ``mat`` rows.

    ``material_per_face`` = 1: face f is lit with material row
    ``face_material[f]`` (a material table); 0: with the image's row (one
    material per image, PyTorch3D's ``Materials``).

    ``compact`` = 1 promises that each pixel's filled slots come first (the
    rasterizer's sorted queues): the slot loops stop at the first empty slot
    instead of reading all K (at K = 8 most slots are empty).

    What a scene renderer adds (all 0 for PyTorch3D's shaders):
    ``two_sided`` = 1 turns each slot's normal toward the viewer before lighting;
    ``orthographic`` = 1 looks along the camera's forward axis (R's third
    column) instead of from its centre; ``far_cut`` = 1 makes a hard blend's
    first slot beyond ``zfar`` empty; ``slot_alpha`` = 1 gives a hard blend's
    alpha from the per-slot opacity ``alpha`` (clamped to [0, 1]) and
    ``premultiply`` = 1 writes its colour multiplied by that alpha;
    ``precise_eye`` = 1 evaluates the eye ``-(R T)`` in float64 and rounds it once
    (:func:`camera_centre_precise`: the camera position a scene gave in float64,
    where PyTorch3D's float32 evaluation can be an ulp off it).
    """

    lit: int
    colors: wp.array4d(dtype=wp.vec3)
    mode: int
    texel_source: int
    faces: FaceCorners
    texels: wp.array4d(dtype=wp.vec3)
    cam: CameraRT
    light: LightRows
    mat: MaterialRows
    face_material: wp.array(dtype=wp.int32)
    material_per_face: int
    blend: int
    compact: int
    background: wp.array(dtype=wp.vec3)
    znear: wp.array(dtype=wp.float32)
    zfar: wp.array(dtype=wp.float32)
    sigma: float
    gamma: float
    two_sided: int
    orthographic: int
    far_cut: int
    slot_alpha: int
    premultiply: int
    alpha: wp.array4d(dtype=wp.float32)
    precise_eye: int


@wp.struct
class ShadeGrads:
    """Where the adjoint adds its gradients: those of the fragments (``frag``:
    ``bary_coords``, ``zbuf``, ``dists``; ``pix_to_face`` is not written) and of
    the arrays of :class:`ShadeInputs` (each nested struct holds the gradients of
    the same fields), and ``want``, the :class:`Want` bits of those it writes."""

    want: int
    frag: PixelFragments
    colors: wp.array4d(dtype=wp.vec3)
    faces: FaceCorners
    cam: CameraRT
    light: LightRows
    mat: MaterialRows
    background: wp.array(dtype=wp.vec3)
    alpha: wp.array4d(dtype=wp.float32)
    #: the camera's gradient as partial sums, ``cam_stripes`` stripes per image
    #: (row n * cam_stripes + warp index mod cam_stripes: R's nine entries
    #: row-major, then T's three); reduced into ``cam`` after the adjoint (fused.py)
    cam_part: wp.array2d(dtype=wp.float32)
    cam_stripes: int


@wp.struct
class ImageGrad:
    """The image gradient the adjoint reads: ``grad`` (N, H, W, 4), the image's
    ``.grad``, plus, when ``mse`` = 1, the gradient of an image MSE computed on
    the fly (:meth:`warpraster.Renderer.image_mse`, which then writes no image
    gradient): ``2 weight loss_grad[0] (image - target)``, as
    :func:`~warpraster.shading.reductions.image_mse`'s backward adds it."""

    grad: wp.array4d(dtype=wp.float32)
    mse: int
    target: wp.array4d(dtype=wp.float32)
    loss_grad: wp.array(dtype=wp.float32)
    weight: float


#: The int fields of :class:`ShadeInputs` a kernel variant compiles in as constants
#: (:func:`inputs_pin`), in that function's order. Each is uniform over a launch; the
#: generic kernel reads them at run time and keeps registers and code for every
#: path, a variant keeps only its own (and, through ``ShadeGrads.want``, only the
#: gradients asked for: :func:`~warpraster.variants.want_pin`).
PINNED_FIELDS = (
    "lit", "mode", "texel_source", "material_per_face", "blend", "compact", "two_sided",
    "orthographic", "far_cut", "slot_alpha", "premultiply", "precise_eye",
)  # fmt: skip


_PINNED_OF = operator.attrgetter(*PINNED_FIELDS)


def pinned_values(a: ShadeInputs) -> tuple[int, ...]:
    """``a``'s :data:`PINNED_FIELDS`, as ints (a kernel variant's key)."""
    return struct_ints(_PINNED_OF, a)


@functools.cache
def inputs_pin(values: tuple[int, ...] | None) -> wp.Function:
    """A Warp function ``pin(a) -> a`` that returns ``a`` with its
    :data:`PINNED_FIELDS` set to the constants ``values``: a kernel that starts with
    ``a = wp.static(inputs_pin(values))(a)`` has every branch on them decided at
    compile time (the helpers it calls are inlined). ``None``: the identity (the
    generic kernel)."""
    if values is None:
        return same_struct(ShadeInputs)
    (lit, mode, texel_source, material_per_face, blend, compact, two_sided,
     orthographic, far_cut, slot_alpha, premultiply, precise_eye) = values  # fmt: skip

    def pin(a: ShadeInputs):
        a.lit = lit
        a.mode = mode
        a.texel_source = texel_source
        a.material_per_face = material_per_face
        a.blend = blend
        a.compact = compact
        a.two_sided = two_sided
        a.orthographic = orthographic
        a.far_cut = far_cut
        a.slot_alpha = slot_alpha
        a.premultiply = premultiply
        a.precise_eye = precise_eye
        return a

    return wp.func(pin, name=variant_name("pin_inputs", values), module="unique")


#: The structs nested in ShadeInputs and ShadeGrads, by field name.
NESTED = {"faces": FaceCorners, "cam": CameraRT, "light": LightRows, "mat": MaterialRows}


def new_inputs(device) -> ShadeInputs:
    """A :class:`ShadeInputs` whose arrays (nested ones too) are one-element
    placeholders on ``device`` (Warp's tape walks every array field of a struct
    it differentiates)."""
    a = new_struct(ShadeInputs, device)
    for name, cls in NESTED.items():
        fill_placeholders(getattr(a, name), cls, device)
    return a


@wp.func
def wants(g: ShadeGrads, bit: int) -> bool:
    return (g.want & bit) != 0


@wp.func
def camera_centre(cam: CameraRT, n: int):
    """World position of camera ``n``: ``C @ R + T = 0`` (row vectors), so ``C = -R T``."""
    r = cam.R[row(n, cam.R.shape[0])]
    t = cam.T[row(n, cam.T.shape[0])]
    return -(r * t)


@wp.func
def camera_centre_precise(cam: CameraRT, n: int):
    """:func:`camera_centre` evaluated in float64 and rounded to float32 once (the
    products of float32 values are exact in float64): the correctly rounded
    centre, up to the float64 sum's rounding. Its gradient is the same."""
    r = cam.R[row(n, cam.R.shape[0])]
    t = cam.T[row(n, cam.T.shape[0])]
    t0 = wp.float64(t[0])
    t1 = wp.float64(t[1])
    t2 = wp.float64(t[2])
    x = wp.float64(r[0, 0]) * t0 + wp.float64(r[0, 1]) * t1 + wp.float64(r[0, 2]) * t2
    y = wp.float64(r[1, 0]) * t0 + wp.float64(r[1, 1]) * t1 + wp.float64(r[1, 2]) * t2
    z = wp.float64(r[2, 0]) * t0 + wp.float64(r[2, 1]) * t1 + wp.float64(r[2, 2]) * t2
    return wp.vec3(-wp.float32(x), -wp.float32(y), -wp.float32(z))


@wp.func
def prob(d: float, sigma: float) -> float:
    """``sigmoid(-d / sigma)`` as torch computes it."""
    x = -d / sigma
    return 1.0 / (1.0 + wp.exp(-x))


@wp.func
def zinv(f: int, z: float, zn: float, zf: float) -> float:
    """PyTorch3D's ``(zfar - z) / (zfar - znear) * mask``."""
    if f < 0:
        return 0.0
    return (zf - z) / (zf - zn)


@wp.func
def material_row(a: ShadeInputs, n: int, f: int) -> int:
    """The material row that lights face ``f`` in image ``n``: the face's own
    (a material table, ``material_per_face``) or the image's."""
    if a.material_per_face != 0:
        return a.face_material[f]
    return n
