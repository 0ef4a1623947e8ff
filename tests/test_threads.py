"""The torch ops beside a ``wp.Tape`` that is open in this thread or another.

Warp's recording tape is process-global: without care a torch op's launches land
on whatever tape is open, and its backward (which records a private tape) cannot
start while another is open. The torch ops run their Warp work in a tape slot of
their own (``warpraster.tape_slots``); these tests pin that down on the CPU.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import warp as wp  # noqa: E402
from conftest import DEVICES  # noqa: E402

import warpraster.torch as wrt  # noqa: E402
from warpraster.torch import shading as T  # noqa: E402

pytestmark = pytest.mark.skipif(
    "cpu" not in DEVICES, reason="runs torch on the CPU; Warp's cpu device is not a test device"
)


@wp.kernel
def _square(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * x[i]


def _scene():
    verts = torch.tensor(
        [[-1.0, -1.0, 3.0], [1.0, -1.0, 3.0], [0.0, 1.0, 3.0],
         [-1.0, 1.0, 4.0], [1.0, 1.0, 4.0], [0.0, -1.0, 4.0]]
    )  # fmt: skip
    return verts, torch.tensor([[0, 1, 2], [3, 4, 5]])


def _torch_step():
    """A torch forward + backward through the renderer (its backward records a Warp
    tape), the raster op and a functional op: (outputs, gradients), detached."""
    verts, faces = _scene()
    cams = T.FoVPerspectiveCameras()
    settings = T.RasterizationSettings(image_size=8, faces_per_pixel=2, blur_radius=0.01)
    renderer = T.MeshRenderer(
        T.MeshRasterizer(cameras=cams, raster_settings=settings),
        T.SoftPhongShader(cameras=cams),
    )
    v = verts.clone().requires_grad_(True)
    image = renderer(v, faces, [0], [2])
    ndc = v * torch.tensor([0.3, 0.3, 1.0])
    p2f, zbuf, bary, dists = wrt.rasterize_meshes(
        ndc, faces, [0], [2], image_size=8, faces_per_pixel=2, blur_radius=0.01
    )
    normals = wrt.face_normals(v, faces)
    loss = image.square().sum() + zbuf.clamp(min=0).sum() + dists.sum() + normals.sum()
    loss.backward()
    return [t.detach() for t in (image, p2f, zbuf, bary, dists, normals)], v.grad.clone()


def _warp_step(tape: wp.Tape, x: wp.array, count: int) -> list[wp.array]:
    """``count`` launches recorded on the open ``tape`` (one output array each)."""
    outs = []
    for _ in range(count):
        y = wp.zeros(x.shape[0], requires_grad=True)
        wp.launch(_square, dim=x.shape[0], inputs=[x], outputs=[y])
        outs.append(y)
    return outs


def _assert_same(got, want):
    """Bit-identical: the same kernels on the same inputs, serially on the CPU device."""
    outs, grad = got
    ref_outs, ref_grad = want
    for a, b in zip(outs, ref_outs, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(grad, ref_grad)


def _in_thread(fn):
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # handed to the main thread
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, result


def test_torch_ops_in_a_thread_record_nothing_on_the_main_threads_tape():
    """A thread runs torch forwards and backwards while the main thread records Warp
    launches on its own tape at the same time: the main tape holds exactly the main
    thread's launches, its backward gives the right gradient, and the thread's
    results equal the single-threaded ones."""
    want = _torch_step()  # single-threaded reference (also loads every module)
    x = wp.array(np.arange(1.0, 5.0, dtype=np.float32), requires_grad=True)
    tape = wp.Tape()
    with tape:
        outs = _warp_step(tape, x, 1)
        t, result = _in_thread(lambda: [_torch_step() for _ in range(3)])
        while t.is_alive():  # launches of this thread interleave with the torch ops'
            outs += _warp_step(tape, x, 1)
        t.join()
        outs += _warp_step(tape, x, 1)
    if "error" in result:
        raise result["error"]
    for got in result["value"]:
        _assert_same(got, want)
    assert len(tape.launches) == len(outs)  # nothing of the torch ops' on it
    tape.backward(grads={y: wp.ones(4) for y in outs})
    # d/dx sum_j sum_i x_i^2 over len(outs) outputs = 2 x len(outs), exact in float32
    np.testing.assert_array_equal(x.grad.numpy(), 2.0 * x.numpy() * len(outs))


def test_torch_backward_runs_while_another_threads_tape_is_open():
    """The torch renderer's backward records a Warp tape of its own: it runs while
    another thread holds a tape open, and that tape stays the other thread's."""
    want = _torch_step()
    opened, release = threading.Event(), threading.Event()
    x = wp.array(np.arange(1.0, 5.0, dtype=np.float32), requires_grad=True)
    other = {}

    def hold_tape():
        tape = wp.Tape()
        with tape:
            first = _warp_step(tape, x, 1)
            opened.set()
            release.wait(timeout=60)
            second = _warp_step(tape, x, 1)
        other["launches"] = len(tape.launches)
        other["outs"] = first + second

    t, result = _in_thread(hold_tape)
    assert opened.wait(timeout=60)
    try:
        got = _torch_step()
    finally:
        release.set()
        t.join()
    if "error" in result:
        raise result["error"]
    _assert_same(got, want)
    assert other["launches"] == 2


def test_torch_ops_inside_the_users_own_tape_leave_it_alone():
    """Called under the caller's open ``wp.Tape`` (same thread), a torch forward and
    backward record nothing on it, and it is still the open tape afterwards."""
    want = _torch_step()
    tape = wp.Tape()
    with tape:
        got = _torch_step()
        assert wp._src.context.runtime.tape is tape
    assert len(tape.launches) == 0
    assert wp._src.context.runtime.tape is None
    _assert_same(got, want)


def test_torch_ops_in_two_threads_at_once_match_single_threaded():
    """Two threads each running torch forwards and backwards (each backward with its
    own private tape) get the single-threaded results."""
    want = _torch_step()
    runs = [_in_thread(lambda: [_torch_step() for _ in range(3)]) for _ in range(2)]
    for t, _ in runs:
        t.join()
    for _, result in runs:
        if "error" in result:
            raise result["error"]
        for got in result["value"]:
            _assert_same(got, want)


def test_a_warp_render_beside_another_threads_tape_raises_instead_of_landing_on_it():
    # Warp's tape is process-global: a warpraster render recorded from a thread
    # while another thread's wp.Tape is open would be recorded on that tape
    # (silently differentiating it on the other thread's backward). It raises,
    # before any launch, and says why; the owner thread itself records as usual.
    import warpraster as wr

    verts = wp.array([[-0.5, -0.5, 2.0], [0.5, -0.5, 2.0], [0.0, 0.5, 2.0]], dtype=wp.vec3,
                     device="cpu", requires_grad=True)  # fmt: skip
    faces = wp.array([[0, 1, 2]], dtype=wp.int32, device="cpu")
    wr.rasterize_meshes(verts, faces, [0], [1], image_size=8, faces_per_pixel=1)  # loads modules
    opened, release = threading.Event(), threading.Event()
    errors = []

    def owner():
        with wp.Tape() as tape:
            opened.set()
            release.wait(timeout=30)
            wr.rasterize_meshes(verts, faces, [0], [1], image_size=8, faces_per_pixel=1)
        errors.append(len(tape.launches) > 0)  # its own render is recorded on its tape

    t = threading.Thread(target=owner)
    t.start()
    try:
        assert opened.wait(timeout=30)
        with pytest.raises(ValueError, match="another thread"):
            wr.rasterize_meshes(verts, faces, [0], [1], image_size=8, faces_per_pixel=1)
    finally:
        release.set()
        t.join(timeout=60)
    assert errors == [True]
    # with the tape left, this thread renders (and records) again
    with wp.Tape() as tape:
        wr.rasterize_meshes(verts, faces, [0], [1], image_size=8, faces_per_pixel=1)
    assert tape.launches
