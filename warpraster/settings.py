"""The render settings and the tuning knobs: two frozen, hashable objects.

:class:`RasterSettings` carries what a render computes (PyTorch3D's
``rasterize_meshes`` arguments, validated once); :class:`Tuning` carries how it
is computed on the device (kernel variants, register caps, fast-path
thresholds). Neither changes the output; the tuning lives on a workspace and is
part of every cache key there, so changing it on an existing workspace takes
effect on the next call.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["RasterSettings", "Tuning", "parse_image_size"]

_INT32_MAX = 2**31 - 1


def _int(value, name: str) -> int:
    """An integral value (Python or NumPy int, not bool) as int, else TypeError."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def parse_image_size(image_size, name: str = "image_size") -> tuple[int, int]:
    """``int`` or ``(H, W)`` of ints -> (H, W), each >= 1.

    Strings and floats are refused (``"32"`` would otherwise read as (3, 2) and
    ``32.5`` be truncated silently).
    """
    if isinstance(image_size, (str, bytes)):
        raise TypeError(f"{name} must be an int or (H, W) of ints, got {image_size!r}")
    if isinstance(image_size, (int, np.integer)) and not isinstance(image_size, bool):
        h = w = int(image_size)
    else:
        bad = f"{name} must be an int or (H, W) of ints, got {image_size!r}"
        try:
            items = list(image_size)
        except TypeError:
            raise TypeError(bad) from None
        if len(items) != 2:
            raise TypeError(bad)
        h, w = (_int(s, name) for s in items)
    if h < 1 or w < 1:
        raise ValueError(f"{name} must be >= 1 on both sides, got {(h, w)}")
    return h, w


def _optional_int(value, name: str, minimum: int) -> int | None:
    if value is None:
        return None
    v = _int(value, name)
    if v < minimum:
        raise ValueError(f"{name} must be None or >= {minimum}, got {value}")
    return v


def _flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_, int, np.integer)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


@dataclass(frozen=True, kw_only=True)
class RasterSettings:
    """What one rasterization computes; PyTorch3D's ``rasterize_meshes`` arguments.

    Validated and normalised on construction (ints, floats and bools; ``image_size``
    as ``(H, W)``), so a settings object that exists is a valid one. Frozen and
    hashable: it is a cache key, and ``dataclasses.replace`` makes a variant.

    Attributes:
        image_size: ``(H, W)`` in pixels (an ``int`` is accepted for square images).
        blur_radius: squared NDC distance within which a face outside a pixel
            still covers it (>= 0).
        faces_per_pixel: K >= 1, faces kept per pixel.
        bin_size: None = the fastest bins measured (8 x 8 pixels for K = 1,
            4 rows x 8 columns for K > 1); 0 = naive; > 0 = square bins of that
            many pixels. The output is identical.
        max_faces_per_bin: most faces a bin's list may hold (None = no per-bin
            cap; an overflowing bin still renders exactly). Ignored by the naive
            path, where PyTorch3D also accepts 0.
        perspective_correct: perspective-correct barycentrics (z = view depth).
        clip_barycentric_coords: clamp negative barycentrics to 0, renormalise.
        cull_backfaces: skip faces clockwise in NDC xy (PyTorch3D's rule).
        z_clip_value: split faces crossing ``z = z_clip_value`` and drop the parts
            in front of it (None = no clipping).
        cull_to_frustum: drop faces wholly outside the NDC view frustum.
        deterministic: atomic-free backward, bit-identical gradients run after run.
        exact_perspective_grad: True (default): the true derivative where the
            perspective denominator is clamped to its floor (blurred slots outside
            a face). False: PyTorch3D's numbers there, which propagate through the
            clamp as if it were not one (1e6 to 1e18; what the PyTorch3D parity
            tests set). Identical everywhere else; see docs/BACKWARD.md.
    """

    image_size: tuple[int, int] = (256, 256)
    blur_radius: float = 0.0
    faces_per_pixel: int = 8
    bin_size: int | None = None
    max_faces_per_bin: int | None = None
    perspective_correct: bool = False
    clip_barycentric_coords: bool = False
    cull_backfaces: bool = False
    z_clip_value: float | None = None
    cull_to_frustum: bool = False
    deterministic: bool = False
    exact_perspective_grad: bool = True

    def __post_init__(self):
        put = object.__setattr__  # frozen: normalise once, here
        put(self, "image_size", parse_image_size(self.image_size))
        k = _int(self.faces_per_pixel, "faces_per_pixel")
        if k < 1:
            raise ValueError(f"faces_per_pixel must be >= 1, got {k}")
        put(self, "faces_per_pixel", k)
        try:
            blur = float(self.blur_radius)
        except (TypeError, ValueError):
            raise TypeError(f"blur_radius must be a float, got {self.blur_radius!r}") from None
        if not math.isfinite(blur) or blur < 0.0:
            raise ValueError(f"blur_radius must be finite and >= 0, got {self.blur_radius}")
        put(self, "blur_radius", blur)
        if self.bin_size is not None:
            b = _int(self.bin_size, "bin_size")
            if b < 0:
                raise ValueError(f"bin_size must be None, 0 (naive) or > 0, got {b}")
            put(self, "bin_size", b)
        # the naive path never reads it: accept what PyTorch3D accepts there (0)
        naive = self.bin_size == 0
        put(self, "max_faces_per_bin", _optional_int(
            self.max_faces_per_bin, "max_faces_per_bin", 0 if naive else 1))  # fmt: skip
        if self.z_clip_value is not None:
            try:
                z = float(self.z_clip_value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"z_clip_value must be a float or None, got {self.z_clip_value!r}"
                ) from None
            if not math.isfinite(z):
                raise ValueError(f"z_clip_value must be finite or None, got {z}")
            put(self, "z_clip_value", z)
        for name in ("perspective_correct", "clip_barycentric_coords", "cull_backfaces",
                     "cull_to_frustum", "deterministic", "exact_perspective_grad"):  # fmt: skip
            put(self, name, _flag(getattr(self, name), name))

    @property
    def binned(self) -> bool:
        """True for the coarse-to-fine path (``bin_size`` None or > 0)."""
        return self.bin_size != 0

    @property
    def clipped(self) -> bool:
        """True when faces are clipped or culled before rasterization."""
        return self.z_clip_value is not None or self.cull_to_frustum

    def check_slots(self, num_meshes: int) -> None:
        """Raises if N * H * W * K does not fit the int32 indexing of the kernels."""
        h, w = self.image_size
        if num_meshes * h * w * self.faces_per_pixel > _INT32_MAX:
            raise ValueError(
                f"faces_per_pixel={self.faces_per_pixel} with {num_meshes} images of "
                f"{h}x{w} needs more than 2**31 slots"
            )

    def replace(self, **changes) -> RasterSettings:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def sizing(
        cls, settings: RasterSettings | None, *, image_size=None, faces_per_pixel=None,
        bin_size=None, max_faces_per_bin=None, deterministic=False,
    ) -> RasterSettings:  # fmt: skip
        """``settings``, or the settings that size a workspace given as keywords
        (the older workspace signature): image size, K, bins, backward strategy."""
        if settings is not None:
            if not isinstance(settings, cls):
                raise TypeError(f"settings must be a RasterSettings, got {type(settings).__name__}")
            return settings
        return cls(
            image_size=256 if image_size is None else image_size,
            faces_per_pixel=8 if faces_per_pixel is None else faces_per_pixel,
            bin_size=bin_size,
            max_faces_per_bin=max_faces_per_bin,
            deterministic=deterministic,
        )


@dataclass(frozen=True, kw_only=True)
class Tuning:
    """How a render is computed on the device; never what it computes.

    Lives on a :class:`~warpraster.raster.workspace.RasterWorkspace` (``ws.tuning``)
    and is part of every cache key there (launch records, the argument struct, the
    call graph, kernel variants): assigning ``ws.tuning = ws.tuning.replace(...)``
    takes effect on the next call. The defaults were measured fastest on an H200
    (docs/PERF.md).

    Attributes:
        small_face_pixels: K = 1 binned: faces covering at most this many pixels
            are drawn face by face (atomic min of a (depth, face) key) instead of
            being binned; 0 turns that pass off.
        small_face_lanes: threads per face in that pass (None: by face size).
        wide_outputs: write the outputs four slots per 16-byte store where K is
            a multiple of 4.
        register_queue_max_k: largest K served by a top-K queue in registers
            (at most 32); larger K keep the queue in the output arrays.
        register_queue_max_k_blur: the same when ``blur_radius > 0`` (more faces
            offered per pixel). On an H200, ico5 x8 512² K = 32, graph forward /
            forward + backward, the 32-slot register queue took 1.15 / 1.37 ms
            against 1.55-1.60 / 1.77-1.83 for the output-array queue without blur,
            and 2.75-2.76 / 3.64 against 3.33-3.35 / 4.20-4.24 with blur 1e-4.
        max_sorted_bin: longest bin list sorted by face index when faces must be
            offered in index order (clipped meshes); longer lists fall back to
            every face of the mesh (exact, slower).
        max_registers: CUDA register caps per kernel family, as sorted
            ``(("outputs", 64), ("queue8", 56), ...)`` pairs (hashable).
        fill_empty_once: a workspace's own outputs (K a multiple of 4, wide
            outputs): write an empty group of four slots only when an earlier
            call left values there (it keeps the -1 fill otherwise).
        call_graphs: replay repeated calls as one graph: None = on CUDA, True =
            on every device, False = never.
        specialize: compile the render flags into kernel variants: None = on
            CUDA only (each variant is a separate compile), True = everywhere.
    """

    small_face_pixels: int = 64
    small_face_lanes: int | None = None
    wide_outputs: bool = True
    fill_empty_once: bool = True
    register_queue_max_k: int = 32
    register_queue_max_k_blur: int = 32
    max_sorted_bin: int = 256
    max_registers: tuple[tuple[str, int], ...] = field(default=())
    call_graphs: bool | None = None
    specialize: bool | None = None

    def __post_init__(self):
        put = object.__setattr__
        put(self, "small_face_pixels", _optional_int(self.small_face_pixels,
                                                     "small_face_pixels", 0))  # fmt: skip
        put(self, "small_face_lanes", _optional_int(self.small_face_lanes, "small_face_lanes", 1))
        q = _int(self.register_queue_max_k, "register_queue_max_k")
        if not 0 <= q <= 32:
            raise ValueError(f"register_queue_max_k must be in [0, 32], got {q}")
        put(self, "register_queue_max_k", q)
        qb = _int(self.register_queue_max_k_blur, "register_queue_max_k_blur")
        if not 0 <= qb <= 32:
            raise ValueError(f"register_queue_max_k_blur must be in [0, 32], got {qb}")
        put(self, "register_queue_max_k_blur", qb)
        put(self, "max_sorted_bin", _optional_int(self.max_sorted_bin, "max_sorted_bin", 1))
        regs = dict(self.max_registers)
        for name, cap in regs.items():
            if cap is not None:
                _optional_int(cap, f"max_registers[{name!r}]", 1)
        put(self, "max_registers", tuple(sorted((str(k), int(v)) for k, v in regs.items()
                                                if v is not None)))  # fmt: skip
        put(self, "wide_outputs", _flag(self.wide_outputs, "wide_outputs"))
        put(self, "fill_empty_once", _flag(self.fill_empty_once, "fill_empty_once"))

    def register_queue_serves(self, k: int, blur: bool) -> bool:
        """Whether the register queue renders K slots (``blur``: blur_radius > 0)."""
        return k <= (self.register_queue_max_k_blur if blur else self.register_queue_max_k)

    def registers(self, kernel: str) -> int | None:
        """The register cap of a kernel family, None for the compiler's choice."""
        return dict(self.max_registers).get(kernel)

    def specialized(self, device) -> bool:
        """Whether kernels are compiled per flag set on ``device`` (a ``wp.Device``)."""
        return device.is_cuda if self.specialize is None else bool(self.specialize)

    def replace(self, **changes) -> Tuning:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)
