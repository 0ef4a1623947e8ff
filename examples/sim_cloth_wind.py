"""Recover the wind blowing on a hanging cloth from camera images alone (pure Warp).

A mass-spring cloth hangs from its top edge; a uniform wind drags every particle
(force ``drag * (wind - v)``). The scene is rendered every ``render_every``
substeps by two cameras (:class:`warpraster.sim.CameraSensor`, soft silhouette,
Newton's shading). Target images come from the true wind; starting from no
wind, Adam on the image loss recovers it. The whole step (simulate, render, loss,
backward) is captured once in a graph and replayed each iteration; every float
sum in it runs in a fixed order (hand-written adjoints, the sensor's
deterministic backward, the fixed-order loss), so on a GPU too eager steps and
replays give the same bits.

    python examples/sim_cloth_wind.py            # full run, last line: recovered=... truth=...
    python examples/sim_cloth_wind.py --test     # a short run (the test suite)

Both print the recovered wind only when it is within ``TOLERANCE`` of the truth
in every component, and exit with 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import warp as wp

import warpraster.sim as wsim
from warpraster.cli import init_warp

#: m/s per component: a tenth of the smallest non-zero component of the true wind
#: (1.5 m/s). Measured on the cpu device: the test run ends 0.012 off, the full run 0.005.
TOLERANCE = 0.15

# every kernel here has a hand-written adjoint (below): no generated ones to compile
wp.set_module_options({"enable_backward": False})


# ----------------------------------------------------------------------------- physics
# Every kernel below runs unrecorded and has a hand-written adjoint registered on
# the tape (``tape.record_func``): each element is written by one thread and every
# float sum runs in an order fixed by the topology (a particle's springs, in CSR
# order), so a step and its backward are bit-identical run after run on a GPU.
# (A spring kernel adding forces with ``wp.atomic_add``, or Warp's generated
# adjoint of a kernel reading a particle from many springs, adds floats in thread
# order.)
@wp.kernel
def _spring_forces(
    # Model:
    springs: wp.array(dtype=wp.vec2i),
    rest: wp.array(dtype=float),
    ke: float,
    kd: float,
    # Data in:
    q: wp.array(dtype=wp.vec3),
    qd: wp.array(dtype=wp.vec3),
    # Data out:
    fs_out: wp.array(dtype=wp.vec3),
):
    """Force of spring s on its first particle (the second gets its negative)."""
    s = wp.tid()
    i = springs[s][0]
    j = springs[s][1]
    d = q[j] - q[i]
    length = wp.length(d)
    u = d / length
    rel = wp.dot(qd[j] - qd[i], u)
    fs_out[s] = (ke * (length - rest[s]) + kd * rel) * u


@wp.kernel
def _spring_forces_adjoint(
    # Model:
    springs: wp.array(dtype=wp.vec2i),
    rest: wp.array(dtype=float),
    ke: float,
    kd: float,
    # Data in:
    q: wp.array(dtype=wp.vec3),
    qd: wp.array(dtype=wp.vec3),
    f_grad: wp.array(dtype=wp.vec3),
    # Data out, per spring:
    d_grad_out: wp.array(dtype=wp.vec3),
    v_grad_out: wp.array(dtype=wp.vec3),
):
    """Spring s: the gradient w.r.t. d = q_j - q_i and v = qd_j - qd_i of its force
    f = (ke (|d| - rest) + kd v.u) u, u = d / |d|, whose upstream gradient is
    f.grad[i] - f.grad[j]."""
    s = wp.tid()
    i = springs[s][0]
    j = springs[s][1]
    g = f_grad[i] - f_grad[j]
    d = q[j] - q[i]
    v = qd[j] - qd[i]
    length = wp.length(d)
    u = d / length
    a = ke * (length - rest[s]) + kd * wp.dot(v, u)
    gu = wp.dot(g, u)
    # du/dd = (I - u u^T) / |d| (symmetric)
    proj_v = (v - u * wp.dot(u, v)) / length
    proj_g = (g - u * gu) / length
    d_grad_out[s] = gu * (ke * u + kd * proj_v) + a * proj_g
    v_grad_out[s] = (gu * kd) * u


@wp.func
def _spring_end(ends: wp.array(dtype=wp.int32), e: int):
    """(spring s, sign) of CSR entry e: end = 2 s + side; side 0 (particle i) is +1,
    side 1 (particle j) is -1 (exact: x * -1.0 is -x)."""
    end = ends[e]
    s = end // 2
    return s, wp.where(end - 2 * s == 0, 1.0, -1.0)


@wp.kernel
def _sum_spring_forces(
    # Model: the springs at particle p are ends[start[p]:start[p+1]], end = 2 s + side
    start: wp.array(dtype=wp.int32),
    ends: wp.array(dtype=wp.int32),
    # Data in:
    fs: wp.array(dtype=wp.vec3),
    # Data out:
    f_out: wp.array(dtype=wp.vec3),
):
    """Net spring force on particle p, summed in CSR order."""
    p = wp.tid()
    f = wp.vec3(0.0)
    for e in range(start[p], start[p + 1]):
        s, sign = _spring_end(ends, e)
        f = f + sign * fs[s]
    f_out[p] = f


@wp.kernel
def _gather_spring_grads(
    # Model:
    start: wp.array(dtype=wp.int32),
    ends: wp.array(dtype=wp.int32),
    # Data in:
    d_grad: wp.array(dtype=wp.vec3),
    v_grad: wp.array(dtype=wp.vec3),
    # Data out (added to):
    q_grad_out: wp.array(dtype=wp.vec3),
    qd_grad_out: wp.array(dtype=wp.vec3),
):
    """Particle p: adds its springs' gradients (d = q_j - q_i: +at j, -at i), CSR order."""
    p = wp.tid()
    gq = wp.vec3(0.0)
    gv = wp.vec3(0.0)
    for e in range(start[p], start[p + 1]):
        s, sign = _spring_end(ends, e)
        # d = q_j - q_i: the gradient goes to j with +, to i with -
        gq = gq - sign * d_grad[s]
        gv = gv - sign * v_grad[s]
    q_grad_out[p] = q_grad_out[p] + gq
    qd_grad_out[p] = qd_grad_out[p] + gv


@wp.kernel
def _integrate(
    # Model:
    inv_mass: wp.array(dtype=float),
    gravity: wp.vec3,
    drag: float,
    dt: float,
    # Data in:
    wind: wp.array(dtype=wp.vec3),
    q: wp.array(dtype=wp.vec3),
    qd: wp.array(dtype=wp.vec3),
    f: wp.array(dtype=wp.vec3),
    # Data out:
    q_out: wp.array(dtype=wp.vec3),
    qd_out: wp.array(dtype=wp.vec3),
):
    """Semi-implicit Euler; pinned particles (inverse mass 0) stay put."""
    i = wp.tid()
    w = inv_mass[i]
    v = qd[i]
    if w > 0.0:
        v = v + ((f[i] + drag * (wind[0] - v)) * w + gravity) * dt
    else:
        v = wp.vec3(0.0)
    qd_out[i] = v
    q_out[i] = q[i] + v * dt


@wp.kernel
def _integrate_adjoint(
    # Model:
    inv_mass: wp.array(dtype=float),
    drag: float,
    dt: float,
    # Data in:
    q_out_grad: wp.array(dtype=wp.vec3),
    qd_out_grad: wp.array(dtype=wp.vec3),
    # Data out (added to), and each particle's wind gradient (overwritten):
    q_grad_out: wp.array(dtype=wp.vec3),
    qd_grad_out: wp.array(dtype=wp.vec3),
    f_grad_out: wp.array(dtype=wp.vec3),
    wind_part_out: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    w = inv_mass[i]
    g_v = qd_out_grad[i] + dt * q_out_grad[i]
    q_grad_out[i] = q_grad_out[i] + q_out_grad[i]
    g_wind = wp.vec3(0.0)
    if w > 0.0:
        qd_grad_out[i] = qd_grad_out[i] + g_v * (1.0 - drag * w * dt)
        f_grad_out[i] = f_grad_out[i] + g_v * (w * dt)
        g_wind = g_v * (drag * w * dt)
    wind_part_out[i] = g_wind


@wp.kernel
def _add_wind_grad(
    count: int,
    wind_part: wp.array(dtype=wp.vec3),
    wind_grad_out: wp.array(dtype=wp.vec3),
):
    """wind.grad += the particles' parts, summed by one thread in particle order."""
    g = wp.vec3(0.0)
    for i in range(count):
        g = g + wind_part[i]
    wind_grad_out[0] = wind_grad_out[0] + g


def _csr(keys: np.ndarray, count: int):
    """(start, entries): for each key, the positions holding it, ascending."""
    order = np.argsort(keys, kind="stable")
    start = np.zeros(count + 1, np.int64)
    np.add.at(start, keys + 1, 1)
    return np.cumsum(start).astype(np.int32), order.astype(np.int32)


def _cloth(n: int, size: float):
    """Vertical cloth in the XZ plane, top row pinned; springs: structural, shear, bend."""
    verts, faces = wsim.grid_mesh(n, n, size / n, size / n)
    q0 = np.stack([verts[:, 0] - 0.5 * size, np.zeros(len(verts)), 1.5 - verts[:, 1]], axis=1)
    # the grid's +Z normal becomes -Y after the flip above; faces stay CCW seen from -Y
    idx = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    springs = []
    for di, dj in ((0, 1), (1, 0), (1, 1), (1, -1), (0, 2), (2, 0)):
        for i in range(n + 1):
            for j in range(n + 1):
                if 0 <= i + di <= n and 0 <= j + dj <= n:
                    springs.append((idx[i, j], idx[i + di, j + dj]))
    springs = np.asarray(springs, np.int32)
    rest = np.linalg.norm(q0[springs[:, 1]] - q0[springs[:, 0]], axis=1)
    inv_mass = np.ones(len(q0))
    inv_mass[idx[0]] = 0.0  # top row (z = 1.5) pinned
    return q0.astype(np.float32), faces, springs, rest.astype(np.float32), inv_mass


class ClothWind:
    """The differentiable pipeline: rollout, render every k substeps, image loss.

    Args:
        n: cloth resolution (n x n cells).
        steps: substeps of the rollout.
        render_every: a frame every this many substeps.
        image_size: pixels per side.
        device: Warp device.
    """

    def __init__(self, *, n=8, steps=40, render_every=10, image_size=48, sigma=2e-4,
                 device="cpu", deterministic=True):  # fmt: skip
        self.device = wp.get_device(device)
        dev = self.device
        self.steps = steps
        self.render_every = render_every
        self.dt = 1.0 / 120.0
        self.drag = 2.0
        self.gravity = wp.vec3(0.0, 0.0, -9.81)
        self.ke, self.kd = 400.0, 2.0
        q0, faces, springs, rest, inv_mass = _cloth(n, 1.0)
        self.num_particles = len(q0)
        self.springs = wp.array(springs, dtype=wp.vec2i, device=dev)
        # the springs at each particle: entry 2 s + side (side 0: first particle)
        start, ends = _csr(springs.reshape(-1), len(q0))
        self.spring_start = wp.array(start, dtype=wp.int32, device=dev)
        self.spring_ends = wp.array(ends, dtype=wp.int32, device=dev)
        self.spring_d_grad = wp.zeros(len(springs), dtype=wp.vec3, device=dev)
        self.spring_v_grad = wp.zeros(len(springs), dtype=wp.vec3, device=dev)
        self.wind_part = wp.zeros(len(q0), dtype=wp.vec3, device=dev)
        self.rest = wp.array(rest, dtype=float, device=dev)
        self.inv_mass = wp.array(inv_mass, dtype=float, device=dev)
        self.wind = wp.zeros(1, dtype=wp.vec3, device=dev, requires_grad=True)
        # one state and one force buffer per substep: the tape needs the old values
        self.q = [wp.array(q0, dtype=wp.vec3, device=dev, requires_grad=True)]
        self.qd = [wp.zeros(len(q0), dtype=wp.vec3, device=dev, requires_grad=True)]
        self.f = []
        self.fs = []  # per-spring forces of each substep
        for _ in range(steps):
            self.q.append(wp.zeros_like(self.q[0], requires_grad=True))
            self.qd.append(wp.zeros_like(self.qd[0], requires_grad=True))
            self.f.append(wp.zeros_like(self.q[0], requires_grad=True))
            self.fs.append(wp.zeros(len(springs), dtype=wp.vec3, device=dev))
        geo = wsim.SensorGeometry()
        geo.add_particle_mesh(np.arange(len(q0)), faces, color=(0.9, 0.35, 0.2))
        bv, bf = wsim.box_mesh(0.8, 0.05, 0.05)  # a bar the cloth hangs from (static)
        geo.add_static_mesh(bv + np.array([0.0, 0.0, 1.55], np.float32), bf, color=(0.3, 0.3, 0.3))
        self.frames = steps // render_every
        self.sensor = wsim.CameraSensor(
            geo, camera_count=2, image_size=image_size, frames=self.frames,
            silhouette_sigma=sigma, smooth_normals=True, clear_color=(0.05, 0.05, 0.08),
            light_direction=(-0.577, 0.577, -0.577), device=dev, requires_grad=True,
            deterministic=deterministic,
        )  # fmt: skip
        eyes = [((0.4, -3.0, 1.0), (0.0, 0.0, 0.9)), ((3.0, 1.0, 1.4), (0.0, 0.0, 0.9))]
        self.cameras = wp.array(
            [[wsim.look_at_transform(e, t)] for e, t in eyes], dtype=wp.transform, device=dev
        )
        self.fovs = wp.array([0.75, 0.75], dtype=wp.float32, device=dev)
        shape = self.sensor.frames[0].color.shape
        self.targets = [wp.zeros(shape, dtype=wp.vec3, device=dev) for _ in range(self.frames)]
        self.loss = wp.zeros(1, dtype=float, device=dev, requires_grad=True)
        self.weight = 1.0 / (self.frames * 2 * image_size * image_size)
        self.tape = wp.Tape()
        self.graph = None

    def simulate_and_render(self) -> None:
        """The forward pass: rollout, frames, loss (record it under a tape)."""
        for t in range(self.steps):
            self._springs(t)
            self._integrate(t)
            if (t + 1) % self.render_every == 0:
                k = (t + 1) // self.render_every - 1
                frame = self.sensor.update(camera_transforms=self.cameras, camera_fovs=self.fovs,
                                           particle_q=self.q[t + 1], frame=k)  # fmt: skip
                wsim.image_loss(frame.color, self.targets[k], self.loss, weight=self.weight)

    def _springs(self, t: int) -> None:
        """Spring forces of substep t into ``f[t]`` (per spring, then per particle),
        with their adjoint on the active tape."""
        dev = self.device
        model = [self.springs, self.rest, self.ke, self.kd]
        q, qd, f = self.q[t], self.qd[t], self.f[t]
        wp.launch(_spring_forces, dim=self.springs.shape[0], inputs=[*model, q, qd],
                  outputs=[self.fs[t]], device=dev, record_tape=False)  # fmt: skip
        wp.launch(_sum_spring_forces, dim=self.num_particles,
                  inputs=[self.spring_start, self.spring_ends, self.fs[t]], outputs=[f],
                  device=dev, record_tape=False)  # fmt: skip
        tape = _active_tape()
        if tape is None:
            return

        def backward():
            wp.launch(_spring_forces_adjoint, dim=self.springs.shape[0],
                      inputs=[*model, q, qd, f.grad],
                      outputs=[self.spring_d_grad, self.spring_v_grad], device=dev)  # fmt: skip
            wp.launch(_gather_spring_grads, dim=self.num_particles,
                      inputs=[self.spring_start, self.spring_ends, self.spring_d_grad,
                              self.spring_v_grad],
                      outputs=[q.grad, qd.grad], device=dev)  # fmt: skip

        tape.record_func(backward, arrays=[q, qd, f])

    def _integrate(self, t: int) -> None:
        """Substep t's integration, with its adjoint on the active tape."""
        dev = self.device
        q, qd, f = self.q[t], self.qd[t], self.f[t]
        q1, qd1 = self.q[t + 1], self.qd[t + 1]
        wp.launch(_integrate, dim=self.num_particles,
                  inputs=[self.inv_mass, self.gravity, self.drag, self.dt, self.wind, q, qd, f],
                  outputs=[q1, qd1], device=dev, record_tape=False)  # fmt: skip
        tape = _active_tape()
        if tape is None:
            return

        def backward():
            wp.launch(_integrate_adjoint, dim=self.num_particles,
                      inputs=[self.inv_mass, self.drag, self.dt, q1.grad, qd1.grad],
                      outputs=[q.grad, qd.grad, f.grad, self.wind_part], device=dev)  # fmt: skip
            wp.launch(_add_wind_grad, dim=1, inputs=[self.num_particles, self.wind_part],
                      outputs=[self.wind.grad], device=dev)  # fmt: skip

        tape.record_func(backward, arrays=[q, qd, f, q1, qd1, self.wind])

    def step(self) -> None:
        """Loss and its gradient w.r.t. the wind (``self.wind.grad``); capturable."""
        self.tape.reset()  # drops the last recording and zeroes its gradients
        self.loss.zero_()
        with self.tape:
            self.simulate_and_render()
        self.tape.backward(self.loss)

    def capture(self) -> None:
        """Records :meth:`step` as one graph (kernels loaded first)."""
        self.step()
        with wp.ScopedCapture(device=self.device, force_module_load=False) as cap:
            self.step()
        self.graph = cap.graph

    def run_step(self) -> None:
        if self.graph is None:
            self.step()
        else:
            wp.capture_launch(self.graph)

    def set_wind(self, wind) -> None:
        self.wind.assign(np.asarray([wind], np.float32))

    def make_targets(self, wind) -> None:
        """Renders the target frames with the true wind (no tape)."""
        self.set_wind(wind)
        self.loss.zero_()
        self.simulate_and_render()
        for k in range(self.frames):
            wp.copy(self.targets[k], self.sensor.frames[k].color)

    def loss_at(self, wind) -> float:
        """The loss at ``wind`` (forward only; for finite differences)."""
        self.set_wind(wind)
        self.loss.zero_()
        self.simulate_and_render()
        return float(self.loss.numpy()[0])


def _active_tape():
    """The ``wp.Tape`` recording now, or None."""
    runtime = getattr(wp._src.context, "runtime", None)
    return getattr(runtime, "tape", None)


def recover(truth, start, *, iterations, lr, graph=True, log=print, **kwargs):
    """Adam on the wind from ``start``; returns (wind, first loss, last loss)."""
    sim = ClothWind(**kwargs)
    sim.make_targets(truth)
    sim.set_wind(start)
    if graph:
        sim.capture()
    x = np.asarray(start, np.float64)
    m = np.zeros(3)
    v = np.zeros(3)
    first = last = None
    for it in range(iterations):
        sim.set_wind(x)
        sim.run_step()
        g = sim.wind.grad.numpy()[0].astype(np.float64)
        last = float(sim.loss.numpy()[0])
        first = last if first is None else first
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        step = lr * (m / (1 - 0.9 ** (it + 1))) / (np.sqrt(v / (1 - 0.999 ** (it + 1))) + 1e-12)
        x = x - step
        if it % 10 == 0 or it == iterations - 1:
            log(f"iter {it:3d} loss {last:.6f} wind {np.round(x, 4).tolist()}")
    return x, first, last


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--test", action="store_true", help="short run for the test suite")
    p.add_argument("--device", default=None)
    p.add_argument("--no-graph", action="store_true", help="eager steps instead of a graph")
    p.add_argument("--verbose", action="store_true", help="Warp's start-up and module-load lines")
    args = p.parse_args(argv)
    init_warp(args.verbose)
    truth = np.array([1.5, 3.0, 0.0])
    start = np.zeros(3)
    if args.test:  # 24 substeps seen in 3 frames: enough motion to tell the wind apart
        kw = dict(n=4, steps=24, render_every=8, image_size=32, iterations=60, lr=0.15)
    else:
        kw = dict(n=8, steps=60, render_every=10, image_size=64, iterations=120, lr=0.15)
    iterations, lr = kw.pop("iterations"), kw.pop("lr")
    wind, first, last = recover(truth, start, iterations=iterations, lr=lr,
                                graph=not args.no_graph, device=args.device, **kw)  # fmt: skip
    print(f"loss {first:.6f} -> {last:.6f}")
    error = float(np.abs(wind - truth).max())
    if not error <= TOLERANCE:
        print(f"not recovered: wind {np.round(wind, 4).tolist()}, truth {truth.tolist()}, "
              f"{error:.3g} m/s off (tolerance {TOLERANCE})", file=sys.stderr)  # fmt: skip
        return 1
    print(f"recovered={np.round(wind, 4).tolist()} truth={truth.tolist()} "
          f"(max error {error:.3g} <= {TOLERANCE} m/s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
