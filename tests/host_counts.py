"""Counting device allocations and host reads around a call (the "a step after the
first allocates nothing and reads nothing back" tests)."""

import contextlib

import warp as wp
import warp._src.context as ctx


@contextlib.contextmanager
def count_allocations_and_reads(monkeypatch):
    """Within the block, counts calls of the cpu device's allocator and of
    ``wp.array.numpy`` (a host read) into the yielded dict ``{"alloc", "numpy"}``;
    the patches are undone on exit (``monkeypatch.undo()``). CUDA allocations go
    through another allocator: run these tests on the cpu device."""
    calls = {"alloc": 0, "numpy": 0}
    real_alloc, real_numpy = ctx.CpuDefaultAllocator.allocate, wp.array.numpy

    def counting_alloc(self, size):
        calls["alloc"] += 1
        return real_alloc(self, size)

    def counting_numpy(self):
        calls["numpy"] += 1
        return real_numpy(self)

    monkeypatch.setattr(ctx.CpuDefaultAllocator, "allocate", counting_alloc)
    monkeypatch.setattr(wp.array, "numpy", counting_numpy)
    try:
        yield calls
    finally:
        monkeypatch.undo()
