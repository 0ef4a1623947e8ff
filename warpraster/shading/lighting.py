"""Lights: ambient, directional and point lights with PyTorch3D's formulas.

The Warp functions :func:`diffuse` and :func:`specular` are PyTorch3D's
``pytorch3d.renderer.lighting.diffuse`` / ``specular`` for one point (float32,
same operation order): vectors are normalised as ``F.normalize(v, eps=1e-6)``
(``v / max(|v|, 1e-6)``), the diffuse term is ``color * relu(n . l)``, the
specular term ``color * relu(v . r) ** shininess`` with ``r = -l + 2 (n . l) n``,
masked to zero where ``n . l <= 0``.

Light objects hold their parameters as Warp arrays with a batch of 1 or N rows
(one per image, a batch of 1 shared by all images); see
:mod:`warpraster.shading.params` for what each argument accepts. Construction
checks the values (reading Warp arrays back once) and raises ValueError naming
the argument: colours must be finite and >= 0, a direction finite and not zero,
a location finite. Parameters
given as Warp arrays with ``requires_grad=True`` receive gradients in place;
NumPy input becomes trainable with ``requires_grad=True``.
"""

from __future__ import annotations

import inspect
from enum import IntEnum

import warp as wp

from .params import ParamRows, check_batch, check_rows, row, vec3_param

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "AmbientLights",
    "DirectionalLights",
    "LightKind",
    "LightRows",
    "PointLights",
    "diffuse",
    "LightList",
    "MAX_LAMBERT_LIGHTS",
    "lambert_light_sum",
    "lambert_light_sum_adjoint",
    "direction_toward",
    "light_index",
    "light_kind",
    "light_range",
    "light_rows",
    "light_terms",
    "normalize_eps",
    "normalize_eps_adjoint",
    "specular",
    "specular_toward",
]


class LightKind(IntEnum):
    """Which light a kernel evaluates (:class:`LightRows` ``kind``)."""

    AMBIENT = 0
    DIRECTIONAL = 1
    POINT = 2


#: PyTorch3D's ``F.normalize`` epsilon in ``diffuse``/``specular``.
NORMALIZE_EPS = wp.constant(1.0e-6)


@wp.func
def normalize_eps(v: wp.vec3) -> wp.vec3:
    """``v / max(|v|, 1e-6)`` (torch's ``F.normalize(v, eps=1e-6)``)."""
    return v / wp.max(wp.length(v), NORMALIZE_EPS)


@wp.func
def diffuse(normal: wp.vec3, color: wp.vec3, direction: wp.vec3) -> wp.vec3:
    """Lambert term ``color * relu(n^ . l^)`` (``direction`` points toward the light)."""
    n = normalize_eps(normal)
    d = normalize_eps(direction)
    angle = wp.max(wp.dot(n, d), 0.0)
    return color * angle


@wp.func
def normalize_eps_adjoint(v: wp.vec3, g: wp.vec3) -> wp.vec3:
    """Gradient at ``v`` of ``g . normalize_eps(v)`` (``v / max(|v|, eps)``)."""
    length = wp.length(v)
    if length > NORMALIZE_EPS:
        u = v / length
        return (g - u * wp.dot(u, g)) / length
    return g / NORMALIZE_EPS


@wp.func
def specular(
    point: wp.vec3,
    normal: wp.vec3,
    direction: wp.vec3,
    color: wp.vec3,
    camera_position: wp.vec3,
    shininess: float,
) -> wp.vec3:
    """Phong term ``color * relu(v^ . r)^shininess``, zero where ``n^ . l^ <= 0``."""
    return specular_toward(normal, direction, color, camera_position - point, shininess)


@wp.func
def specular_toward(
    normal: wp.vec3, direction: wp.vec3, color: wp.vec3, to_eye: wp.vec3, shininess: float
) -> wp.vec3:
    """:func:`specular` seen along ``to_eye`` (toward the viewer, not normalised: the
    eye minus the point, or the reversed view direction of an orthographic camera)."""
    n = normalize_eps(normal)
    d = normalize_eps(direction)
    cos_angle = wp.dot(n, d)
    view = normalize_eps(to_eye)
    reflect = -d + 2.0 * (cos_angle * n)
    return color * phong_power(phong_alpha(cos_angle, view, reflect), shininess)


@wp.func
def phong_alpha(cos_angle: float, view: wp.vec3, reflect: wp.vec3) -> float:
    """``relu(v^ . r)``, 0 where the light is behind the surface (``n^ . l^ <= 0``)."""
    if cos_angle > 0.0:
        return wp.max(wp.dot(view, reflect), 0.0)
    return 0.0


@wp.func
def phong_power(alpha: float, shininess: float) -> float:
    """``alpha ** shininess`` as torch gives it (``0 ** 0 == 1``)."""
    if alpha > 0.0:
        return wp.pow(alpha, shininess)
    if shininess == 0.0:
        return 1.0
    return 0.0


@wp.struct
class LightRows:
    """Lights as kernels read them: ``param`` the location (point lights) or
    direction (directional), and the ``ambient``, ``diffuse`` and ``specular``
    colours, (B,) ``vec3`` rows each.

    ``listed`` = 0: one light per image (PyTorch3D's lights), of kind ``kind``,
    rows B = 1 (shared) or N, each array broadcast on its own.
    ``listed`` = 1: a light list (:class:`LightList`): light j has kind
    ``kinds[j]`` and row j of every array; image n is lit by lights
    ``first[r] .. first[r + 1] - 1``, r = n (``first`` of N + 1 entries) or 0
    (2 entries: every image has the same lights).
    """

    kind: int
    param: wp.array(dtype=wp.vec3)
    ambient: wp.array(dtype=wp.vec3)
    diffuse: wp.array(dtype=wp.vec3)
    specular: wp.array(dtype=wp.vec3)
    listed: int
    kinds: wp.array(dtype=wp.int32)
    first: wp.array(dtype=wp.int32)


@wp.func
def light_range(light: LightRows, n: int):
    """(first, end) of the lights of image ``n`` (one light: (0, 1))."""
    if light.listed == 0:
        return 0, 1
    r = row(n, light.first.shape[0] - 1)
    return light.first[r], light.first[r + 1]


@wp.func
def light_index(light: LightRows, n: int, j: int, count: int) -> int:
    """Row of light ``j`` of image ``n`` in an array of ``count`` rows."""
    if light.listed != 0:
        return j
    return row(n, count)


@wp.func
def light_kind(light: LightRows, j: int) -> int:
    """The :class:`LightKind` of light ``j``."""
    if light.listed != 0:
        return light.kinds[j]
    return light.kind


@wp.func
def direction_toward(kind: int, param: wp.vec3, point: wp.vec3) -> wp.vec3:
    """Direction toward a light of ``kind`` with parameter ``param`` from ``point``."""
    if kind == LightKind.POINT:
        return param - point
    return param


@wp.func
def light_direction(light: LightRows, n: int, point: wp.vec3) -> wp.vec3:
    """Direction toward the light of row ``n`` from ``point`` (not normalised)."""
    p = light.param[row(n, light.param.shape[0])]
    if light.kind == LightKind.POINT:
        return p - point
    return p


@wp.func
def light_terms(
    light: LightRows,
    n: int,
    point: wp.vec3,
    normal: wp.vec3,
    camera_position: wp.vec3,
    shininess: float,
):
    """(diffuse, specular) light of row ``n`` at ``point`` (before the material colours)."""
    if light.kind == LightKind.AMBIENT:
        return wp.vec3(0.0), wp.vec3(0.0)
    direction = light_direction(light, n, point)
    dc = light.diffuse[row(n, light.diffuse.shape[0])]
    sc = light.specular[row(n, light.specular.shape[0])]
    return (
        diffuse(normal, dc, direction),
        specular(point, normal, direction, sc, camera_position, shininess),
    )


#: Lights per image :func:`lambert_light_sum` evaluates (its loop is unrolled).
MAX_LAMBERT_LIGHTS = 8


@wp.func
def _lambert_term(lights: LightRows, n: int, j: int, point: wp.vec3, normal: wp.vec3):
    """(ambient colour, direction toward the light, its diffuse colour, on) of light
    ``j`` of image ``n`` at ``point`` (on = 0 for an ambient light)."""
    kind = light_kind(lights, j)
    la = lights.ambient[light_index(lights, n, j, lights.ambient.shape[0])]
    if kind == LightKind.AMBIENT:
        return la, wp.vec3(0.0), wp.vec3(0.0), 0
    p = lights.param[light_index(lights, n, j, lights.param.shape[0])]
    dc = lights.diffuse[light_index(lights, n, j, lights.diffuse.shape[0])]
    return la, direction_toward(kind, p, point), dc, 1


@wp.func
def lambert_light_sum(lights: LightRows, n: int, point: wp.vec3, normal: wp.vec3) -> wp.vec3:
    """The lights of image ``n`` on a diffuse surface: the sum over its lights of
    PyTorch3D's ambient colour plus :func:`diffuse` (its per-light formula with
    ambient and diffuse reflectivity 1 and no specular term), in list order; the
    first :data:`MAX_LAMBERT_LIGHTS`, the loop unrolled (Warp's generated adjoint
    differentiates it)."""
    lo, hi = light_range(lights, n)
    total = wp.vec3(0.0)
    for jj in range(MAX_LAMBERT_LIGHTS):
        j = lo + jj
        if j < hi:
            la, direction, dc, on = _lambert_term(lights, n, j, point, normal)
            total = total + la
            if on != 0:
                total = total + diffuse(normal, dc, direction)
    return total


@wp.func
def lambert_light_sum_adjoint(
    lights: LightRows, n: int, point: wp.vec3, normal: wp.vec3, g: wp.vec3
):
    """Gradients (of ``point``, of ``normal``) of ``g . lambert_light_sum(...)``."""
    lo, hi = light_range(lights, n)
    g_point = wp.vec3(0.0)
    g_normal = wp.vec3(0.0)
    for jj in range(MAX_LAMBERT_LIGHTS):
        j = lo + jj
        if j < hi:
            _la, direction, dc, on = _lambert_term(lights, n, j, point, normal)
            if on != 0:
                nn = normalize_eps(normal)
                dd = normalize_eps(direction)
                if wp.dot(nn, dd) > 0.0:
                    g_angle = wp.dot(g, dc)
                    g_normal = g_normal + normalize_eps_adjoint(normal, g_angle * dd)
                    if light_kind(lights, j) == LightKind.POINT:
                        g_point = g_point - normalize_eps_adjoint(direction, g_angle * nn)
    return g_point, g_normal


class LightsBase(ParamRows):
    """What every light holds: ambient/diffuse/specular colours and one vec3 parameter.

    Attributes:
        ambient_color, diffuse_color, specular_color: ``wp.vec3`` (B,) arrays.
        kind: :class:`LightKind`.
        device: the Warp device.
    """

    kind: LightKind

    def _setup(self, values: dict, device, requires_grad: bool) -> None:
        if device is None:
            arrays = [v for v in values.values() if isinstance(v, wp.array)]
            device = arrays[0].device if arrays else None
        self.device = wp.get_device(device)
        parsed = {
            name: vec3_param(v, name, self.device, requires_grad) for name, v in values.items()
        }
        self._n = check_batch(type(self).__name__, parsed)
        # set-up checks of the values (a host read of Warp arrays, once): colours
        # finite and >= 0, a direction not zero (it would light nothing), a
        # location finite
        for name, arr in parsed.items():
            if name.endswith("_color"):
                check_rows(arr, name, minimum=0.0)
            else:
                check_rows(arr, name, nonzero=name == "direction")
        self._names = tuple(parsed)
        for name, arr in parsed.items():
            setattr(self, name, arr)

    def _param(self) -> wp.array:
        """The kind's own parameter (direction or location): the last one given."""
        return getattr(self, self._names[-1])

    def kernel_args(self) -> list:
        """[kind, param, ambient, diffuse, specular]: the kernels' light arguments."""
        return [
            int(self.kind),
            self._param(),
            self.ambient_color,
            self.diffuse_color,
            self.specular_color,
        ]


#: PyTorch3D's default light direction / location.
_POSITION_DEFAULT = ((0.0, 1.0, 0.0),)


class _PhongLights(LightsBase):
    """Lights with diffuse and specular terms: the three colours (PyTorch3D's
    defaults) and the parameter named by ``_position`` (default (0, 1, 0)), which
    the subclass's signature lists after the colours (``inspect.signature`` and
    :mod:`warpraster.torch` read it)."""

    _position: str

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        base = list(inspect.signature(_PhongLights.__init__).parameters.values())
        colours, rest = base[1:4], base[4:-1]  # without self and **position
        position = inspect.Parameter(
            cls._position, inspect.Parameter.KEYWORD_ONLY, default=_POSITION_DEFAULT
        )
        cls.__signature__ = inspect.Signature([*colours, position, *rest])

    def __init__(
        self,
        *,
        ambient_color=((0.5, 0.5, 0.5),),
        diffuse_color=((0.3, 0.3, 0.3),),
        specular_color=((0.2, 0.2, 0.2),),
        device=None,
        requires_grad: bool = False,
        **position,
    ):
        unknown = sorted(set(position) - {self._position})
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected keyword arguments {unknown}")
        values = dict(
            ambient_color=ambient_color,
            diffuse_color=diffuse_color,
            specular_color=specular_color,
        )
        values[self._position] = position.get(self._position, _POSITION_DEFAULT)
        self._setup(values, device, requires_grad)


class DirectionalLights(_PhongLights):
    """Directional lights, as PyTorch3D's ``DirectionalLights``.

    Args (keyword-only, each ``(3,)``, ``(1, 3)`` or ``(N, 3)``; see module docs):
        ambient_color: default (0.5, 0.5, 0.5).
        diffuse_color: default (0.3, 0.3, 0.3).
        specular_color: default (0.2, 0.2, 0.2).
        direction: direction toward the light (need not be unit), default (0, 1, 0).
        device: Warp device (default: that of the Warp arrays given, else Warp's default).
        requires_grad: make NumPy-given parameters trainable Warp arrays.
    """

    kind = LightKind.DIRECTIONAL
    _position = "direction"


class PointLights(_PhongLights):
    """Point lights, as PyTorch3D's ``PointLights`` (world-space ``location``).

    Args (keyword-only, each ``(3,)``, ``(1, 3)`` or ``(N, 3)``):
        ambient_color: default (0.5, 0.5, 0.5).
        diffuse_color: default (0.3, 0.3, 0.3).
        specular_color: default (0.2, 0.2, 0.2).
        location: light position, default (0, 1, 0).
        device, requires_grad: as :class:`DirectionalLights`.
    """

    kind = LightKind.POINT
    _position = "location"


class AmbientLights(LightsBase):
    """Ambient light only (no diffuse or specular term), as PyTorch3D's ``AmbientLights``.

    Args:
        ambient_color: ``(3,)``, ``(1, 3)`` or ``(N, 3)``, default (1, 1, 1).
        device, requires_grad: as :class:`DirectionalLights`.
    """

    kind = LightKind.AMBIENT

    def __init__(self, *, ambient_color=None, device=None, requires_grad: bool = False):
        if ambient_color is None:
            ambient_color = ((1.0, 1.0, 1.0),)
        self._setup(dict(ambient_color=ambient_color), device, requires_grad)
        zero = wp.zeros(1, dtype=wp.vec3, device=self.device)
        self.diffuse_color = self.specular_color = self._zero = zero

    def _param(self) -> wp.array:
        return self._zero


def _rows_param(value, name: str, count: int, device, requires_grad: bool) -> wp.array:
    """(L,) ``vec3`` rows of a :class:`LightList` (a Warp array is used zero-copy)."""
    arr = vec3_param(value, name, device, requires_grad)
    if arr.shape[0] != count:
        raise ValueError(f"{name} must have one row per light ({count}), got {arr.shape[0]}")
    return arr


class LightList(ParamRows):
    """Several lights per image, of any kinds: a scene's light list (a USD stage's
    ambient, distant and point lights). Kernels sum the lights of an image in list
    order, each with PyTorch3D's formula ``(m_a l_a + m_d diffuse) texel + m_s
    specular`` (:func:`~warpraster.shading.slot_light.lit_colour_toward`).

    Args (keyword-only; colours and parameters ``(L, 3)`` NumPy or (L,) ``vec3``
    Warp arrays, used zero-copy):
        kinds: (L,) :class:`LightKind` per light.
        param: direction toward the light (directional) or location (point);
            any finite value for ambient lights.
        ambient, diffuse, specular: colours (>= 0). ``diffuse`` and ``specular``
            may be one Warp array (one colour for both terms; on a tape it then
            receives both terms' gradients).
        first: (N + 1,) ints, image n lit by lights ``first[n] .. first[n + 1] - 1``;
            None: every image by all L lights.
        device, requires_grad: as :class:`DirectionalLights`.

    Raises:
        TypeError, ValueError: bad input, named by argument (values read back once).

    ``len()`` is 1 (every image has all the lights) or N; ``specular_color`` may be
    ``diffuse_color`` (one array for both terms).
    """

    _names = ("param", "ambient_color", "diffuse_color", "specular_color")

    def __init__(
        self,
        *,
        kinds,
        param,
        ambient,
        diffuse,
        specular,
        first=None,
        device=None,
        requires_grad: bool = False,
    ):
        import numpy as np

        kinds = np.asarray(kinds, np.int64).reshape(-1)
        count = int(kinds.shape[0])
        if count < 1:
            raise ValueError("kinds: a light list needs at least one light")
        valid = {int(k) for k in LightKind}
        if not set(kinds.tolist()) <= valid:
            raise ValueError(f"kinds must be LightKind values, got {kinds.tolist()}")
        given = [param, ambient, diffuse, specular]
        if device is None:
            arrays = [v for v in given if isinstance(v, wp.array)]
            device = arrays[0].device if arrays else None
        self.device = wp.get_device(device)
        d, rg = self.device, requires_grad
        self.param = _rows_param(param, "param", count, d, rg)
        self.ambient_color = _rows_param(ambient, "ambient", count, d, rg)
        self.diffuse_color = _rows_param(diffuse, "diffuse", count, d, rg)
        self.specular_color = (
            self.diffuse_color
            if specular is diffuse
            else _rows_param(specular, "specular", count, d, rg)
        )
        for name in ("ambient_color", "diffuse_color", "specular_color"):
            check_rows(getattr(self, name), name[: -len("_color")], minimum=0.0)
        check_rows(self.param, "param")
        first = np.array([0, count]) if first is None else np.asarray(first, np.int64).reshape(-1)
        if first.shape[0] < 2 or first[0] != 0 or first[-1] != count or np.any(np.diff(first) < 0):
            raise ValueError(
                f"first must run from 0 to the {count} lights without decreasing, "
                f"got {first.tolist()}"
            )
        self._n = int(first.shape[0]) - 1
        self.kinds = wp.array(kinds.astype(np.int32), dtype=wp.int32, device=d)
        self.first = wp.array(first.astype(np.int32), dtype=wp.int32, device=d)
        self.num_lights = count

    def fill(self, rows: LightRows) -> None:
        """Puts the list into the kernels' ``rows`` (``listed`` = 1)."""
        rows.kind = int(LightKind.AMBIENT)
        rows.listed = 1
        rows.param, rows.ambient = self.param, self.ambient_color
        rows.diffuse, rows.specular = self.diffuse_color, self.specular_color
        rows.kinds, rows.first = self.kinds, self.first


def light_rows(lights, device) -> LightRows:
    """The kernels' :class:`LightRows` of ``lights``: a :class:`LightList` (its
    ``fill``) or one light per image (``DirectionalLights``, ``PointLights``,
    ``AmbientLights``: ``listed`` = 0), unused arrays one-element placeholders."""
    from ..structs import new_struct

    rows = new_struct(LightRows, device)
    if isinstance(lights, LightList):
        lights.fill(rows)
    else:
        rows.listed = 0
        rows.kind, rows.param, rows.ambient, rows.diffuse, rows.specular = lights.kernel_args()
    return rows
