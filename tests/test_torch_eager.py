"""The torch ops' eager path (warpraster/torch/eager.py): outside torch.compile each op
runs its custom op's own forward body, setup and backward under a plain autograd
Function. Truth: the custom op itself (``EagerOp.force_custom_op``, what a compiled
graph holds). Every public op, forward and backward from a loss on every output:
equal values and gradients, bit for bit (the same launches on the cpu device, which
adds in order)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_torch import _two_meshes  # noqa: E402

import warpraster.torch as wrt  # noqa: E402
from warpraster.torch.eager import EagerOp  # noqa: E402


def _frags(verts, faces, first, count):
    p2f, _, bary, _ = wrt.rasterize_meshes(verts.detach(), faces, first, count, image_size=8,
                                           faces_per_pixel=2)  # fmt: skip
    return p2f, bary.detach().requires_grad_(True)


def _raster(verts, faces, first, count):
    v = verts.detach().clone().requires_grad_(True)
    out = wrt.rasterize_meshes(v, faces, first, count, image_size=8, faces_per_pixel=2,
                               blur_radius=0.02)  # fmt: skip
    loss = out[1].square().sum() + out[2].sum() + out[3].sum()
    return [*out, v], loss


def _face_attrs(verts, faces, first, count):
    p2f, bary = _frags(verts, faces, first, count)
    attrs = torch.linspace(-1, 1, faces.shape[0] * 3 * 4).reshape(-1, 3, 4).requires_grad_(True)
    out = wrt.interpolate_face_attributes(p2f, bary, attrs)
    return [out, bary, attrs], out.square().sum()


def _vert_attrs(verts, faces, first, count):
    p2f, bary = _frags(verts, faces, first, count)
    attrs = torch.linspace(0, 1, verts.shape[0] * 2).reshape(-1, 2).requires_grad_(True)
    ndc = verts.detach().clone().requires_grad_(True)
    vals, dx, dy = wrt.interpolate_vertex_attributes(p2f, bary, attrs, faces, verts_ndc=ndc)
    return [vals, dx, dy, bary, attrs, ndc], vals.sum() + dx.square().sum() + dy.sum()


def _uv(verts, faces, first, count):
    p2f, bary = _frags(verts, faces, first, count)
    maps = torch.rand(2, 5, 6, 3, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    uvs = torch.rand(verts.shape[0], 2, generator=torch.Generator().manual_seed(2))
    uvs.requires_grad_(True)
    out = wrt.sample_textures_uv(p2f, bary, maps, faces, uvs)
    return [out, bary, maps, uvs], out.square().sum()


def _aa(verts, faces, first, count):
    p2f, _ = _frags(verts, faces, first, count)
    p2f = p2f[..., :1].contiguous()
    color = torch.rand(2, 8, 8, 3, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    ndc = verts.detach().clone().requires_grad_(True)
    out = wrt.antialias(color, p2f, ndc, faces)
    return [out, color, ndc], (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum()


@pytest.mark.parametrize("case", [_raster, _face_attrs, _vert_attrs, _uv, _aa],
                         ids=lambda f: f.__name__.strip("_"))  # fmt: skip
def test_the_eager_path_equals_the_custom_op(case, monkeypatch):
    verts, faces, first, count = _two_meshes()
    results = []
    for force in (True, False):
        monkeypatch.setattr(EagerOp, "force_custom_op", force)
        tensors, loss = case(verts, faces, first, count)
        loss.backward()
        grads = [t.grad.clone() for t in tensors if t.is_leaf and t.grad is not None]
        results.append([t.detach().clone() for t in tensors] + grads)
    custom, eager = results
    assert len(custom) == len(eager) and len(custom) > len(case(verts, faces, first, count)[0])
    for i, (want, got) in enumerate(zip(custom, eager, strict=True)):
        assert torch.equal(got, want), i
    assert any(float(g.abs().max()) > 0 for g in eager[-2:])  # gradients flowed


@pytest.mark.parametrize("name", ["face_normals", "vertex_normals"])
def test_the_normals_eager_path_equals_the_custom_op(name, monkeypatch):
    verts, faces, _, _ = _two_meshes()
    results = []
    for force in (True, False):
        monkeypatch.setattr(EagerOp, "force_custom_op", force)
        v = verts.detach().clone().requires_grad_(True)
        n = getattr(wrt, name)(v, faces)
        (n * torch.linspace(-1, 1, n.numel()).reshape(n.shape)).sum().backward()
        results.append((n.detach(), v.grad))
    for want, got in zip(*results, strict=True):
        assert torch.equal(got, want)
    assert results[1][1].abs().max() > 0


@pytest.mark.parametrize("force", [False, True], ids=["eager", "custom_op"])
@pytest.mark.parametrize("case", [_raster, _face_attrs, _vert_attrs, _uv, _aa],
                         ids=lambda f: f.__name__.strip("_"))  # fmt: skip
def test_a_second_derivative_raises_instead_of_vanishing(case, force, monkeypatch):
    """The ops have first derivatives only. ``create_graph=True`` then a backward
    through the gradients (a gradient penalty) raises on both paths; without
    ``once_differentiable`` the eager path returned gradients with no history, and a
    loss mixing them with other terms silently lost their derivative."""
    monkeypatch.setattr(EagerOp, "force_custom_op", force)
    verts, faces, first, count = _two_meshes()
    tensors, loss = case(verts, faces, first, count)
    leaves = [t for t in tensors if t.is_leaf and t.requires_grad]
    grads = torch.autograd.grad(loss, leaves, create_graph=True)
    plain_tensors, plain_loss = case(verts, faces, first, count)
    plain_leaves = [t for t in plain_tensors if t.is_leaf and t.requires_grad]
    plain = torch.autograd.grad(plain_loss, plain_leaves)
    for got, want in zip(grads, plain, strict=True):  # the first derivatives unchanged
        assert torch.equal(got, want)
    penalty = sum((g * g).sum() for g in grads) + sum(t.sum() for t in leaves)
    with pytest.raises(RuntimeError, match="first derivatives only|no autograd formula"):
        penalty.backward()
