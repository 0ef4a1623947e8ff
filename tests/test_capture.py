"""A whole differentiable step captured in one graph and replayed.

sim kernel (vertices from per-frame parameters) -> ``rasterize_meshes`` with a
preallocated workspace and ``validate=False`` -> loss kernel -> ``tape.backward``,
all inside ``wp.ScopedCapture``; replays with new parameter values written into
the same arrays must give what uncaptured runs give: forward outputs, loss and
gradients. Warp 1.19 captures graphs on the cpu device too, so this runs in CI.
Backward modes as in test_gradients.py: atomic, deterministic, sorted.
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from np_reference import rasterize_reference

import warpraster as wr
from warpraster.backward import DeterministicBackward
from warpraster.backward.recompute import recompute_fragments
from warpraster.fragments import allocate_fragments
from warpraster.primitives import ico_sphere


@wp.kernel
def _move(
    rest: wp.array(dtype=wp.vec3),
    velocity: wp.array(dtype=wp.vec3),
    params: wp.array(dtype=wp.float32),
    verts: wp.array(dtype=wp.vec3),
):
    """verts = rotate_z(rest, params[1]) + params[0] * velocity."""
    i = wp.tid()
    c = wp.cos(params[1])
    s = wp.sin(params[1])
    r = rest[i]
    verts[i] = wp.vec3(c * r[0] - s * r[1], s * r[0] + c * r[1], r[2]) + params[0] * velocity[i]


@wp.kernel
def _loss(
    pix_to_face: wp.array4d(dtype=wp.int32),
    zbuf: wp.array4d(dtype=wp.float32),
    bary: wp.array4d(dtype=wp.vec3),
    dists: wp.array4d(dtype=wp.float32),
    loss: wp.array(dtype=wp.float32),
):
    """loss += sum over valid slots of a smooth function of the fragments."""
    n, y, x, k = wp.tid()
    if pix_to_face[n, y, x, k] >= 0:
        b = bary[n, y, x, k]
        w = float(k + 1) * (0.5 + 0.1 * float(n))
        v = zbuf[n, y, x, k] * zbuf[n, y, x, k] + b[0] * b[1] + 10.0 * dists[n, y, x, k]
        wp.atomic_add(loss, 0, w * v)


class _Step:
    """Buffers of one training step; :meth:`run` is what gets captured."""

    def __init__(self, device, bin_size: int, backward: str):
        sv, sf = ico_sphere(1)
        sv = 0.6 * sv + np.array([0.1, 0.0, 3.0])
        rng = np.random.default_rng(5)
        soup = np.concatenate([rng.uniform(-0.9, 0.9, (6, 2)), rng.uniform(2.0, 4.0, (6, 1))], 1)
        rest = np.concatenate([sv, soup]).astype(np.float32)
        faces = np.concatenate([sf, len(sv) + np.arange(6).reshape(2, 3)]).astype(np.int32)
        vel = rng.uniform(-0.2, 0.2, rest.shape).astype(np.float32)
        self.device = device
        self.backward = backward
        deterministic = backward == "deterministic"
        self.rest = wp.array(rest, dtype=wp.vec3, device=device)
        self.velocity = wp.array(vel, dtype=wp.vec3, device=device)
        self.faces = wp.array(faces, dtype=wp.int32, device=device)
        # Two meshes: the sphere and a 2-triangle soup (heterogeneous batch).
        self.first = wp.array([0, len(sf)], dtype=wp.int32, device=device)
        self.count = wp.array([len(sf), 2], dtype=wp.int32, device=device)
        self.params = wp.zeros(2, dtype=wp.float32, device=device, requires_grad=True)
        self.verts = wp.zeros(len(rest), dtype=wp.vec3, device=device, requires_grad=True)
        # Keep verts.grad readable: the adjoint of the store in _move would
        # otherwise consume (zero) it after passing it on to params.
        self.verts.retain_grad = True
        self.loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
        self.settings = dict(
            image_size=(20, 24),
            faces_per_pixel=3,
            blur_radius=1e-3,
            bin_size=bin_size,
            perspective_correct=True,
        )
        self.workspace = wr.RasterWorkspace(
            num_meshes=2,
            num_faces=len(faces),
            image_size=(20, 24),
            faces_per_pixel=3,
            bin_size=bin_size,
            device=device,
            requires_grad=True,
            deterministic=deterministic,
        )
        self.fragments = self.workspace.fragments
        if backward == "sorted":
            # The recompute with fragments.DeterministicBackward is what gets
            # recorded; the raster pass only chooses the faces.
            self.fragments = allocate_fragments(2, 20, 24, 3, device, requires_grad=True)
            self.sorted = DeterministicBackward(self.fragments.shape, len(faces), device)
        # Validate the static topology once, outside the loop.
        wr.pack_meshes(self.verts, self.faces, self.first, self.count, None, validate=True)

        self.tape = wp.Tape()

    def run(self):
        """Forward + backward; zeroes what accumulates, so it can be replayed."""
        self.loss.zero_()
        # One tape for every step: reset() zeroes the gradients its previous
        # backward touched (params, verts, fragments), then forgets the launches.
        # A fresh Tape's zero() would know no gradients before its backward.
        tape = self.tape
        tape.reset()
        with tape:
            wp.launch(
                _move,
                dim=self.verts.shape[0],
                inputs=[self.rest, self.velocity, self.params],
                outputs=[self.verts],
                device=self.device,
            )
        render = (self.verts, self.faces, self.first, self.count)
        kw = dict(workspace=self.workspace, validate=False, **self.settings)
        if self.backward == "sorted":
            chosen = wr.rasterize_meshes(*render, **kw)  # not recorded
            wp.copy(self.fragments.pix_to_face, chosen.pix_to_face)
        with tape:
            if self.backward == "sorted":
                recompute_fragments(
                    self.verts,
                    self.faces,
                    self.fragments,
                    perspective_correct=True,
                    clip_barycentric_coords=False,
                    deterministic=self.sorted,
                )
            else:
                wr.rasterize_meshes(*render, deterministic=self.backward == "deterministic", **kw)
            fr = self.fragments
            wp.launch(
                _loss,
                dim=fr.shape,
                inputs=[fr.pix_to_face, fr.zbuf, fr.bary_coords, fr.dists],
                outputs=[self.loss],
                device=self.device,
            )
        tape.backward(self.loss)

    def state(self) -> dict[str, np.ndarray]:
        """Copies (``.numpy()`` of a cpu array is a view of the live buffer)."""
        out = self.fragments.numpy()
        out["loss"] = self.loss.numpy()
        out["params_grad"] = self.params.grad.numpy()
        out["verts_grad"] = self.verts.grad.numpy()
        return {k: v.copy() for k, v in out.items()}


def _assert_same(got, ref, key, device, backward):
    """Bit-identical where the summation order is fixed, else within rounding."""
    if wp.get_device(device).is_cpu or (backward != "atomic" and key == "verts_grad"):
        # cpu kernels run serially and the deterministic backward fixes every
        # summation order: bit-identical.
        np.testing.assert_array_equal(got, ref, err_msg=key)
    else:
        # cuda float atomics (the loss kernel, the sim adjoint into params, the
        # atomic backward) sum in a varying order: a few float32 ulps of the
        # summed magnitudes (measured on an H200: 3e-7 relative on the loss).
        scale = np.abs(ref).max()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale, err_msg=key)


FRAMES = [(0.0, 0.0), (0.5, 0.2), (-0.7, -0.4), (0.5, 0.2)]  # the last repeats frame 1


@pytest.mark.parametrize("backward", ["atomic", "deterministic", "sorted"])
@pytest.mark.parametrize("bin_size", [0, 8], ids=["naive", "binned"])
def test_captured_step_matches_eager(bin_size, backward, device):
    step = _Step(device, bin_size, backward)
    eager = []
    for p in FRAMES:
        step.params.assign(np.array(p, np.float32))
        step.run()  # also loads every module before the capture
        eager.append(step.state())
    assert all((e["pix_to_face"] >= 0).sum() > 100 for e in eager)  # something is drawn
    assert all(np.abs(e["params_grad"]).max() > 0 for e in eager)  # and differentiated
    assert all(np.abs(e["verts_grad"]).max() > 0 for e in eager)
    assert not np.array_equal(eager[0]["zbuf"], eager[1]["zbuf"])  # frames differ
    # Eager runs do not accumulate: frame 3 repeats frame 1.
    for key in ("loss", "params_grad", "verts_grad"):
        _assert_same(eager[3][key], eager[1][key], key, device, backward)

    with wp.ScopedCapture(device=device) as capture:
        step.run()

    for _ in range(2):  # replay every frame twice
        for p, ref in zip(FRAMES, eager, strict=True):
            step.params.assign(np.array(p, np.float32))  # same array, new values
            wp.capture_launch(capture.graph)
            got = step.state()
            for key in ("pix_to_face", "zbuf", "bary_coords", "dists"):
                # The forward has no atomics that reach its outputs: exact.
                np.testing.assert_array_equal(got[key], ref[key], err_msg=key)
            for key in ("loss", "params_grad", "verts_grad"):
                _assert_same(got[key], ref[key], key, device, backward)


def _render_args(device, scale: float):
    v, f = ico_sphere(2)
    verts = np.concatenate([v * 0.6 * scale + [0.1, 0.0, 2.0], v * 0.5 + [-0.2, 0.1, 2.3]])
    faces = np.concatenate([f, f + len(v)]).astype(np.int32)
    return verts.astype(np.float32), faces


def test_repeated_calls_replay_one_graph_and_follow_their_inputs(device):
    """rasterize_packed replays a workspace's launches as one graph once a call
    repeats the previous call's arguments (forced on here; CUDA's default). Every
    call must still equal a fresh render of what it was given: vertex values
    rewritten in the same array (the graph reads them at replay), a new vertex
    array (new address: launched anew, then captured again), other flags."""
    verts, faces = _render_args(device, 1.0)
    size, k = (12, 10), 4
    wv = wp.array(verts, dtype=wp.vec3, device=device)
    wf = wp.array(faces, dtype=wp.int32, device=device)
    first = wp.array([0], dtype=wp.int32, device=device)
    count = wp.array([len(faces)], dtype=wp.int32, device=device)
    ws = wr.RasterWorkspace(
        num_meshes=1,
        num_faces=len(faces),
        image_size=size,
        faces_per_pixel=k,
        device=device,
        tuning=wr.Tuning(call_graphs=True),
    )
    graphs = []

    def render(vert_array, **flags):
        out = wr.rasterize_meshes(
            vert_array, wf, first, count, image_size=size, faces_per_pixel=k, workspace=ws,
            validate=False, **flags,
        ).numpy()  # fmt: skip
        graphs.append(ws.call_graph._graph)
        return out

    def fresh(vert_np, **flags):
        return rasterize_reference(
            vert_np, faces, np.array([0]), np.array([len(faces)]), image_size=size,
            faces_per_pixel=k, dtype=np.float32, **flags,
        )  # fmt: skip

    def check(out, ref):
        np.testing.assert_array_equal(out["pix_to_face"], ref.pix_to_face)
        for key in ("zbuf", "bary_coords", "dists"):
            np.testing.assert_array_equal(out[key], getattr(ref, key).astype(np.float32))

    ref = fresh(verts)
    for _ in range(3):  # launched, captured + replayed, replayed
        check(render(wv), ref)
    assert graphs[0] is None and graphs[1] is not None and graphs[2] is graphs[1]
    moved = verts * np.float32(1.3)
    moved[:, 2] = verts[:, 2]
    wv.assign(moved)  # same array, new values: the graph replays and reads them
    check(render(wv), fresh(moved))
    assert graphs[3] is graphs[1]
    other = wp.array(verts, dtype=wp.vec3, device=device)  # another address
    for _ in range(2):
        check(render(other), ref)
    assert graphs[4] is None and graphs[5] is not None and graphs[5] is not graphs[1]
    for _ in range(2):  # other flags: a new key again
        out = render(other, perspective_correct=True, clip_barycentric_coords=True)
        check(out, fresh(verts, perspective_correct=True, clip_barycentric_coords=True))


def test_call_graph_gradients_match_eager(device):
    """The backward recorded on a tape is the same whether the forward ran as
    launches or as the replayed graph."""
    verts, faces = _render_args(device, 1.0)
    grads = {}
    for mode in (False, True):
        wv = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
        wf = wp.array(faces, dtype=wp.int32, device=device)
        first = wp.array([0], dtype=wp.int32, device=device)
        count = wp.array([len(faces)], dtype=wp.int32, device=device)
        ws = wr.RasterWorkspace(
            num_meshes=1, num_faces=len(faces), image_size=(12, 10), faces_per_pixel=4,
            device=device, requires_grad=True, deterministic=True,
            tuning=wr.Tuning(call_graphs=mode),
        )  # fmt: skip
        for _ in range(3):  # the third forward is a graph replay when mode is on
            tape = wp.Tape()
            with tape:
                fr = wr.rasterize_meshes(
                    wv, wf, first, count, image_size=(12, 10), faces_per_pixel=4,
                    workspace=ws, validate=False, deterministic=True,
                )  # fmt: skip
            fr.zbuf.grad.fill_(1.0)
            fr.dists.grad.fill_(0.5)
            fr.bary_coords.grad.fill_(wp.vec3(0.25, -0.5, 0.75))
            wv.grad.zero_()
            tape.backward()
        assert (ws.call_graph._graph is not None) == mode
        grads[mode] = wv.grad.numpy().copy()
    assert np.abs(grads[False]).max() > 0
    np.testing.assert_array_equal(grads[True], grads[False])  # deterministic backward: bit equal
