"""A repeated eager :meth:`~warpraster.sim.CameraSensor.update` replayed as captured graphs.

An eager update issues ~20 launches from Python (each tens of microseconds of host
time), and its deterministic backward as many again. Per frame slot, a call that
repeats the previous call's key is captured once and then replayed as one graph
(:class:`~warpraster.raster.workspace.CallGraph`: the first call with a key
launches as usual, the second captures, later ones replay):

* the update's forward, keyed by the slot, its input arrays (address, shape,
  strides, type, and their gradients') and whether a tape records (one graph per
  case: a recorded update also clears the slot's gradients). On a tape with
  ``antialias`` the antialias pass (which records its own backward) runs after
  the graph, as usual;
* with ``deterministic=True``, the backward registered on the tape replays a graph of
  :meth:`~warpraster.sim.adjoint.SensorBackward.run`, keyed when it runs by every
  array it reads or writes by address (the channels' gradients the loss wrote, the
  inputs' ``.grad``, the material gradients) and the fused loss's terms (read by
  value): a changed key launches eagerly (and captures when it repeats);
* with ``deterministic=False``, a recorded update goes through
  :class:`~warpraster.tape_replay.RecordedCall` (its forward and the private tape's
  generated backward as two graphs).

A graph reads whatever its arrays hold when it runs, so new values in the same
arrays are seen; the replay runs the same kernels on the same arrays as the eager
call, so results are bit-identical (tested on the cpu device). Inside a graph the
caller captures (``device.is_capturing``) everything launches as usual.
"""

from __future__ import annotations

import warp as wp

from ..grad_buffers import note_on_tape
from ..raster.workspace import CallGraph, array_key
from ..tape_replay import RecordedCall
from .kernel_args import MaterialArrays

__all__ = ["SensorReplay"]


def _key(a) -> tuple | None:
    """An array's address, shape, strides and type, and its gradient's (None: no array)."""
    if a is None:
        return None
    return (*array_key(a), None if a.grad is None else array_key(a.grad))


def _loss_key(terms) -> tuple:
    """What the channel adjoint reads of a fused loss's :class:`LossTerms` (by value)."""
    arrays = (terms.color, terms.color_target, terms.depth, terms.depth_target, terms.loss_grad)
    return (
        *(array_key(a) for a in arrays),
        float(terms.color_weight),
        float(terms.depth_weight),
        int(terms.mask),
    )


def struct_arrays(value, found: dict) -> dict:
    """The arrays with a gradient held in a Warp struct instance (nested structs
    too), by id."""
    for name in value._cls.vars:
        v = getattr(value, name)
        if isinstance(v, wp.array):
            if v.grad is not None:
                found[id(v)] = v
        elif hasattr(v, "_cls"):
            struct_arrays(v, found)
    return found


class SensorReplay:
    """Per frame slot: the forward's graphs (unrecorded, recorded), the deterministic
    backward's graph and the generated backward's :class:`RecordedCall`."""

    def __init__(self, device, frames: int):
        self._forward = [(CallGraph(device), CallGraph(device)) for _ in range(frames)]
        self._backward = [CallGraph(device) for _ in range(frames)]
        self.recorded = [RecordedCall(device) for _ in range(frames)]
        self._struct_arrays = None  # see recorded_call

    @staticmethod
    def input_key(sensor, inputs, recorded: bool) -> tuple:
        """The forward's key: the inputs (with their gradients), the tape flag and the
        per-call options the launches read by value."""
        return (
            tuple(_key(a) for a in inputs),
            bool(recorded),
            sensor.exact_perspective_grad,
            sensor.bin_size,
        )

    def forward(self, frame: int, key, launch_all, mode) -> None:
        """Launches, captures or replays the forward of slot ``frame``."""
        self._forward[frame][int(key[1])](key, launch_all, mode)

    def backward(self, sensor, frame: int, inputs: dict, mode) -> None:
        """Runs the deterministic backward of slot ``frame`` (launched, captured or
        replayed), taking the fused loss armed for it (a Python side effect, so done
        here on every call)."""
        bw = sensor.backward
        out = sensor.frames[frame]
        loss = bw.take_loss(out)
        mats = sensor.look.materials
        arrays = [out.written(name) for name in out.CHANNELS[:6]]
        arrays += [out.points, out.ndc, *inputs.values(), sensor.shape_colors,
                   sensor.atlas.texels, sensor.light_direction, sensor.light_intensity,
                   bw._dummy_cam]  # fmt: skip
        arrays += [getattr(mats, name) for name in MaterialArrays.vars]
        key = (
            tuple(_key(a) for a in arrays),
            _loss_key(loss),
            id(bw.flat),  # rebuilt once, when camera scratch is first allocated
            sensor.exact_perspective_grad,
        )
        self._backward[frame](key, lambda: bw.run(out, loss=loss, **inputs), mode)

    def recorded_call(self, sensor, frame: int, tape, key, launch_all) -> None:
        """The generated backward's recorded update of slot ``frame``: launched, or its
        forward replayed and its backward registered (:class:`RecordedCall`). The
        arrays the kernels read through the sensor's structs (materials, lights) are
        noted on ``tape``: Warp registers a struct's arrays only when the launches'
        backward runs on the tape, which a replay's private tape does instead, so
        ``tape.zero()`` would miss their gradients."""
        self.recorded[frame](tape, key, launch_all, mode=sensor.call_graphs)
        if self._struct_arrays is None:
            found: dict = {}
            for struct in (sensor.sources, sensor.view, sensor.surface, sensor.look):
                struct_arrays(struct, found)
            self._struct_arrays = list(found.values())
        note_on_tape(*self._struct_arrays)

    def note_render(self, frame: int) -> None:
        """An update of slot ``frame`` outside a tape: it overwrites what a replayed
        generated backward reads (that backward then refuses to run)."""
        self.recorded[frame].guard.note_render()
