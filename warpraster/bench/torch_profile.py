"""``warpraster bench --suite renderer --torch --profile``: where a torch step's time goes.

Two tables a scene, for the torch ``MeshRenderer``'s training step (forward, torch's
MSE, ``loss.backward()``, the leaves' gradients set to None first):

* **host timeline**: microseconds from the start of the step to each stage of the
  op (medians over the steps), marked by wrapping the op's stages for the run
  (restored after). It shows how long the device waits for the host before each
  graph launch, which CUDA events around the step cannot separate;
* **device kernels** (CUDA): each kernel's device time a step (``torch.profiler``),
  the torch step beside the Warp-native eager step of the same scene, so a kernel
  that only one of them runs, or runs slower, stands out.

A tool for finding the next thing to speed up, not a timed benchmark: the wrappers
and the profiler add their own host time.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable

__all__ = ["device_kernels", "host_timeline", "print_profile"]

#: (module path, attribute, label) of the stages marked in the host timeline: a
#: function or a class's method, entered (label ">") and left ("<")
STAGES = (
    ("warpraster.torch.renderer", "_render", "call"),
    ("warpraster.torch.render_op", "_render_impl", "op forward"),
    ("warpraster.torch.render_context", "RenderContext.lease", "lease"),
    ("warpraster.torch.render_context", "_foreach", "inputs in / gradients zeroed"),
    ("warp", "capture_launch", "graph launch"),
    ("warpraster.torch.render_context", "_Slot.outputs", "outputs out"),
    ("warpraster.torch.render_op", "_render_backward_impl", "op backward"),
    ("warpraster.torch.render_context", "_Slot.backward", "slot backward"),
)


@contextlib.contextmanager
def _marked(marks: list):
    """Within: every stage of :data:`STAGES` appends (label, time) to ``marks`` on
    entry and exit."""
    import importlib  # noqa: PLC0415

    restore = []
    for module_name, attr, label in STAGES:
        owner = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        real = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

        def wrapped(*a, _real=real, _label=label, **k):
            marks.append((_label + " >", time.perf_counter()))
            try:
                return _real(*a, **k)
            finally:
                marks.append((_label + " <", time.perf_counter()))

        setattr(owner, name, functools.wraps(real)(wrapped))
        restore.append((owner, name, real))
    try:
        yield
    finally:
        for owner, name, real in reversed(restore):
            setattr(owner, name, real)


def host_timeline(step: Callable[[], None], sync: Callable[[], None], steps: int = 30
                  ) -> list[tuple[str, float]]:  # fmt: skip
    """[(stage, microseconds from the step's start)]: medians over ``steps`` calls of
    ``step`` (each followed by ``sync``, marked "device done"), in the order the first
    step met them. Steps whose stages differ from the first's are left out."""
    rows: list[list[tuple[str, float]]] = []
    marks: list = []
    with _marked(marks):
        for _ in range(steps):
            marks.clear()
            t0 = time.perf_counter()
            step()
            marks.append(("step returned", time.perf_counter()))
            sync()
            marks.append(("device done", time.perf_counter()))
            rows.append([(label, (t - t0) * 1e6) for label, t in marks])
    first = [label for label, _ in rows[0]]
    same = [r for r in rows if [label for label, _ in r] == first]
    return [(label, statistics.median(r[i][1] for r in same)) for i, label in enumerate(first)]


def device_kernels(step: Callable[[], None], steps: int = 10) -> dict[str, tuple[float, float]]:
    """{kernel: (device microseconds a step, launches a step)} of ``step`` (CUDA),
    from ``torch.profiler`` over ``steps`` calls after two warm-up calls."""
    import torch  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return {
        e.key: (e.device_time_total / steps, e.count / steps)
        for e in prof.key_averages()
        if e.device_time_total > 0
    }


def _kernel_name(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def print_profile(name: str, torch_step, warp_step, device: str, rows: int = 25) -> None:
    """Prints scene ``name``'s host timeline of ``torch_step`` and, on CUDA, the device
    kernels of ``torch_step`` and ``warp_step`` side by side (the ``rows`` costliest)."""
    import torch  # noqa: PLC0415

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(f"\n{name}: torch step, host timeline (us from the step's start, medians)")
    for label, t in host_timeline(torch_step, sync):
        print(f"  {t:9.1f}  {label}")
    if not cuda:
        return
    ours = device_kernels(torch_step)
    theirs = device_kernels(warp_step)
    print(f"\n{name}: device kernels a step (us; x launches), torch step | Warp eager step")
    print(f"  total {sum(t for t, _ in ours.values()):9.1f} | "
          f"{sum(t for t, _ in theirs.values()):9.1f}")  # fmt: skip

    def cost(k):
        return max(ours.get(k, (0.0, 0.0))[0], theirs.get(k, (0.0, 0.0))[0])

    keys = sorted(set(ours) | set(theirs), key=cost, reverse=True)
    for k in keys[:rows]:
        a, b = ours.get(k), theirs.get(k)
        left = f"{a[0]:9.1f} x{a[1]:4.1f}" if a else f"{'-':>9} {'':5}"
        right = f"{b[0]:9.1f} x{b[1]:4.1f}" if b else f"{'-':>9} {'':5}"
        print(f"  {left} | {right}  {_kernel_name(k)}")
