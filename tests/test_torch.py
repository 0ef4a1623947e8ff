"""The torch adapter (``warpraster.torch``): parity with PyTorch3D, autograd, compile, errors.

Runs on CPU torch always, and on CUDA when both torch and Warp see a GPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import warp as wp  # noqa: E402
from conftest import DEVICES  # noqa: E402
from p3d_cases import (  # noqa: E402
    camera_case_names,
    case_params,
    load_case,
    raster_args,
    raw_case_names,
)

import warpraster.torch as wrt  # noqa: E402

_CPU_ONLY = pytest.mark.skipif(
    "cpu" not in DEVICES,
    reason="runs torch on the CPU; Warp's cpu device is not a test device here",
)


def _torch_devices() -> list[str]:
    """The Warp test devices (tests/conftest.py) as torch device names."""
    devs = []
    for d in DEVICES:
        if d == "cpu":
            devs.append("cpu")
        elif torch.cuda.is_available():
            devs.append("cuda")
    return devs


@pytest.fixture(params=_torch_devices())
def tdevice(request) -> str:
    """Each torch device the adapter can run on: ``cpu`` always, ``cuda`` when present."""
    return request.param


# ----------------------------------------------------------------------------- parity
def _case_call(case: dict, device: str):
    """(verts leaf tensor, positional packed tensors, keyword settings) of a case."""
    args = raster_args(case)
    verts = torch.tensor(args.pop("verts"), device=device, requires_grad=True)
    packed = [
        torch.tensor(args.pop(k), device=device)
        for k in ("faces", "mesh_to_face_first_idx", "num_faces_per_mesh")
    ]
    args.update(
        bin_size=case["bin_size"],
        max_faces_per_bin=case["max_faces_per_bin"],
        z_clip_value=case["z_clip_value"],
        cull_to_frustum=case["cull_to_frustum"],
        exact_perspective_grad=False,  # PyTorch3D's numbers (docs/BACKWARD.md)
    )
    return verts, packed, args


# Tolerances from the reference README. Float outputs on valid slots: 1e-5
# (float32 values of magnitude ~1 that differ by a few ulps at most; measured
# <= 4.8e-7). Vertex gradients: rtol 1e-4 / atol 1e-5, because the per-pixel
# contributions are summed in another order than PyTorch3D's sequential loop
# (measured worst case on CPU: 0.56 of that tolerance, p08 and p10).


@pytest.mark.parametrize("name", case_params(raw_case_names() + camera_case_names()))
def test_reference_case_matches_pytorch3d_forward_and_backward(name, tdevice):
    """p01-p09 raw; p10-p12 by the NDC route (p10 and p12 clip: replayed backward)."""
    case = load_case(name)
    verts, packed, args = _case_call(case, tdevice)

    pix_to_face, zbuf, bary, dists = wrt.rasterize_meshes(verts, *packed, **args)

    def ref(key):
        return torch.tensor(case[key], device=tdevice)

    n, h, w, k = case["pix_to_face"].shape
    assert pix_to_face.dtype == torch.int64 and pix_to_face.shape == (n, h, w, k)
    assert bary.shape == (n, h, w, k, 3)
    for t in (pix_to_face, zbuf, bary, dists):
        assert t.device == verts.device
    for t in (zbuf, bary, dists):
        assert t.dtype == torch.float32 and t.requires_grad
    assert torch.equal(pix_to_face, ref("pix_to_face"))
    valid = pix_to_face >= 0
    for got, key in ((zbuf, "zbuf"), (bary, "bary_coords"), (dists, "dists")):
        mask = valid.unsqueeze(-1).expand_as(got) if got.ndim == 5 else valid
        torch.testing.assert_close(got[mask], ref(key)[mask], rtol=1e-5, atol=1e-5)
        assert torch.all(got[~mask] == -1.0)

    # The README's loss, summed over every slot: the stored upstream gradients are
    # random at empty slots too, and must be ignored there.
    loss = (
        (zbuf * ref("grad_zbuf")).sum()
        + (bary * ref("grad_bary")).sum()
        + (dists * ref("grad_dists")).sum()
    )
    loss.backward()
    key = "grad_verts_ndc" if case["case_kind"] == "camera" else "grad_verts"
    torch.testing.assert_close(verts.grad, ref(key), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- zero-copy
def test_float32_inputs_and_float_outputs_share_memory_with_warp(monkeypatch, tdevice):
    """float32 vertices, int32 faces and zbuf/bary/dists cross without a copy."""
    seen = {}
    core = wrt.rasterize_packed

    def spy(meshes, *args, **kwargs):
        frags = core(meshes, *args, **kwargs)
        seen.update(verts=meshes.verts.ptr, faces=meshes.faces.ptr, frags=frags)
        return frags

    monkeypatch.setattr(wrt, "rasterize_packed", spy)
    verts, faces, first, count = _two_meshes(device=tdevice)
    faces32 = faces.to(torch.int32)
    pix_to_face, zbuf, bary, dists = wrt.rasterize_meshes(
        verts, faces32, first, count, image_size=8, faces_per_pixel=2
    )
    frags = seen["frags"]
    assert seen["verts"] == verts.data_ptr()
    assert seen["faces"] == faces32.data_ptr()
    assert zbuf.data_ptr() == frags.zbuf.ptr
    assert bary.data_ptr() == frags.bary_coords.ptr
    assert dists.data_ptr() == frags.dists.ptr
    # pix_to_face is PyTorch3D's int64: the one copy.
    assert pix_to_face.data_ptr() != frags.pix_to_face.ptr
    assert torch.equal(pix_to_face, wp.to_torch(frags.pix_to_face).to(torch.int64))


def test_outputs_carry_no_graph_without_requires_grad(tdevice):
    verts, faces, first, count = _two_meshes(device=tdevice)
    _, zbuf, bary, dists = wrt.rasterize_meshes(
        verts.detach(), faces, first, count, image_size=8, faces_per_pixel=2
    )
    assert not (zbuf.requires_grad or bary.requires_grad or dists.requires_grad)


def test_float64_vertices_run_in_float32_with_gradient_cast_back(tdevice):
    verts, faces, first, count = _two_meshes(device=tdevice)
    v32 = verts.detach().clone().requires_grad_(True)
    v64 = verts.detach().double().requires_grad_(True)
    kw = dict(image_size=8, faces_per_pixel=2, blur_radius=0.01)
    out32 = wrt.rasterize_meshes(v32, faces, first, count, **kw)
    out64 = wrt.rasterize_meshes(v64, faces, first, count, **kw)
    for a, b in zip(out32, out64, strict=True):
        assert torch.equal(a, b)  # the same float32 kernels on the same float32 values
    (out32[1].sum() + out32[3].sum()).backward()
    (out64[1].sum() + out64[3].sum()).backward()
    assert v64.grad.dtype == torch.float64
    # Equal on cpu; on cuda the atomic scatter order may change the last bits.
    torch.testing.assert_close(v64.grad, v32.grad.double(), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- gradients
def _two_meshes(dtype=torch.float32, device="cpu"):
    """Mesh 0: two triangles at separated depths (one behind the other); mesh 1: one.

    Depth ranges are [1.0, 1.2] and [2.0, 2.4]: no z ties to flip in a finite
    difference. x, y were picked so that every pixel centre of an 8 x 8 image is
    >= 9e-3 from every edge and from the blur_radius = 0.02 boundary (for the
    gradcheck). Returned faces are packed (global) int64.
    """
    verts = torch.tensor(
        [
            [0.59, -0.56, 1.0],
            [-0.43, -0.55, 1.1],
            [0.09, 0.65, 1.2],
            [0.29, 0.38, 2.0],
            [-0.66, 0.10, 2.4],
            [0.10, -0.71, 2.2],
            [0.49, 0.53, 1.5],
            [-0.56, 0.32, 1.3],
            [-0.03, -0.65, 1.7],
        ],
        dtype=dtype,
        device=device,
        requires_grad=True,
    )
    faces = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]], device=device)
    return verts, faces, torch.tensor([0, 2], device=device), torch.tensor([2, 1], device=device)


def _pixel_centres(h: int, w: int) -> np.ndarray:
    """(H*W, 2) NDC pixel centres, PyTorch3D's convention (square image here)."""
    assert h == w
    i = np.arange(h)
    c = -1.0 + (2.0 * (h - 1 - i) + 1.0) / h  # row 0 is +y, column 0 is +x
    y, x = np.meshgrid(c, c, indexing="ij")
    return np.stack([x.ravel(), y.ravel()], axis=1)


def _edge_margin(verts: np.ndarray, faces: np.ndarray, size: int, blur: float) -> float:
    """Smallest distance of any pixel centre to a face edge or to a blur boundary."""
    p = _pixel_centres(size, size)
    margin = math.inf
    for f in faces:
        tri = verts[f, :2]
        seg = np.inf * np.ones(len(p))
        for a, b in ((tri[0], tri[1]), (tri[1], tri[2]), (tri[2], tri[0])):
            e = b - a
            t = np.clip(((p - a) @ e) / (e @ e), 0.0, 1.0)
            seg = np.minimum(seg, np.linalg.norm(p - (a + t[:, None] * e), axis=1))
        margin = min(margin, seg.min(), np.abs(seg - math.sqrt(blur)).min())
    return margin


def test_gradcheck_tiny_scene_with_face_vertex_gather(tdevice):
    """Finite differences through the op and a PyTorch3D-style face_verts gather.

    The inputs are float64 but the kernels run in float32, so the tolerance is
    argued, not float64-tight. Outputs are O(1) and carry a few float32 ulps of
    rounding (~1e-6); a central difference with eps = 1e-3 turns that into
    ~1e-3 of noise in the numerical Jacobian, and its truncation error
    (eps**2 * f''' / 6 for these rational functions of the vertices) is ~1e-5.
    atol = rtol = 1e-2 leaves a 10x margin over the noise; a real gradient bug
    (a missing term, a wrong sign) is O(1). eps must not flip any discrete
    choice: moving one coordinate by eps moves an edge, and so a pixel's
    distance to it, by at most eps; every pixel centre is checked to stay more
    than 5 eps from every face edge and blur boundary, and the depth ranges of
    overlapping faces are 0.8 apart.
    """
    verts, faces, first, count = _two_meshes(torch.float64, tdevice)
    size, blur = 8, 0.02
    assert _edge_margin(verts.detach().cpu().numpy(), faces.cpu().numpy(), size, blur) > 5e-3
    attr = torch.linspace(0.5, 2.0, 27, dtype=torch.float64, device=tdevice).reshape(9, 3)

    def render(v):
        pix_to_face, zbuf, bary, dists = wrt.rasterize_meshes(
            v,
            faces,
            first,
            count,
            image_size=size,
            faces_per_pixel=2,
            blur_radius=blur,
            perspective_correct=True,
        )
        # Interpolate per-vertex values as PyTorch3D's interpolate_face_attributes
        # does: gather face_verts by pix_to_face, weight by the barycentrics. The
        # vertex positions themselves are one of the attributes, so gradients reach
        # v through the gather as well as through the op.
        face_vals = torch.cat([v, attr], dim=1)[faces]  # (F, 3, 6)
        gathered = face_vals[pix_to_face.clamp(min=0)]  # (N, H, W, K, 3, 6)
        pix = (bary.unsqueeze(-1).double() * gathered).sum(-2)
        pix = torch.where((pix_to_face >= 0).unsqueeze(-1), pix, 0.0)
        return zbuf, bary, dists, pix

    # nondet_tol: on cuda the backward's atomic adds may sum in another order.
    assert torch.autograd.gradcheck(
        render, (verts,), eps=1e-3, atol=1e-2, rtol=1e-2, nondet_tol=1e-5
    )


def test_mesh_list_packs_like_meshes_and_sends_gradients_to_each_tensor(tdevice):
    verts, faces, first, count = _two_meshes(device=tdevice)
    kw = dict(image_size=12, faces_per_pixel=2, blur_radius=0.01)
    packed = wrt.rasterize_meshes(verts, faces, first, count, **kw)
    (packed[1].sum() + packed[2].sum() + packed[3].sum()).backward()

    v0 = verts.detach()[:6].clone().requires_grad_(True)
    v1 = verts.detach()[6:].clone().double().requires_grad_(True)  # mixed dtypes are fine
    listed = wrt.rasterize_mesh_list([v0, v1], [faces[:2], (faces[2:] - 6).to(torch.int32)], **kw)
    for a, b in zip(packed, listed, strict=True):
        assert torch.equal(a, b)
    (listed[1].sum() + listed[2].sum() + listed[3].sum()).backward()
    # Equal on cpu; on cuda the atomic scatter order may change the last bits.
    torch.testing.assert_close(v0.grad, verts.grad[:6], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v1.grad, verts.grad[6:].double(), rtol=1e-6, atol=1e-6)


def test_mesh_list_with_an_empty_mesh(tdevice):
    verts, faces, _, _ = _two_meshes(device=tdevice)
    empty_v = torch.zeros(0, 3, device=tdevice)
    empty_f = torch.zeros(0, 3, dtype=torch.int64, device=tdevice)
    pix_to_face, zbuf, _, _ = wrt.rasterize_mesh_list(
        [verts[:3], empty_v, verts[6:]], [faces[:1], empty_f, faces[:1]], image_size=8
    )
    assert pix_to_face.shape == (3, 8, 8, 8)
    assert (pix_to_face[1] == -1).all()
    assert set(pix_to_face.unique().tolist()) == {-1, 0, 1}  # mesh 2's face is packed face 1
    zbuf[0].sum().backward()


@_CPU_ONLY
def test_training_loop_fits_a_silhouette():
    """Adam on a triangle's vertices against a soft silhouette (PyTorch3D's recipe).

    alpha = sigmoid(-dists / sigma) with blur_radius = log(1/1e-4 - 1) * sigma
    (alpha falls to 1e-4 at the blur edge). Measured: the loss falls ~27000x in
    100 steps and the vertices land within 2e-3 of the target; asserted: 100x and
    1e-2 (a tenth of a pixel is 6e-3 at this size: the fit is sub-pixel).
    """
    faces = torch.tensor([[0, 1, 2]])
    sigma = 2e-3
    blur = math.log(1.0 / 1e-4 - 1.0) * sigma

    def silhouette(v):
        pix_to_face, _, _, dists = wrt.rasterize_meshes(
            v, faces, [0], [1], image_size=32, faces_per_pixel=1, blur_radius=blur
        )
        return torch.where(pix_to_face >= 0, torch.sigmoid(-dists / sigma), 0.0)

    target_verts = torch.tensor([[0.5, -0.4, 1.0], [-0.5, -0.5, 1.0], [0.0, 0.6, 1.0]])
    target = silhouette(target_verts)
    verts = torch.tensor([[0.3, -0.2, 1.0], [-0.2, -0.3, 1.0], [0.1, 0.3, 1.0]])
    verts.requires_grad_(True)
    opt = torch.optim.Adam([verts], lr=0.01)
    losses = []
    for _ in range(100):
        opt.zero_grad()
        loss = ((silhouette(verts) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 100
    assert (verts.detach() - target_verts).abs().max() < 1e-2


@_CPU_ONLY
def test_custom_ops_pass_opcheck_and_backward_leaves_its_inputs_alone():
    """Schema, autograd registration and fake (meta) kernels of both custom ops.

    (opcheck's ``test_aot_dispatch_dynamic`` is left out: its harness sums the
    outputs into the first one, which is the integer ``pix_to_face``; the compile
    test below covers AOT dispatch.)
    """
    verts, faces, first, count = _two_meshes()
    # context first, then the settings scalars
    settings = (None, 8, 8, 0.02, 2, -1, -1, True, False, False, None, False, False)
    args = (verts.detach().requires_grad_(True), faces, first, count, None, *settings)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(wrt._rasterize_op, args, test_utils=utils)

    pix_to_face = wrt._rasterize_op(*args)[0]
    valid = pix_to_face >= 0
    gen = torch.Generator().manual_seed(0)
    grads = [
        torch.where(valid, torch.randn(valid.shape, generator=gen), 0.0),
        torch.where(valid[..., None], torch.randn((*valid.shape, 3), generator=gen), 0.0),
        torch.where(valid, torch.randn(valid.shape, generator=gen), 0.0),
    ]
    kept = [g.clone() for g in grads]
    bargs = (*grads, pix_to_face, verts.detach(), faces, first, count, None, *settings)
    torch.library.opcheck(wrt._rasterize_backward_op, bargs, test_utils=utils)
    first_call = wrt._rasterize_backward_op(*bargs)
    assert torch.equal(first_call, wrt._rasterize_backward_op(*bargs))
    for g, k in zip(grads, kept, strict=True):
        assert torch.equal(g, k)
    assert first_call.abs().sum() > 0


# ----------------------------------------------------------------------------- torch.compile
class _TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        verts, faces, first, count = _two_meshes()
        self.register_buffer("base", verts.detach())
        self.register_buffer("faces", faces)
        self.register_buffer("first", first)
        self.register_buffer("count", count)
        self.offset = torch.nn.Parameter(torch.zeros(9, 3))

    def forward(self):
        pix_to_face, zbuf, bary, dists = wrt.rasterize_meshes(
            self.base + self.offset,
            self.faces,
            self.first,
            self.count,
            image_size=8,
            faces_per_pixel=2,
            blur_radius=0.02,
        )
        valid = pix_to_face >= 0
        alpha = torch.where(valid, torch.sigmoid(-dists / 1e-2), 0.0)
        return (torch.where(valid, zbuf, 0.0) ** 2).sum() + alpha.sum() + (bary**2).sum()


@_CPU_ONLY
def test_torch_compile_fullgraph_matches_eager():
    """fullgraph=True fails on any graph break; the op is one opaque node."""
    model = _TinyModel()
    eager = model()
    eager.backward()
    grad_eager = model.offset.grad.clone()
    model.offset.grad = None

    compiled = torch.compile(model, fullgraph=True)
    loss = compiled()
    loss.backward()
    torch.testing.assert_close(loss, eager, rtol=0, atol=0)
    torch.testing.assert_close(model.offset.grad, grad_eager, rtol=1e-6, atol=1e-6)


def test_torch_func_transforms_raise_a_clear_error():
    verts, faces, first, count = _two_meshes()

    def total_depth(v):
        return wrt.rasterize_meshes(v, faces, first, count, image_size=8)[1].sum()

    with pytest.raises(RuntimeError, match="does not support torch.func transforms"):
        torch.func.vmap(total_depth)(verts.detach().expand(2, 9, 3))
    with pytest.raises(RuntimeError, match="use torch.autograd"):
        torch.func.grad(total_depth)(verts.detach())


# ----------------------------------------------------------------------------- errors
def _bad(**changes):
    verts, faces, first, count = _two_meshes()
    args = dict(
        verts_packed=verts,
        faces_packed=faces,
        mesh_to_face_first_idx=first,
        num_faces_per_mesh=count,
    )
    args.update(changes)
    return args


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        (dict(verts_packed=torch.zeros(9, 3, dtype=torch.int32)), TypeError, "verts_packed"),
        (dict(verts_packed=torch.zeros(9, 2)), ValueError, r"verts_packed .*\(V, 3\)"),
        (dict(verts_packed=[[0.0, 0.0, 1.0]]), TypeError, "verts_packed must be a torch.Tensor"),
        (dict(faces_packed=torch.zeros(3, 3)), TypeError, "faces_packed must be an integer"),
        (
            dict(faces_packed=torch.zeros(3, 3, requires_grad=True)),
            ValueError,
            "faces_packed must not require grad",
        ),
        (dict(faces_packed=torch.zeros(3, 4, dtype=torch.int64)), ValueError, r"\(F, 3\)"),
        (
            dict(faces_packed=torch.tensor([[0, 1, 2**31], [3, 4, 5], [6, 7, 8]])),
            ValueError,
            "faces_packed has values that do not fit in int32",
        ),
        (
            dict(faces_packed=torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 9]])),
            ValueError,
            r"faces_packed has vertex indices in \[0, 9\]",
        ),
        (
            dict(faces_packed=torch.zeros(3, 3, dtype=torch.int64, device="meta")),
            ValueError,
            "faces_packed is on meta",
        ),
        (dict(mesh_to_face_first_idx=torch.tensor([0.0, 2.0])), TypeError, "mesh_to_face_first"),
        (dict(num_faces_per_mesh=torch.tensor([3])), ValueError, "num_faces_per_mesh has 1"),
        (dict(num_faces_per_mesh=torch.tensor([2, 2])), ValueError, "num_faces_per_mesh"),
        (dict(image_size=0), ValueError, "image_size"),
        (dict(faces_per_pixel=0), ValueError, "faces_per_pixel"),
        (dict(blur_radius=-1.0), ValueError, "blur_radius"),
        (
            dict(clipped_faces_neighbor_idx=torch.tensor([-1, -1])),
            ValueError,
            "clipped_faces_neighbor_idx must have length F=3",
        ),
    ],
)
def test_bad_input_raises_naming_the_argument(changes, error, match):
    with pytest.raises(error, match=match):
        wrt.rasterize_meshes(**_bad(**changes))


@pytest.mark.parametrize(
    ("verts_list", "faces_list", "error", "match"),
    [
        ([torch.zeros(3, 3)], [], ValueError, "verts_list has 1 meshes but faces_list has 0"),
        ([torch.zeros(3, 3)], [torch.tensor([[0, 1, 3]])], ValueError, r"faces_list\[0\]"),
        (torch.zeros(3, 3), [torch.tensor([[0, 1, 2]])], TypeError, "lists of tensors"),
        ([torch.zeros(3, 2)], [torch.tensor([[0, 1, 2]])], ValueError, r"verts_list\[0\]"),
    ],
)
def test_mesh_list_bad_input_raises_naming_the_argument(verts_list, faces_list, error, match):
    with pytest.raises(error, match=match):
        wrt.rasterize_mesh_list(verts_list, faces_list)


# ----------------------------------------------------------------------------- context reuse
def test_context_reuses_one_workspace_and_never_overwrites_earlier_outputs(tdevice):
    """Repeated calls of one shape reuse one workspace and one set of backward
    buffers from the context (no Warp allocation per call), while each call's
    outputs are its own tensors: a later call with other vertices leaves the
    earlier outputs (and the gradient computed from them) unchanged."""
    ctx = wrt.RasterContext()
    verts, faces, first, count = _two_meshes(device=tdevice)
    kw = dict(image_size=8, faces_per_pixel=2, blur_radius=0.02, context=ctx)
    v1 = verts.detach().clone().requires_grad_(True)
    out1 = wrt.rasterize_meshes(v1, faces, first, count, **kw)
    kept = [t.detach().clone() for t in out1]
    v2 = (verts.detach() * 0.9).requires_grad_(True)
    out2 = wrt.rasterize_meshes(v2, faces, first, count, **kw)
    for a, b in zip(out1, kept, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(out1[1], out2[1])  # the second call really differs
    assert len(ctx._entries) == 1  # one workspace for both calls
    (out1[1].sum() + out1[3].sum()).backward()
    g1 = v1.grad.clone()
    (out2[1].sum() + out2[3].sum()).backward()
    assert len(ctx._entries) == 2  # + one set of backward buffers, shared
    # the first gradient again, in a fresh context: the same numbers
    v3 = verts.detach().clone().requires_grad_(True)
    out3 = wrt.rasterize_meshes(v3, faces, first, count, **{**kw, "context": wrt.RasterContext()})
    (out3[1].sum() + out3[3].sum()).backward()
    # same sums; on CUDA the atomic order may differ: a few ulps of the largest term
    torch.testing.assert_close(g1, v3.grad, rtol=1e-5, atol=1e-6)
