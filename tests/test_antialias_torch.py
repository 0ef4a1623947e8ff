"""warpraster.torch.antialias: the custom op against the Warp op and nvdiffrast's
reference numbers, under autograd and torch.compile, with input checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp
from test_antialias import CASES, load, nvdr_ids

import warpraster as wr
import warpraster.torch as wrt


def _tensors(case):
    color = torch.tensor(case["color"], requires_grad=True)
    verts = torch.tensor(case["verts_ndc"], requires_grad=True)
    return color, torch.tensor(nvdr_ids(case)), verts, torch.tensor(case["faces_packed"])


@pytest.mark.parametrize("name", CASES)
def test_torch_op_matches_nvdiffrast(name):
    """Forward and gradients against nvdiffrast's (tolerances as in
    tests/test_antialias.py: float32 rounding and atomic order there, values up
    to ~3 for images, ~150 for vertex gradients: 1e-5 and 2e-4)."""
    case = load(name)
    color, p2f, verts, faces = _tensors(case)
    aa = wrt.antialias(color, p2f.long(), verts, faces.long())  # int64 indices, as PyTorch3D
    (aa * torch.tensor(case["grad_aa"])).sum().backward()
    np.testing.assert_allclose(aa.detach().numpy(), case["aa"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(color.grad.numpy(), case["grad_color"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(verts.grad.numpy(), case["grad_verts_ndc"], rtol=0, atol=2e-4)


def test_torch_op_equals_warp_op_bit_for_bit():
    """The torch op is the Warp op on the same memory: same bits (deterministic)."""
    case = load("aa_p05_batch3_two_icos_24x40")
    color, p2f, verts, faces = _tensors(case)
    aa = wrt.antialias(color, p2f, verts, faces, deterministic=True)
    (aa * torch.tensor(case["grad_aa"])).sum().backward()
    c = wp.array(case["color"], dtype=wp.float32, requires_grad=True)
    v = wp.array(case["verts_ndc"], dtype=wp.vec3, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = wr.antialias(c, wp.array(nvdr_ids(case)), v, case["faces_packed"], deterministic=True)
    out.grad.assign(case["grad_aa"])
    tape.backward()
    np.testing.assert_array_equal(aa.detach().numpy(), out.numpy())
    np.testing.assert_array_equal(color.grad.numpy(), c.grad.numpy())
    np.testing.assert_array_equal(verts.grad.numpy(), v.grad.numpy())


def test_torch_op_under_compile_and_beside_an_open_tape():
    """torch.compile(fullgraph=True) gives the eager numbers; an open wp.Tape records
    none of the op's launches."""
    case = load("aa_p02_two_tris_occlusion_32")
    g = torch.tensor(case["grad_aa"])

    def loss(color, p2f, verts, faces):
        return (wrt.antialias(color, p2f, verts, faces) * g).sum()

    color, p2f, verts, faces = _tensors(case)
    loss(color, p2f, verts, faces).backward()
    eager = (color.grad.clone(), verts.grad.clone())
    color2, _, verts2, _ = _tensors(case)
    tape = wp.Tape()
    with tape:
        torch.compile(loss, fullgraph=True)(color2, p2f, verts2, faces).backward()
    assert len(tape.launches) == 0
    torch.testing.assert_close(color2.grad, eager[0], rtol=0, atol=0)
    torch.testing.assert_close(verts2.grad, eager[1], rtol=0, atol=0)


def test_torch_gradcheck_against_central_differences():
    """float64 central differences of sum(aa * g) in the vertices (x, y), face ids
    fixed, step 5e-5 NDC as in tests/test_antialias.py (no event within it on
    aa_p01; float32 image rounding ~1e-6 in the loss over 1e-4: atol 2e-2;
    the 1/(dy + 1e-3 px) guard: rtol 2e-3)."""
    case = load("aa_p01_tri_16")
    color, p2f, verts, faces = _tensors(case)
    g = torch.tensor(case["grad_aa"], dtype=torch.float64)
    (wrt.antialias(color, p2f, verts, faces).double() * g).sum().backward()
    base = torch.tensor(case["verts_ndc"], dtype=torch.float64)
    h = 5e-5
    fd = torch.zeros_like(base)
    with torch.no_grad():
        for i in range(base.shape[0]):
            for k in range(2):
                vp, vm = base.clone(), base.clone()
                vp[i, k] += h
                vm[i, k] -= h
                lp = (wrt.antialias(color, p2f, vp, faces).double() * g).sum()
                lm = (wrt.antialias(color, p2f, vm, faces).double() * g).sum()
                fd[i, k] = (lp - lm) / (2 * h)
    assert fd.abs().max() > 1.0
    torch.testing.assert_close(verts.grad.double(), fd, rtol=2e-3, atol=2e-2)


def test_torch_bad_input_names_the_argument():
    case = load("aa_p01_tri_16")
    color, p2f, verts, faces = _tensors(case)
    with pytest.raises(TypeError, match="color"):
        wrt.antialias(color.long(), p2f, verts, faces)
    with pytest.raises(ValueError, match="pix_to_face"):
        wrt.antialias(color, p2f.expand(1, 16, 16, 2), verts, faces)
    with pytest.raises(ValueError, match="pix_to_face"):
        wrt.antialias(color, p2f + 5, verts, faces)
    with pytest.raises(ValueError, match="faces"):
        wrt.antialias(color, p2f, verts, faces + 3)
    with pytest.raises(ValueError, match="verts_ndc"):
        wrt.antialias(color, p2f, verts[:, :2], faces)


def test_the_topology_is_built_once_per_faces_tensor(monkeypatch):
    """The edge topology of a faces tensor is built on the first call (a host pass,
    as nvdiffrast's topology hash for static faces) and kept: repeated calls, their
    backwards and int64 faces build none; faces changed in place build anew and the
    result follows them. Truth for the values: the Warp op on the same inputs, with
    its topology built from the faces each time, bit for bit."""
    import importlib

    tmod = importlib.import_module("warpraster.torch.antialias")  # (the name is the function)

    case = load("aa_p05_batch3_two_icos_24x40")
    built = []
    real = tmod.AntialiasTopology
    monkeypatch.setattr(tmod, "AntialiasTopology", lambda *a: (built.append(1), real(*a))[1])

    def step(faces, color_np, verts_np):
        color = torch.tensor(color_np, requires_grad=True)
        verts = torch.tensor(verts_np, requires_grad=True)
        aa = wrt.antialias(color, torch.tensor(nvdr_ids(case)), verts, faces, deterministic=True)
        (aa * torch.tensor(case["grad_aa"])).sum().backward()
        return aa.detach().numpy(), color.grad.numpy(), verts.grad.numpy()

    def warp_step(faces_np, color_np, verts_np):
        c = wp.array(color_np, dtype=wp.float32, requires_grad=True)
        v = wp.array(verts_np, dtype=wp.vec3, requires_grad=True)
        tape = wp.Tape()
        with tape:
            out = wr.antialias(c, wp.array(nvdr_ids(case)), v, faces_np, deterministic=True)
        out.grad.assign(case["grad_aa"])
        tape.backward()
        return out.numpy(), c.grad.numpy(), v.grad.numpy()

    faces = torch.tensor(case["faces_packed"].astype(np.int64))  # converted, and kept
    rng = np.random.default_rng(0)
    for i in range(3):
        color_np = (case["color"] * (1.0 - 0.1 * i)).astype(np.float32)
        verts_np = (case["verts_ndc"] + rng.normal(0, 1e-3, case["verts_ndc"].shape)).astype(
            np.float32
        )
        got = step(faces, color_np, verts_np)
        want = warp_step(case["faces_packed"], color_np, verts_np)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    assert len(built) == 1  # three forwards and three backwards: one build
    forwards = []
    real_forward = wr.Antialias._forward

    def counted(self, *a):
        forwards.append(1)
        return real_forward(self, *a)

    monkeypatch.setattr(wr.Antialias, "_forward", counted)
    step(faces, case["color"], case["verts_ndc"])
    assert len(forwards) == 1  # the backward runs the adjoint alone, from saved records
    with torch.no_grad():
        faces[:, [1, 2]] = faces[:, [2, 1]].clone()  # in place: every face flipped
    got = step(faces, case["color"], case["verts_ndc"])
    want = warp_step(faces.numpy().astype(np.int32), case["color"], case["verts_ndc"])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(built) == 2


def test_kept_objects_serve_threads_one_call_at_a_time(monkeypatch):
    """The op keeps one Antialias object per (topology, shape, ...), and one call at a
    time uses its buffers (the device lock of the ops' stream scope): four threads,
    each running forward + backward on inputs of its own, give what the same calls
    give one after another, bit for bit. (Each adjoint first sleeps a millisecond, so
    that unserialised another thread's forward would overwrite the pair records it is
    about to read.)"""
    import threading
    import time

    real = wr.Antialias._backward

    def slow_backward(self, *args):
        time.sleep(1e-3)
        return real(self, *args)

    case = load("aa_p05_batch3_two_icos_24x40")
    faces = torch.tensor(case["faces_packed"])
    p2f = torch.tensor(nvdr_ids(case))
    rng = np.random.default_rng(5)
    inputs = [(rng.uniform(0, 1, case["color"].shape).astype(np.float32),
               (case["verts_ndc"] + rng.normal(0, 2e-3, case["verts_ndc"].shape)).astype(
                   np.float32)) for _ in range(4)]  # fmt: skip

    def run(i):
        color = torch.tensor(inputs[i][0], requires_grad=True)
        verts = torch.tensor(inputs[i][1], requires_grad=True)
        aa = wrt.antialias(color, p2f, verts, faces)
        (aa * torch.tensor(case["grad_aa"])).sum().backward()
        return aa.detach(), color.grad, verts.grad

    want = [run(i) for i in range(4)]
    got = [None] * 4
    monkeypatch.setattr(wr.Antialias, "_backward", slow_backward)

    errors = []

    def worker(i):
        try:
            for _ in range(3):
                got[i] = run(i)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for w, g in zip(want, got, strict=True):
        for a, b in zip(w, g, strict=True):
            assert torch.equal(a, b)


def test_custom_ops_pass_opcheck():
    """Schema, autograd registration and fake kernels of the forward op (its pair
    records out when ``record``) and of its backward (the adjoint from those records)."""
    import importlib

    tmod = importlib.import_module("warpraster.torch.antialias")
    case = load("aa_p02_two_tris_occlusion_32")
    color = torch.tensor(case["color"], requires_grad=True)
    verts = torch.tensor(case["verts_ndc"], requires_grad=True)
    p2f = torch.tensor(nvdr_ids(case))
    faces = torch.tensor(case["faces_packed"].astype(np.int32))
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    for record in (False, True):
        args = (color, p2f, verts, faces, None, False, record)
        torch.library.opcheck(tmod._antialias_op, args, test_utils=utils)
    out, alpha, code = tmod._antialias_op(color.detach(), p2f, verts.detach(), faces, None, False,
                                          True)  # fmt: skip
    assert alpha.shape == (*color.shape[:3], 2) and (code >= 0).any()
    g = torch.tensor(case["grad_aa"])
    back = (g, alpha, code, color.detach(), p2f, verts.detach(), faces, None, False, True)
    torch.library.opcheck(
        tmod._antialias_backward_op, back, test_utils=("test_schema", "test_faketensor")
    )
