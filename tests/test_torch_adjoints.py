"""The functional torch ops' backwards run the Warp adjoints alone (no forward again).

Truth: what the backwards did before, a ``wp.Tape`` replay of the Warp forward on
the saved inputs with the upstream gradient seeded (:func:`_tape_grads`). Every op
(both interpolations, with and without derivatives, both normals, UV sampling in
every padding / alignment / sampling mode, one map or one per image) gives the
same gradients bit for bit on the cpu device (the same adjoint launches, which add
in order there), in the eager path and as the custom op; inputs that need no
gradient get none (None, and the op skips them). A wrapper around ``wp.launch``
counts that a backward launches no forward kernel. The Warp-side adjoint entries
are compared with a tape the same way (the vertex normals' with corner lists too).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp

import warpraster.shading as ws
from warpraster.shading.corner_lists import CornerLists
from warpraster.shading.interpolate import vector_type
from warpraster.shading.normals import vertex_normals_adjoint
from warpraster.torch import ops
from warpraster.torch.eager import EagerOp


# ----------------------------------------------------------------------------- cases
def _fragments(n=2, h=5, w=6, k=2, num_faces=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p2f = torch.randint(0, num_faces, (n, h, w, k), generator=gen, dtype=torch.int32)
    p2f[torch.rand((n, h, w, k), generator=gen) < 0.3] = -1
    bary = torch.rand((n, h, w, k, 3), generator=gen)
    return p2f, bary / bary.sum(-1, keepdim=True), gen


def _big_triangles(num_faces, gen):
    """Projected faces that each cover the screen, z in [1, 2] (derivatives defined)."""
    base = torch.tensor([[-4.0, -4.0], [8.0, -4.0], [-4.0, 8.0]])
    xy = base + 0.5 * torch.rand((num_faces, 3, 2), generator=gen)
    z = 1.0 + torch.rand((num_faces, 3, 1), generator=gen)
    return torch.cat([xy, z], -1).reshape(-1, 3)


def _face_case(d):
    p2f, bary, gen = _fragments()
    attrs = torch.randn((7, 3, d), generator=gen)
    return {"p2f": p2f, "bary": bary, "attrs": attrs}, ("bary", "attrs"), gen


def _vert_case(with_ndc, own_ndc_faces, perspective):
    p2f, bary, gen = _fragments(seed=1)
    case = {"p2f": p2f, "bary": bary, "attrs": torch.randn((9, 2), generator=gen),
            "faces": torch.randint(0, 9, (7, 3), generator=gen, dtype=torch.int32),
            "perspective": perspective}  # fmt: skip
    wants = ["bary", "attrs"]
    if with_ndc:
        if own_ndc_faces:
            case["ndc"] = _big_triangles(7, gen)
            case["ndc_faces"] = torch.arange(21, dtype=torch.int32).reshape(7, 3).flip(0)
            case["ndc_faces"] = case["ndc_faces"].contiguous()
        else:  # the same faces index verts_ndc: 9 screen-covering vertices
            # (the random faces include a degenerate one, [2, 4, 4], whose 1/EPS
            # screen derivatives make the attribute gradient's float sum depend on
            # its order: bit for bit here, where both sides add in the same order;
            # on a GPU the atomics' order moves it by tens of percent, the tape
            # replay's as much as the adjoint's)
            case["ndc"] = _big_triangles(3, gen)
        wants.append("ndc")
    return case, tuple(wants), gen


def _uv_case(padding, align, sampling, num_maps):
    p2f, bary, gen = _fragments(seed=2)
    case = {"p2f": p2f, "bary": bary, "maps": torch.rand((num_maps, 5, 8, 3), generator=gen),
            "faces": torch.randint(0, 9, (7, 3), generator=gen, dtype=torch.int32),
            "uvs": torch.rand((9, 2), generator=gen) * 1.6 - 0.3,  # some outside [0, 1]
            "options": (padding, align, sampling)}  # fmt: skip
    return case, ("bary", "maps", "uvs"), gen


def _mesh_case():
    gen = torch.Generator().manual_seed(3)
    verts = torch.randn((10, 3), generator=gen)
    faces = torch.randint(0, 9, (12, 3), generator=gen, dtype=torch.int32)  # vertex 9: none
    faces[-1] = torch.tensor([faces[0, 0], faces[0, 1], faces[0, 0]])  # degenerate
    return verts, faces, gen


# ----------------------------------------------------------------------------- the truth
def _wp(t, dtype, grad=None):
    if grad is None:
        return wp.from_torch(t, dtype=dtype)
    return wp.from_torch(t, dtype=dtype, requires_grad=True, grad=grad)


def _seeded(up, dtype):
    """A result for the tape: its gradient buffer a copy of ``up`` (the tape zeroes it)."""
    return _wp(torch.empty_like(up), dtype, up.clone())


def _tape_grads(op, case, ups):
    """{name: gradient} of ``op``'s float inputs: the Warp forward replayed on a tape on
    the float32 inputs, seeded with ``ups`` (the backward the ops had before)."""
    grads = {}

    def leaf(name, dtype):
        grads[name] = torch.zeros_like(case[name])
        return _wp(case[name], dtype, grads[name])

    tape = wp.Tape()
    if op == "face":
        vt = vector_type(case["attrs"].shape[2])
        out = _seeded(ups[0], vt)
        with tape:
            ws.interpolate_face_attributes(_wp(case["p2f"], wp.int32), leaf("bary", wp.vec3),
                                           leaf("attrs", wp.float32), out=out)  # fmt: skip
    elif op == "vert":
        vt = vector_type(case["attrs"].shape[1])
        kw = {}
        if "ndc" in case:
            nf = case.get("ndc_faces")
            kw = dict(verts_ndc=leaf("ndc", wp.vec3),
                      ndc_faces=None if nf is None else _wp(nf, wp.int32),
                      out_dx=_seeded(ups[1], vt), out_dy=_seeded(ups[2], vt))  # fmt: skip
        with tape:
            ws.interpolate_vertex_attributes(
                _wp(case["p2f"], wp.int32), leaf("bary", wp.vec3), leaf("attrs", wp.float32),
                _wp(case["faces"], wp.int32), perspective_correct=case["perspective"],
                out=_seeded(ups[0], vt), **kw,
            )  # fmt: skip
    elif op == "uv":
        padding, align, sampling = case["options"]
        tex = ws.TexturesUV(leaf("maps", wp.float32), _wp(case["faces"], wp.int32),
                            leaf("uvs", wp.float32), padding_mode=padding, align_corners=align,
                            sampling_mode=sampling)  # fmt: skip
        out = _seeded(ups[0], vector_type(case["maps"].shape[3]))
        with tape:
            tex.sample_textures((_wp(case["p2f"], wp.int32), leaf("bary", wp.vec3)), out=out)
    else:  # face / vertex normals
        fn = ws.face_normals if op == "face_normals" else ws.vertex_normals
        out = _seeded(ups[0], wp.vec3)
        with tape:
            fn(leaf("verts", wp.vec3), _wp(case["faces"], wp.int32), out=out)
    tape.backward()
    return grads


def _torch_outputs(op, case, leaves):
    """The op's outputs on ``case`` with ``leaves`` (name -> tensor) in place."""
    c = {**case, **leaves}
    if op == "face":
        return (ops.interpolate_face_attributes(c["p2f"], c["bary"], c["attrs"]),)
    if op == "vert":
        out = ops.interpolate_vertex_attributes(
            c["p2f"], c["bary"], c["attrs"], c["faces"], verts_ndc=c.get("ndc"),
            ndc_faces=c.get("ndc_faces"), perspective_correct=c["perspective"],
        )  # fmt: skip
        return out if isinstance(out, tuple) else (out,)
    if op == "uv":
        padding, align, sampling = c["options"]
        return (ops.sample_textures_uv(c["p2f"], c["bary"], c["maps"], c["faces"], c["uvs"],
                                       padding_mode=padding, align_corners=align,
                                       sampling_mode=sampling),)  # fmt: skip
    return (getattr(ops, op)(c["verts"], c["faces"]),)


def _torch_grads(op, case, wants, ups):
    leaves = {name: case[name].clone().requires_grad_(True) for name in wants}
    outs = _torch_outputs(op, case, leaves)
    grads = torch.autograd.grad(outs, list(leaves.values()), grad_outputs=ups)
    return dict(zip(leaves, grads, strict=True))


def _ups(op, case, gen):
    """Upstream gradients of the op's outputs (random, some exactly zero)."""
    outs = _torch_outputs(op, case, {})
    ups = [torch.randn(o.shape, generator=gen) for o in outs]
    for u in ups:
        u.view(-1)[::5] = 0.0
    return ups


CASES = [("face", lambda: _face_case(3)), ("face", lambda: _face_case(5))]
CASES += [("vert", lambda a=a: _vert_case(*a))
          for a in [(False, False, True), (True, True, True), (True, False, False)]]  # fmt: skip
UV_OPTIONS = [("border", True, "bilinear", 2), ("reflection", False, "bilinear", 1),
              ("zeros", False, "bilinear", 2), ("border", False, "nearest", 2),
              ("reflection", True, "nearest", 1), ("zeros", True, "bilinear", 1)]  # fmt: skip
CASES += [("uv", lambda a=a: _uv_case(*a)) for a in UV_OPTIONS]
IDS = ["face-d3", "face-d5", "vert", "vert-ndc-own-faces", "vert-ndc-affine"]
IDS += [f"uv-{p}-{'align-' if a else ''}{s}-{n}" for p, a, s, n in UV_OPTIONS]


@pytest.mark.parametrize("force_custom_op", [False, True], ids=["eager", "custom-op"])
@pytest.mark.parametrize("op,make", CASES, ids=IDS)
def test_backward_equals_a_tape_replay_of_the_forward_bit_for_bit(op, make, force_custom_op,
                                                                  monkeypatch):  # fmt: skip
    monkeypatch.setattr(EagerOp, "force_custom_op", force_custom_op)
    case, wants, gen = make()
    ups = _ups(op, case, gen)
    want = _tape_grads(op, case, ups)
    got = _torch_grads(op, case, wants, ups)
    for name in wants:
        assert torch.equal(got[name], want[name]), name
    # gradients flowed (nearest sampling: to the maps only, piecewise constant elsewhere)
    assert all(float(got[n].abs().max()) > 0 for n in wants if n == "maps" or op != "uv"
               or case["options"][2] != "nearest")  # fmt: skip
    # One input at a time: the same gradient, the others not asked for.
    for name in wants:
        (g,) = _torch_grads(op, case, (name,), ups).values()
        assert torch.equal(g, want[name]), name


@pytest.mark.parametrize("force_custom_op", [False, True], ids=["eager", "custom-op"])
@pytest.mark.parametrize("op", ["face_normals", "vertex_normals"])
def test_normals_backward_equals_a_tape_replay_bit_for_bit(op, force_custom_op, monkeypatch):
    monkeypatch.setattr(EagerOp, "force_custom_op", force_custom_op)
    verts, faces, gen = _mesh_case()
    case = {"verts": verts, "faces": faces}
    ups = _ups(op, case, gen)
    want = _tape_grads(op, case, ups)["verts"]
    got = _torch_grads(op, case, ("verts",), ups)["verts"]
    assert torch.equal(got, want)
    assert float(got.abs().max()) > 0


def test_vertex_normals_adjoint_with_corner_lists_equals_the_tape():
    verts, faces, gen = _mesh_case()
    v = wp.from_torch(verts, dtype=wp.vec3, requires_grad=True)
    f = wp.from_torch(faces, dtype=wp.int32)
    lists = CornerLists(f, verts.shape[0])
    up = wp.from_torch(torch.randn((verts.shape[0], 3), generator=gen), dtype=wp.vec3)
    sums = wp.zeros(verts.shape[0], dtype=wp.vec3, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = ws.vertex_normals(v, f, sums_out=sums, corner_lists=lists)
    out.grad.assign(up)
    tape.backward()
    got = wp.zeros_like(v.grad)
    vertex_normals_adjoint(wp.from_torch(verts, dtype=wp.vec3), f, sums, up, got,
                           corner_lists=lists)  # fmt: skip
    assert np.array_equal(got.numpy(), v.grad.numpy())
    assert np.abs(got.numpy()).max() > 0


# ----------------------------------------------------------------------------- no forward
@pytest.mark.parametrize("force_custom_op", [False, True], ids=["eager", "custom-op"])
def test_backward_launches_no_forward_kernel(force_custom_op, monkeypatch):
    """Every op: the forward launches only forward kernels; the backward only adjoints."""
    monkeypatch.setattr(EagerOp, "force_custom_op", force_custom_op)
    launches = []
    launch = wp.launch

    def counting(kernel, *args, **kwargs):
        launches.append((kernel.key, bool(kwargs.get("adjoint", False))))
        return launch(kernel, *args, **kwargs)

    monkeypatch.setattr(wp, "launch", counting)
    verts, faces, _ = _mesh_case()
    cases = [(op, *make()) for op, make in CASES]
    cases += [(op, {"verts": verts, "faces": faces}, ("verts",), None)
              for op in ("face_normals", "vertex_normals")]  # fmt: skip
    for op, case, wants, _ in cases:
        leaves = {name: case[name].clone().requires_grad_(True) for name in wants}
        launches.clear()
        outs = _torch_outputs(op, case, leaves)
        forward = list(launches)
        assert forward and not any(adj for _, adj in forward), op
        launches.clear()
        loss = sum((o * torch.linspace(-1, 1, o.numel()).reshape(o.shape)).sum() for o in outs)
        loss.backward()
        assert launches and all(adj for _, adj in launches), (op, launches)
        # the adjoints of the forward's own kernels, each once
        assert sorted(launches) == sorted((key, True) for key, _ in forward), op
