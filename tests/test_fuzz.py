"""Malformed input to every public entry point: a clear error or a correct result.

Each test starts from one small valid scene (two meshes, three triangles, each
with its own three vertices), breaks one argument with a mutation (shape, dtype,
device, index range, NaN/inf, empty) whose details hypothesis draws, calls one
entry point and asserts one of:

* a ``TypeError`` / ``ValueError`` whose message names the broken argument;
* a correct result: outputs finite (``pix_to_face`` in [-1, F)); a mutation that
  changes only the container (float64 vertices, int32 faces, a list for a
  tensor) gives exactly the valid scene's output; a NaN/inf vertex gives exactly
  the output of the scene with that vertex's face moved behind the camera (the
  documented behaviour: a face with a non-finite coordinate is never drawn and
  the other faces are unaffected; a face behind the camera is not drawn either,
  and no face shares a vertex with another here).

Never a crash, never garbage. Bounded for CI: 8 x 8 images, K in {1, 2}, the CPU
device, two hypothesis examples per (entry point, mutation), derandomized.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import warpraster as wr
from warpraster import shading

pytestmark = pytest.mark.skipif("cpu" not in DEVICES, reason="fuzzes on the Warp cpu device")

FUZZ = settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
SIZE = 8

# ----------------------------------------------------------------------------- the valid scene
# x, y inside the view of both the NDC raster and the default FoV camera (z in 2..3
# world = view space: R = I, T = 0); one vertex per face corner, no sharing.
VERTS = np.array(
    [[-0.9, -0.8, 2.0], [0.6, -0.7, 2.0], [-0.1, 0.9, 2.0],
     [-0.5, 0.5, 2.5], [0.8, 0.4, 2.5], [0.1, -0.9, 2.5],
     [-0.7, -0.2, 3.0], [0.9, -0.1, 3.0], [0.0, 0.8, 3.0]],
    dtype=np.float32,
)  # fmt: skip
FACES = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8]], dtype=np.int64)
FIRST = np.array([0, 2], dtype=np.int64)
COUNT = np.array([2, 1], dtype=np.int64)
ARGS = ("verts", "faces", "first", "count")

# What an error about each argument must name (the entry points call them
# verts / verts_packed / verts_world, faces / faces_packed, ...).
NAMES = {
    "verts": r"verts",
    "faces": r"faces",
    "first": r"mesh_to_face_first_idx|num_faces_per_mesh",
    "count": r"num_faces_per_mesh|mesh_to_face_first_idx",
    "image_size": r"image_size",
    "faces_per_pixel": r"faces_per_pixel",
    "blur_radius": r"blur_radius",
}


def _scene() -> dict:
    return {"verts": VERTS.copy(), "faces": FACES.copy(), "first": FIRST.copy(),
            "count": COUNT.copy(), "k": 1}  # fmt: skip


# ----------------------------------------------------------------------------- mutations
# A mutation: (argument it breaks, kind, fn(scene, draw) -> None editing the scene).
# kind: "error" (must raise naming the argument), "same" (must equal the valid
# scene's output), "nonfinite" (the face of scene["nonfinite_face"] is not drawn),
# "any" (an error naming the argument, or finite output).
def _verts_shape(s, draw):
    s["verts"] = draw(st.sampled_from([VERTS[:, :2], np.pad(VERTS, ((0, 0), (0, 1))),
                                       VERTS.reshape(-1), VERTS[None]]))  # fmt: skip


def _verts_dtype(s, draw):
    s["verts"] = VERTS.astype(draw(st.sampled_from([np.int32, np.int64, np.bool_])))


def _verts_f64(s, draw):
    s["verts"] = VERTS.astype(np.float64)


def _verts_nonfinite(s, draw):
    v = draw(st.integers(0, len(VERTS) - 1))
    s["verts"][v, draw(st.integers(0, 2))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    s["nonfinite_face"] = v // 3


def _faces_float(s, draw):
    s["faces"] = FACES.astype(draw(st.sampled_from([np.float32, np.float64]))) + draw(
        st.sampled_from([0.0, 0.5])
    )


def _faces_wrap(s, draw):
    s["faces"] = FACES + draw(st.sampled_from([2**32, -(2**32), 2**33]))


def _faces_range(s, draw):
    f = FACES.copy()
    f[draw(st.integers(0, 2)), draw(st.integers(0, 2))] = draw(
        st.sampled_from([-1, -5, len(VERTS), len(VERTS) + 7, 2**31 - 1])
    )
    s["faces"] = f


def _faces_shape(s, draw):
    s["faces"] = draw(st.sampled_from([FACES[:, :2], np.pad(FACES, ((0, 0), (0, 1))),
                                       FACES.reshape(-1)]))  # fmt: skip


def _faces_int32(s, draw):
    s["faces"] = FACES.astype(np.int32)


def _faces_empty(s, draw):
    s["faces"] = np.zeros((0, 3), np.int64)
    s["first"] = np.zeros(2, np.int64)
    s["count"] = np.zeros(2, np.int64)


def _first_fraction(s, draw):
    s["first"] = FIRST + draw(st.sampled_from([0.5, 0.25]))


def _count_fraction(s, draw):
    s["count"] = COUNT.astype(np.float64) + draw(st.sampled_from([0.0, 0.5]))


def _first_wrong(s, draw):
    s["first"] = draw(st.sampled_from([np.array([0, 1]), np.array([1, 2]), np.array([0, 3])]))


def _count_wrong(s, draw):
    s["count"] = draw(st.sampled_from([np.array([2, 2]), np.array([3, -1]), np.array([2, 0])]))


def _count_length(s, draw):
    s["count"] = draw(st.sampled_from([np.array([3]), np.array([2, 1, 0])]))


def _first_empty(s, draw):
    s["first"] = np.zeros(0, np.int64)
    s["count"] = np.zeros(0, np.int64)


def _first_2d(s, draw):
    s["first"] = FIRST[None]


def _image_size(s, draw):
    s["image_size"] = draw(st.sampled_from([0, -3, (0, 8), (8, -1)]))


def _faces_per_pixel(s, draw):
    s["k"] = draw(st.sampled_from([0, -1]))


def _blur(s, draw):
    s["blur_radius"] = draw(st.sampled_from([-0.1, float("nan"), float("inf")]))


def _k2(s, draw):
    s["k"] = 2


MUTATIONS: dict[str, tuple[str, str, Callable]] = {
    "verts wrong shape": ("verts", "error", _verts_shape),
    "verts integer or bool": ("verts", "error", _verts_dtype),
    "verts float64": ("verts", "same", _verts_f64),
    "verts NaN/inf": ("verts", "nonfinite", _verts_nonfinite),
    "faces float": ("faces", "error", _faces_float),
    "faces int64 past int32": ("faces", "error", _faces_wrap),
    "faces out of range": ("faces", "error", _faces_range),
    "faces wrong shape": ("faces", "error", _faces_shape),
    "faces int32": ("faces", "same", _faces_int32),
    "faces empty": ("faces", "any", _faces_empty),
    "first fractional": ("first", "error", _first_fraction),
    "count fractional": ("count", "error", _count_fraction),
    "first not the running sum": ("first", "error", _first_wrong),
    "count not adding up / negative": ("count", "error", _count_wrong),
    "count of another length": ("count", "error", _count_length),
    "no meshes": ("first", "error", _first_empty),
    "first 2-D": ("first", "error", _first_2d),
    "image_size < 1": ("image_size", "error", _image_size),
    "faces_per_pixel < 1": ("faces_per_pixel", "error", _faces_per_pixel),
    "blur_radius negative or non-finite": ("blur_radius", "error", _blur),
    "K = 2": ("verts", "same", _k2),
}


# ----------------------------------------------------------------------------- entry points
def _image_size_of(s):
    return s.get("image_size", SIZE)


def _hw(s):
    size = _image_size_of(s)
    return (size, size) if isinstance(size, int) else tuple(size)


def _settings(s) -> wr.RasterizationSettings:
    return wr.RasterizationSettings(image_size=_image_size_of(s), faces_per_pixel=s["k"],
                                    blur_radius=s.get("blur_radius", 0.0))  # fmt: skip


def _cameras():
    return wr.FoVPerspectiveCameras(device="cpu")


def _frags_np(frags) -> dict:
    return {k: getattr(frags, k).numpy().copy() for k in
            ("pix_to_face", "zbuf", "bary_coords", "dists")}  # fmt: skip


def _warp_raster(s):
    frags = wr.rasterize_meshes(
        s["verts"], s["faces"], s["first"], s["count"], image_size=_hw(s),
        faces_per_pixel=s["k"], blur_radius=s.get("blur_radius", 0.0),
    )  # fmt: skip
    return _frags_np(frags)


def _warp_mesh_rasterizer(s):
    rasterizer = wr.MeshRasterizer(cameras=_cameras(), raster_settings=_settings(s))
    return _frags_np(rasterizer(s["verts"], s["faces"], s["first"], s["count"]))


def _warp_shader(cams):
    return shading.HardPhongShader(cameras=cams, device="cpu")


def _warp_mesh_renderer(s):
    cams = _cameras()
    renderer = wr.MeshRenderer(
        rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=_settings(s)),
        shader=_warp_shader(cams),
    )
    image = renderer(s["verts"], s["faces"], s["first"], s["count"])
    return {"image": image.numpy().copy()}


def _warp_renderer(s):
    cams = _cameras()
    r = wr.Renderer(
        cameras=cams, raster_settings=_settings(s), shader=_warp_shader(cams), faces=s["faces"],
        mesh_to_face_first_idx=s["first"], num_faces_per_mesh=s["count"],
        num_verts=len(VERTS), device="cpu",
    )  # fmt: skip
    out = r.render(s["verts"])
    return {"image": out.image.numpy().copy(), "depth": out.depth.numpy().copy()}


WARP_ENTRIES = {
    "warpraster.rasterize_meshes": _warp_raster,
    "MeshRasterizer": _warp_mesh_rasterizer,
    "MeshRenderer": _warp_mesh_renderer,
    "Renderer": _warp_renderer,
}


# ----------------------------------------------------------------------------- the contract
def _nonfinite_truth(s) -> dict:
    """The scene with the non-finite vertex's face moved behind the camera (z = -1)."""
    truth = _scene()
    truth.update({k: v for k, v in s.items() if k not in ARGS + ("nonfinite_face",)})
    truth["verts"][3 * s["nonfinite_face"] : 3 * s["nonfinite_face"] + 3, 2] = -1.0
    return truth


def _assert_sane(out: dict, num_faces: int) -> None:
    for name, a in out.items():
        if name == "pix_to_face":
            assert a.min() >= -1 and a.max() < max(num_faces, 0) or a.max() == -1, name
        else:
            assert np.isfinite(a).all(), f"{name} has non-finite values"


def _assert_equal(got: dict, want: dict) -> None:
    """Exactly equal: the same kernels on the same float32 numbers."""
    assert got.keys() == want.keys()
    for name in got:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _as_warp(s: dict) -> dict:
    """The scene's arrays as Warp arrays where they convert without changing a value
    (float32 (V, 3) vertices, integer arrays that fit int32); the rest stay NumPy."""
    out = dict(s)
    v = s["verts"]
    if v.dtype == np.float32 and v.ndim == 2 and v.shape[1] == 3:
        out["verts"] = wp.array(v, dtype=wp.vec3, device="cpu")
    for name in ("faces", "first", "count"):
        a = s[name]
        if a.dtype.kind in "iu" and (a.size == 0 or (a.min() >= -(2**31) and a.max() < 2**31)):
            out[name] = wp.array(a.astype(np.int32), dtype=wp.int32, device="cpu")
    return out


def check_contract(entry: Callable[[dict], dict], mutation: str, draw, convert=None,
                   table=MUTATIONS) -> None:  # fmt: skip
    """Mutates the valid scene with ``table[mutation]``, calls ``entry`` on it
    (``convert``ed: its arrays made the entry's own kind) and asserts the contract of
    the module docstring."""
    arg, kind, mutate = table[mutation]
    convert = convert or (lambda scene: scene)
    s = _scene()
    mutate(s, draw)
    try:
        out = entry(convert(s))
    except (TypeError, ValueError) as e:
        assert kind in ("error", "any"), f"{mutation}: a valid input was refused: {e!r}"
        assert re.search(NAMES[arg], str(e)), f"{mutation}: the error does not name {arg}: {e!r}"
        return
    assert kind != "error", f"{mutation}: accepted without an error"
    _assert_sane(out, len(s["faces"]) if np.ndim(s["faces"]) == 2 else 0)
    if kind == "same":
        base = _scene()
        base["k"] = s["k"]
        _assert_equal(out, entry(convert(base)))
    elif kind == "nonfinite":
        _assert_equal(out, entry(convert(_nonfinite_truth(s))))


# Cases that fail in code other engineers own (the Warp-side renderer and shading
# validation): (entry, mutation) -> the reason, as strict xfails.
KNOWN: dict[tuple[str, str], str] = {}


def _cases(entries, table=MUTATIONS):
    for e in entries:
        for m in table:
            marks = []
            if (e, m) in KNOWN:
                marks.append(pytest.mark.xfail(reason=KNOWN[(e, m)], strict=True))
            yield pytest.param(e, m, marks=marks, id=f"{e}-{m}")


@pytest.mark.parametrize(("entry", "mutation"), list(_cases(WARP_ENTRIES)))
@FUZZ
@given(data=st.data())
def test_warp_entry_points_refuse_or_render_correctly(entry, mutation, data):
    """NumPy inputs or Warp arrays (drawn), one argument broken."""
    convert = _as_warp if data.draw(st.booleans(), label="as Warp arrays") else None
    check_contract(WARP_ENTRIES[entry], mutation, data.draw, convert)


# ----------------------------------------------------------------------------- torch
try:  # torch is optional: without it its cases are left out, the Warp ones run
    import torch

    import warpraster.torch as wrt
    from warpraster.torch import shading as T
except ImportError:
    torch = wrt = T = None


def _as_torch(s: dict) -> dict:
    """The scene's arrays as CPU tensors of the same dtype; ``on_meta`` moves one
    argument to the meta device."""
    out = dict(s)
    for name in ARGS:
        out[name] = torch.as_tensor(s[name])
    if "on_meta" in s:
        out[s["on_meta"]] = out[s["on_meta"]].to("meta")
    return out


def _on_meta(s, draw):
    s["on_meta"] = draw(st.sampled_from(ARGS))


TORCH_MUTATIONS = {
    **MUTATIONS,
    "one argument on the meta device": ("device", "error", _on_meta),
}
# an error about a device names the argument on the other device and the one it is
# compared with
NAMES["device"] = r"(verts|faces|mesh_to_face_first_idx|num_faces_per_mesh)\w* is on (meta|cpu)"


def _torch_np(x) -> np.ndarray:
    return x.detach().numpy().copy()


def _torch_raster(s):
    out = wrt.rasterize_meshes(
        s["verts"], s["faces"], s["first"], s["count"], image_size=_image_size_of(s),
        faces_per_pixel=s["k"], blur_radius=s.get("blur_radius", 0.0),
    )  # fmt: skip
    return dict(zip(("pix_to_face", "zbuf", "bary_coords", "dists"), map(_torch_np, out),
                    strict=True))  # fmt: skip


def _torch_settings(s):
    return T.RasterizationSettings(image_size=_image_size_of(s), faces_per_pixel=s["k"],
                                   blur_radius=s.get("blur_radius", 0.0))  # fmt: skip


def _torch_mesh_rasterizer(s):
    rasterizer = T.MeshRasterizer(cameras=T.FoVPerspectiveCameras(),
                                  raster_settings=_torch_settings(s))  # fmt: skip
    frags = rasterizer(s["verts"], s["faces"], s["first"], s["count"])
    return {k: _torch_np(getattr(frags, k)) for k in
            ("pix_to_face", "zbuf", "bary_coords", "dists")}  # fmt: skip


def _torch_mesh_renderer(s):
    cams = T.FoVPerspectiveCameras()
    renderer = T.MeshRenderer(
        T.MeshRasterizer(cameras=cams, raster_settings=_torch_settings(s)),
        T.HardPhongShader(cameras=cams),
    )
    return {"image": _torch_np(renderer(s["verts"], s["faces"], s["first"], s["count"]))}


TORCH_ENTRIES = {
    "warpraster.torch.rasterize_meshes": _torch_raster,
    "torch MeshRasterizer": _torch_mesh_rasterizer,
    "torch MeshRenderer": _torch_mesh_renderer,
}


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize(
    ("entry", "mutation"),
    list(_cases(TORCH_ENTRIES, TORCH_MUTATIONS)) if torch is not None else [("-", "-")],
)
@FUZZ
@given(data=st.data())
def test_torch_entry_points_refuse_or_render_correctly(entry, mutation, data):
    """Tensors of the NumPy arrays' dtypes (or a Python list for the per-mesh
    ranges, drawn), one argument broken."""
    as_list = data.draw(st.booleans(), label="per-mesh ranges as lists")

    def convert(s):
        out = _as_torch(s)
        if as_list:
            out["first"], out["count"] = s["first"].tolist(), s["count"].tolist()
            if "on_meta" in s and s["on_meta"] in ("first", "count"):
                out[s["on_meta"]] = torch.as_tensor(s[s["on_meta"]]).to("meta")
        return out

    check_contract(TORCH_ENTRIES[entry], mutation, data.draw, convert, TORCH_MUTATIONS)


# ----------------------------------------------------------------------------- other entries
# Entries with their own arguments: each argument is a float array or an index array
# (with the number of rows it indexes); one generic mutation breaks one of them.
P2F = np.array([0, 1, 2, -1, 2, 1, 0, -1], np.int64).reshape(1, 2, 4, 1)
BARY = np.random.default_rng(0).dirichlet(np.ones(3), size=(1, 2, 4, 1)).astype(np.float32)
ATTRS = np.random.default_rng(1).random((3, 3, 2)).astype(np.float32)
MAPS = np.random.default_rng(2).random((1, 4, 4, 3)).astype(np.float32)
UV_FACES = np.array([[0, 1, 2], [2, 3, 0], [1, 2, 3]], np.int64)
UVS = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], np.float32)


def _interp_reference(a):
    f = a["pix_to_face"]
    vals = np.einsum("nhwki,nhwkid->nhwkd", a["bary_coords"].astype(np.float64),
                     a["face_attributes"].astype(np.float64)[np.maximum(f, 0)])  # fmt: skip
    return {"values": np.where((f >= 0)[..., None], vals, 0.0)}


def _warp_interp(a):
    return {"values": shading.interpolate_face_attributes(
        a["pix_to_face"], a["bary_coords"], a["face_attributes"]).numpy().copy()}  # fmt: skip


def _torch_interp(a):
    t = {k: torch.as_tensor(v) for k, v in a.items()}
    out = wrt.interpolate_face_attributes(t["pix_to_face"], t["bary_coords"],
                                          t["face_attributes"])  # fmt: skip
    return {"values": _torch_np(out)}


def _made(obj) -> dict:
    """A constructed holder: no output to compare, only that it was built."""
    return {}


# name -> (valid arguments, {argument: spec}, call, NumPy reference or None); spec: the
# rows an index array indexes (int), FIXED (a float array whose last dim is fixed:
# barycentrics, UVs) or FREE (a float array of any channel count)
FIXED, FREE = "fixed", "free"
OTHER = {
    "shading.interpolate_face_attributes": (
        {"pix_to_face": P2F, "bary_coords": BARY, "face_attributes": ATTRS},
        {"pix_to_face": 3, "bary_coords": FIXED, "face_attributes": FREE},
        _warp_interp, _interp_reference),
    "torch interpolate_face_attributes": (
        {"pix_to_face": P2F, "bary_coords": BARY, "face_attributes": ATTRS},
        {"pix_to_face": 3, "bary_coords": FIXED, "face_attributes": FREE},
        _torch_interp, _interp_reference),
    "shading.TexturesVertex": (
        {"verts_features": VERTS}, {"verts_features": FREE},
        lambda a: _made(shading.TexturesVertex(a["verts_features"], device="cpu")), None),
    "shading.TexturesUV": (
        {"maps": MAPS, "faces_uvs": UV_FACES, "verts_uvs": UVS},
        {"maps": FREE, "faces_uvs": 4, "verts_uvs": FIXED},
        lambda a: _made(shading.TexturesUV(a["maps"], a["faces_uvs"], a["verts_uvs"],
                                           device="cpu")), None),  # fmt: skip
    "torch TexturesVertex": (
        {"verts_features": VERTS}, {"verts_features": FREE},
        lambda a: _made(T.TexturesVertex(torch.as_tensor(a["verts_features"]))), None),
    "torch TexturesUV": (
        {"maps": MAPS, "faces_uvs": UV_FACES, "verts_uvs": UVS},
        {"maps": FREE, "faces_uvs": 4, "verts_uvs": FIXED},
        lambda a: _made(T.TexturesUV(*(torch.as_tensor(a[k]) for k in
                                       ("maps", "faces_uvs", "verts_uvs")))), None),  # fmt: skip
}  # fmt: skip


# Where an entry's documented rule differs from the generic expectation.
EXPECTED = {
    # PyTorch3D's convention on the torch side: any negative pix_to_face is an empty slot
    ("torch interpolate_face_attributes", "pix_to_face", "index < -1"): "any",
}


def _other_mutations(spec):
    """Mutation name -> (expected, fn(array, rows, draw) -> array). expected: "error"
    (refused naming the argument), "same" (accepted, equal to the reference), "either"
    (one of those two: an integer array of float values may be converted exactly),
    "any" (refused naming the argument, or finite output where the input is finite)."""
    if spec in (FIXED, FREE):
        mutations = {
            "one dim more": ("error", lambda a, r, d: a[..., None]),
            "integer or bool": (
                "either",
                lambda a, r, d: a.astype(d(st.sampled_from([np.int32, np.int64, np.bool_]))),
            ),
            "float64": ("same", lambda a, r, d: a.astype(np.float64)),
            "NaN/inf": (
                "any",
                lambda a, r, d: np.where(
                    np.arange(a.size).reshape(a.shape) == d(st.integers(0, a.size - 1)),
                    d(st.sampled_from([np.nan, np.inf, -np.inf])),
                    a,
                ).astype(a.dtype),
            ),
        }
        if spec == FIXED:
            mutations["last dim wrong"] = ("error", lambda a, r, d: np.concatenate([a, a], -1))
        return mutations
    return {
        "float": ("error", lambda a, r, d: a.astype(np.float32) + d(st.sampled_from([0.0, 0.5]))),
        "past int32": ("error", lambda a, r, d: a + d(st.sampled_from([2**32, 2**33]))),
        "index == rows": ("error", lambda a, r, d: np.where(a == a.max(), r, a)),
        "index < -1": ("error", lambda a, r, d: np.where(a == a.max(), -2, a)),
        "one dim more": ("error", lambda a, r, d: a[..., None]),
        "int32": ("same", lambda a, r, d: a.astype(np.int32)),
    }


def _other_cases():
    for entry, (_, specs, _, _) in OTHER.items():
        if torch is None and entry.startswith("torch"):
            continue  # torch is not installed
        for arg, rows in specs.items():
            for m in _other_mutations(rows):
                marks = []
                if (entry, f"{arg} {m}") in KNOWN:
                    marks.append(pytest.mark.xfail(reason=KNOWN[(entry, f"{arg} {m}")],
                                                   strict=True))  # fmt: skip
                yield pytest.param(entry, arg, m, marks=marks, id=f"{entry}-{arg} {m}")


@pytest.mark.parametrize(("entry", "arg", "mutation"), list(_other_cases()))
@FUZZ
@given(data=st.data())
def test_other_entry_points_refuse_or_compute_correctly(entry, arg, mutation, data):
    """Interpolation and texture constructors, Warp and torch: one argument broken."""
    valid, specs, call, reference = OTHER[entry]
    expected, mutate = _other_mutations(specs[arg])[mutation]
    expected = EXPECTED.get((entry, arg, mutation), expected)
    args = {k: v.copy() for k, v in valid.items()}
    args[arg] = mutate(args[arg], specs[arg], data.draw)
    try:
        out = call(args)
    except (TypeError, ValueError) as e:
        assert expected != "same", f"a valid input was refused: {e!r}"
        assert arg in str(e), f"the error does not name {arg}: {e!r}"
        return
    assert expected != "error", "accepted without an error"
    finite = all(np.isfinite(v).all() for v in args.values() if v.dtype.kind == "f")
    if finite:
        for name, v in out.items():
            assert np.isfinite(v).all(), f"{name} has non-finite values"
    if reference is not None and expected in ("same", "either"):
        want = reference(args)
        for name, v in out.items():
            # float32 sums of three products against a float64 reference
            np.testing.assert_allclose(v, want[name], rtol=1e-6, atol=1e-6, err_msg=name)


# ----------------------------------------------------------------------------- CameraSensor
def _sensor(vertices, faces, **options):
    from warpraster.sim import CameraSensor, SensorGeometry

    geometry = SensorGeometry()
    geometry.add_static_mesh(vertices, faces)
    return CameraSensor(geometry, device="cpu", **options)


# mutation -> (argument the error must name, vertices, faces, sensor options)
SENSOR = {
    "vertices NaN/inf": (
        "vertex positions|vertices",
        lambda v, d: np.where(
            np.arange(v.size).reshape(v.shape) == d(st.integers(0, v.size - 1)),
            d(st.sampled_from([np.nan, np.inf])),
            v,
        ),
        None,
        {},
    ),
    "faces out of range": ("faces", None, lambda f, d: f + d(st.sampled_from([9, -9])), {}),
    "faces float": ("faces", None, lambda f, d: f.astype(np.float32), {}),
    "faces wrong shape": ("faces", None, lambda f, d: f[:, :2], {}),
    "image_size < 1": ("image_size", None, None, {"image_size": 0}),
    "world_count < 1": ("world_count", None, None, {"world_count": 0}),
    "camera_count < 1": ("camera_count", None, None, {"camera_count": -1}),
    "silhouette_sigma negative or NaN": (
        "silhouette_sigma",
        None,
        None,
        {"silhouette_sigma": float("nan")},
    ),
    "light_intensity NaN": ("light_intensity", None, None, {"light_intensity": float("nan")}),
}


@pytest.mark.parametrize(
    "mutation",
    [pytest.param(m, marks=[pytest.mark.xfail(reason=KNOWN[("CameraSensor", m)], strict=True)]
                  if ("CameraSensor", m) in KNOWN else [], id=f"CameraSensor-{m}")
     for m in SENSOR],
)  # fmt: skip
@FUZZ
@given(data=st.data())
def test_camera_sensor_construction_refuses_bad_input(mutation, data):
    """CameraSensor (and the SensorGeometry it packs): one argument broken, a clear
    error naming it."""
    name, verts, faces, options = SENSOR[mutation]
    options = dict(options)
    v = VERTS.astype(np.float64) if verts is None else verts(VERTS.astype(np.float64), data.draw)
    f = FACES if faces is None else faces(FACES, data.draw)
    with pytest.raises((TypeError, ValueError), match=name):
        _sensor(v, f, image_size=options.pop("image_size", SIZE), **options)
