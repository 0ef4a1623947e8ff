"""The pixel kernel and its adjoint as variants with the render's flags compiled in.

On CUDA the shading kernels are launched as variants whose ``ShadeInputs`` flags
(blend, lighting, texel source, ...) and requested gradients (``ShadeGrads.want``)
are constants (:func:`warpraster.shading.shade_inputs.inputs_pin`); the CPU keeps
the generic kernel by default. Truth: the generic kernel itself. A variant only
drops branches that the launch's flags never take, so the image and every
gradient must be the same bits (no float operation changes: the modules compile
without FMA contraction). Two PyTorch3D reference scenes (tests/data/pytorch3d-render)
cover both blends and both colour sources: r03 soft Phong with vertex colours
(K = 8), r07 hard Phong with a UV texture; cameras, lights, textures and vertices
all train, over two steps with a fresh tape each. A variant compiles on the CPU
in seconds, so only these two scenes run it here; the CUDA run of the suite
(WARPRASTER_TEST_DEVICES=cuda:0) takes the variants everywhere.

On a GPU the comparison is bit for bit for the image (the faces' corner lists make
the normals and corner tables gathers, not atomics) and within float32 summation
order for the gradients: the adjoint adds the per-face, light and camera rows with
atomics, whose order differs from run to run, generic against generic too.
"""

from __future__ import annotations

import numpy as np
import p3d_render_cases as cases
import pytest
import warp as wp

import warpraster as wr
from warpraster import shading
from warpraster.renderer import MeshRenderer
from warpraster.shading.corner_lists import CornerLists
from warpraster.shading.shade_inputs import PINNED_FIELDS, inputs_pin
from warpraster.shading.shading_buffers import ShadingBuffers


def _scene(name, device):
    d, spec = cases.load(name)
    cams = wr.FoVPerspectiveCameras(
        fov=d["cam_fov"], aspect_ratio=d["cam_aspect_ratio"], znear=d["cam_znear"],
        zfar=d["cam_zfar"], R=d["cam_R"], T=d["cam_T"], device=device, requires_grad=True,
    )  # fmt: skip
    lts = cases.lights(d, spec, device)
    shader = getattr(shading, spec["shader"])(
        cameras=cams, lights=lts, materials=cases.materials(spec, device),
        blend_params=cases.blend_params(spec),
    )  # fmt: skip
    ren = MeshRenderer(
        rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=cases.raster_settings(spec)),
        shader=shader,
    )
    verts = wp.array(d["verts_packed"], dtype=wp.vec3, device=device, requires_grad=True)
    return d, ren, cams, lts, verts, cases.textures(d, spec, device)


def _steps(name, device, specialize, steps=2):
    """Images and gradients of ``steps`` training steps (a fresh tape each, the
    shading buffers reused), with the pixel kernels generic or as variants."""
    d, ren, cams, lts, verts, tex = _scene(name, device)
    faces = wp.array(d["faces_packed"].astype(np.int32), dtype=wp.int32, device=device)
    lists = CornerLists(faces, verts.shape[0])
    buffers = None
    out = []
    for step in range(steps):
        tape = wp.Tape()
        with tape:
            frags = ren.rasterizer(verts, faces, d["mesh_to_face_first_idx"],
                                   d["num_faces_per_mesh"])  # fmt: skip
            if buffers is None:
                n, h, w, k = frags.pix_to_face.shape
                buffers = ShadingBuffers((n, h, w, k), verts.shape[0], faces.shape[0], device,
                                         corner_lists=lists)  # fmt: skip
                buffers.specialize = specialize
            img = ren.shader(frags, verts, faces, textures=tex, buffers=buffers)
        grad = d["grad_images"] * (1.0 + step)
        tape.backward(grads={img: wp.array(grad, dtype=wp.float32, device=device)})
        arrays = {"image": img, "verts": verts.grad, "R": cams.R.grad, "T": cams.T.grad}
        for key, (ours, _) in {**cases.texture_grads(d, tex),
                               **cases.light_grads(d, lts)}.items():  # fmt: skip
            arrays[key] = ours
        out.append({k: np.array(v.numpy() if hasattr(v, "numpy") else v)
                    for k, v in arrays.items()})  # fmt: skip
        tape.zero()
    return out


@pytest.mark.parametrize("name", ["r03_softphong_directional_k8", "r07_texuv_hardphong_bilinear"])
def test_variant_kernels_equal_the_generic_kernels_bit_for_bit(name, device):
    generic = _steps(name, device, specialize=False)
    variant = _steps(name, device, specialize=True)
    exact = wp.get_device(device).is_cpu
    for step, (a, b) in enumerate(zip(generic, variant, strict=True)):
        assert a.keys() == b.keys()
        for key in a:
            assert np.any(a[key] != 0.0), (step, key)  # every compared gradient is exercised
            if exact or key == "image":
                np.testing.assert_array_equal(b[key], a[key], err_msg=f"step {step}: {key}")
            else:
                # GPU atomics: each entry is a float32 sum of up to a few thousand
                # per-pixel terms in a run-dependent order (~1e-7 relative of the
                # largest term each): 1e-5 of the array's largest entry
                tol = 1e-5 * np.abs(a[key]).max()
                np.testing.assert_allclose(b[key], a[key], rtol=0, atol=tol,
                                           err_msg=f"step {step}: {key}")  # fmt: skip


def test_pins_cover_every_int_field_of_the_inputs():
    """Every int field of ShadeInputs is pinned (a new flag must join the variants'
    key, or a variant would read its run-time value in one place and a pinned one
    in none: harmless, but the key would then miss a flag that selects code)."""
    ints = [name for name, var in shading.fused.ShadeInputs.vars.items() if var.type is wp.int32]
    assert sorted(ints) == sorted(PINNED_FIELDS)
    assert inputs_pin(None) is inputs_pin(None)  # built once
