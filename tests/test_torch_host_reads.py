"""Host reads of the functional torch ops (warpraster.torch.ops, normals, uv_sampling,
antialias): an index tensor's range is read back once per unchanged tensor.

The ops check their index tensors (faces, faces_uvs, ndc_faces, pix_to_face) from
each tensor's (min, max), read back to the host once and kept while the same tensor
object is passed unchanged (torch's version counter): a repeated call with the same
index tensors reads nothing (on CUDA, each read waits for the device). A fresh
``pix_to_face`` (a rasterizer's output, every call) is read once -- one transfer
of two scalars -- however many ops it feeds. Counted here: every torch host read a
Python check could make (``tolist``, ``item``, ``cpu``, ``numpy``, ``int()``,
``float()``, ``bool()``, ``index``), Warp's ``array.numpy`` and the bounds reads
of ``checks._read_bounds``; bad indices still raise, naming the argument, before
any kernel, also after an in-place change of a tensor that passed before.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import warp as wp

import warpraster.torch as wrt
from warpraster.torch import checks, ops

_READS = ("tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


@contextlib.contextmanager
def _count_reads(monkeypatch):
    """Counts, inside the block, the host reads of torch tensors and Warp arrays and
    the bounds reads of the checks into the yielded dict (keys: "torch", "warp",
    "bounds"); the patches are undone on exit."""
    calls = {"torch": 0, "warp": 0, "bounds": 0}

    def counting(real, what):
        def wrapper(*args, **kwargs):
            calls[what] += 1
            return real(*args, **kwargs)

        return wrapper

    with monkeypatch.context() as m:
        for name in _READS:
            m.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name), "torch"))
        m.setattr(wp.array, "numpy", counting(wp.array.numpy, "warp"))
        m.setattr(checks, "_read_bounds", counting(checks._read_bounds, "bounds"))
        yield calls


def _fragments(n=1, h=4, w=5, k=2, num_faces=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p2f = torch.randint(0, num_faces, (n, h, w, k), generator=gen)
    p2f[torch.rand((n, h, w, k), generator=gen) < 0.3] = -1
    bary = torch.rand((n, h, w, k, 3), generator=gen)
    return p2f, bary / bary.sum(-1, keepdim=True)


def _mesh(seed=1):
    gen = torch.Generator().manual_seed(seed)
    verts = torch.rand((6, 3), generator=gen, requires_grad=True)
    faces = torch.tensor([[0, 1, 2], [1, 3, 2], [2, 3, 4], [3, 5, 4]])
    return verts, faces


def _calls(t=None):
    """Each op as ``{name: call(p2f, bary)}`` over fixed index tensors (int64 as
    PyTorch3D's, and int32), with inputs requiring gradients; ``t``: a dict filled
    with those tensors."""
    t = {} if t is None else t
    _, t["faces"] = _mesh()
    t["attrs"] = torch.rand((6, 2), requires_grad=True)
    t["face_attrs"] = torch.rand((4, 3, 2), requires_grad=True)
    t["ndc"] = torch.rand((6, 3), requires_grad=True)
    t["ndc_faces"] = t["faces"].flip(1).to(torch.int32)
    t["maps"] = torch.rand((1, 3, 3, 2), requires_grad=True)
    t["uvs"] = torch.rand((5, 2), requires_grad=True)
    t["faces_uvs"] = torch.tensor([[0, 1, 2], [1, 3, 2], [2, 3, 4], [0, 4, 1]], dtype=torch.int32)
    return {
        "interpolate_face_attributes": lambda p, b: ops.interpolate_face_attributes(
            p, b, t["face_attrs"]
        ),
        "interpolate_vertex_attributes": lambda p, b: ops.interpolate_vertex_attributes(
            p, b, t["attrs"], t["faces"], verts_ndc=t["ndc"], ndc_faces=t["ndc_faces"]
        )[0],
        "sample_textures_uv": lambda p, b: ops.sample_textures_uv(
            p, b, t["maps"], t["faces_uvs"], t["uvs"]
        ),
    }


@pytest.mark.parametrize("name", sorted(_calls()))
def test_a_repeated_call_reads_only_a_fresh_pix_to_face(monkeypatch, name):
    """Second calls with the same index tensors: forward + backward read nothing
    back with the same pix_to_face, and only its bounds (one read) with a fresh one."""
    call = _calls()[name]
    p2f, bary = _fragments()
    want = call(p2f, bary)
    want.sum().backward()  # the first call: reads (each index tensor once)
    with _count_reads(monkeypatch) as calls:
        out = call(p2f, bary)
        out.sum().backward()
    assert calls == {"torch": 0, "warp": 0, "bounds": 0}
    assert torch.equal(out, want)
    fresh = p2f.clone()  # a new rasterization's pix_to_face
    with _count_reads(monkeypatch) as calls:
        out = call(fresh, bary)
        out.sum().backward()
    assert calls == {"torch": 1, "warp": 0, "bounds": 1}  # its (min, max): one tolist
    assert torch.equal(out, want)


def test_normals_repeated_calls_read_nothing(monkeypatch):
    verts, faces = _mesh()
    for fn in (ops.face_normals, ops.vertex_normals):
        want = fn(verts, faces)
        want.sum().backward()
        with _count_reads(monkeypatch) as calls:
            out = fn(verts, faces)
            out.sum().backward()
        assert calls == {"torch": 0, "warp": 0, "bounds": 0}, fn.__name__
        assert torch.equal(out, want)


def _aa_inputs():
    verts, faces = _mesh()
    gen = torch.Generator().manual_seed(3)
    p2f = torch.randint(-1, 4, (1, 6, 7, 1), generator=gen)
    color = torch.rand((1, 6, 7, 3), generator=gen, requires_grad=True)
    ndc = (torch.rand((6, 3), generator=gen) * 2 - 1).requires_grad_(True)
    return color, p2f, ndc, faces


def test_antialias_repeated_calls_read_only_a_fresh_pix_to_face(monkeypatch):
    color, p2f, ndc, faces = _aa_inputs()
    want = wrt.antialias(color, p2f, ndc, faces)
    want.sum().backward()
    with _count_reads(monkeypatch) as calls:
        out = wrt.antialias(color, p2f, ndc, faces)
        out.sum().backward()
    assert calls == {"torch": 0, "warp": 0, "bounds": 0}
    assert torch.equal(out, want)
    with _count_reads(monkeypatch) as calls:
        out = wrt.antialias(color, p2f.clone(), ndc, faces)
    assert calls == {"torch": 1, "warp": 0, "bounds": 1}
    assert torch.equal(out, want)


def test_one_pix_to_face_feeding_several_ops_is_read_once(monkeypatch):
    """One rasterization's fragments through interpolation, texturing and
    antialiasing: its pix_to_face bounds read once for all of them."""
    calls_by_name = _calls()
    color, _, ndc, faces = _aa_inputs()
    p2f, bary = _fragments(h=6, w=7, k=1)
    for call in calls_by_name.values():  # the index tensors' first reads
        call(p2f.clone(), bary)
    wrt.antialias(color, p2f.clone(), ndc, faces)
    with _count_reads(monkeypatch) as calls:
        for call in calls_by_name.values():
            call(p2f, bary)
        wrt.antialias(color, p2f, ndc, faces)
    assert calls == {"torch": 1, "warp": 0, "bounds": 1}


def test_another_tensor_object_on_the_same_memory_is_read():
    """The kept bounds belong to the very tensor object: a view or ``detach()`` of it
    (same memory, shape and version counter) is read again, not trusted."""
    _, faces = _mesh()
    verts = torch.rand((6, 3))
    ops.face_normals(verts, faces)
    reads = []
    real = checks._read_bounds
    try:
        checks._read_bounds = lambda t: reads.append(1) or real(t)
        ops.face_normals(verts, faces)
        assert not reads
        ops.face_normals(verts, faces.detach())
        assert len(reads) == 1
    finally:
        checks._read_bounds = real


# ============================================================================= bad input
def test_faces_changed_in_place_are_checked_again():
    """Index tensors that passed, then changed in place (their version bumps): the
    next call raises, naming the argument; set right again, it runs."""
    t = {}
    calls = _calls(t)
    p2f, bary = _fragments()
    verts, faces = _mesh()
    for fn in (ops.face_normals, ops.vertex_normals):
        fn(verts, faces)
        faces[1, 2] = 6
        with pytest.raises(ValueError, match=r"faces has indices in \[0, 6\], outside \[0, 5\]"):
            fn(verts, faces)
        faces[1, 2] = 2
        fn(verts, faces)
    faces_v, ndc_faces, faces_uvs = t["faces"], t["ndc_faces"], t["faces_uvs"]
    for call in calls.values():
        call(p2f, bary)
    faces_v[0, 0] = -1
    with pytest.raises(ValueError, match=r"faces has indices in \[-1, 5\]"):
        calls["interpolate_vertex_attributes"](p2f, bary)
    faces_v[0, 0] = 0
    ndc_faces[2, 1] = 6
    with pytest.raises(ValueError, match=r"ndc_faces has indices .* vertices in verts_ndc"):
        calls["interpolate_vertex_attributes"](p2f, bary)
    ndc_faces[2, 1] = 3
    faces_uvs[3, 2] = 5
    with pytest.raises(ValueError, match=r"faces_uvs has indices in \[0, 5\], outside \[0, 4\]"):
        calls["sample_textures_uv"](p2f, bary)
    faces_uvs[3, 2] = 1
    for call in calls.values():
        call(p2f, bary)


@pytest.mark.parametrize("name", sorted(_calls()))
def test_pix_to_face_changed_in_place_is_checked_again(name):
    call = _calls()[name]
    p2f, bary = _fragments()
    call(p2f, bary)
    p2f[0, 1, 1, 0] = 4  # 4 faces
    with pytest.raises(ValueError, match="pix_to_face holds face 4, but .* has 4 faces"):
        call(p2f, bary)
    p2f[0, 1, 1, 0] = -1
    call(p2f, bary)


def test_antialias_indices_changed_in_place_are_checked_again():
    color, p2f, ndc, faces = _aa_inputs()
    wrt.antialias(color, p2f, ndc, faces)
    p2f[0, 2, 3, 0] = -2
    with pytest.raises(ValueError, match=r"pix_to_face has face ids in \[-2, "):
        wrt.antialias(color, p2f, ndc, faces)
    p2f[0, 2, 3, 0] = 4
    with pytest.raises(ValueError, match=r"pix_to_face has face ids in \[0, 4\]"):
        wrt.antialias(color, p2f, ndc, faces)
    p2f[0, 2, 3, 0] = 0
    faces[0, 0] = 6
    with pytest.raises(ValueError, match=r"faces has vertex indices in \[1, 6\]"):
        wrt.antialias(color, p2f, ndc, faces)
    faces[0, 0] = 0
    wrt.antialias(color, p2f, ndc, faces)


def test_bounds_kept_from_before_an_unseen_write_never_fail_a_good_tensor():
    """A write torch does not count (a Warp kernel into the tensor's memory) leaves
    stale bounds kept: when they fail a check, the tensor is read again first."""
    p2f, bary = _fragments(num_faces=4)
    ops.interpolate_face_attributes(p2f, bary, torch.rand((4, 3, 2)))
    version = p2f._version
    wp.from_torch(p2f, dtype=wp.int64).fill_(0)  # bypasses torch's version counter
    assert p2f._version == version
    out = ops.interpolate_face_attributes(p2f, bary, torch.rand((1, 3, 2)))
    assert out.shape == (*p2f.shape, 2)


def test_inference_tensors_are_checked_every_call(monkeypatch):
    """Inference tensors have no version counter: nothing kept, read every call."""
    verts, faces = _mesh()
    with torch.inference_mode():
        faces = faces.clone()
        verts = verts.detach().clone()
        ops.face_normals(verts, faces)
        with _count_reads(monkeypatch) as calls:
            ops.face_normals(verts, faces)
        assert calls["bounds"] == 1
        faces[0, 0] = 9
        with pytest.raises(ValueError, match="faces has indices"):
            ops.face_normals(verts, faces)
