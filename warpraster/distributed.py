"""Ranks, devices and frame shards for runs over several GPUs and machines.

Opt-in: ``import warpraster`` never imports this module, and importing it
imports neither torch nor ``torch.distributed`` (only :func:`init_process_group`
does, when called). Nothing is initialised at import.

The engine is the one users already run: ``torchrun`` starts one process per
GPU and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``
in each process's environment. This module reads them (:func:`rank_info`),
picks the device a rank renders on (:func:`device_for_rank`) and splits a
range of frames (or of simulated worlds, or of any indices) between the ranks
so that every index is handled by exactly one rank (:func:`shard_frames`).

A frame-rendering loop sharded over ``torchrun --nnodes 2 --nproc_per_node 8``::

    from warpraster.distributed import device_for_rank, rank_info, shard_frames

    info = rank_info()
    device = device_for_rank(info.local_rank)
    for frame in shard_frames(range(first, last + 1), info.rank, info.world_size):
        render_and_write(frame, device=device)  # each rank writes its own frames
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "RankInfo",
    "ShardMode",
    "device_for_rank",
    "init_process_group",
    "rank_info",
    "shard_frames",
]


# ----------------------------------------------------------------------------- ranks
@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a (possibly single-process) run.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        world_size: number of processes over all machines.
        local_rank: rank among this machine's processes, ``0 <= local_rank <
            local_world_size``; the GPU index a rank uses by convention.
        local_world_size: number of processes on this machine.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    def __post_init__(self):
        for name in ("rank", "world_size", "local_rank", "local_world_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size - 1}], got {self.rank}")
        if self.local_world_size < 1 or self.local_world_size > self.world_size:
            raise ValueError(
                f"local_world_size must be in [1, world_size={self.world_size}], "
                f"got {self.local_world_size}"
            )
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank must be in [0, {self.local_world_size - 1}], got {self.local_rank}"
            )

    @property
    def is_distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 (the one that prints summaries)."""
        return self.rank == 0


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank, world size, local rank and local world size.

    Read from ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``
    (what ``torchrun`` sets). Without them (a plain ``python`` run) the process
    is rank 0 of 1. A missing ``LOCAL_RANK`` defaults to ``RANK`` and a missing
    ``LOCAL_WORLD_SIZE`` to ``WORLD_SIZE`` (one machine).

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        :class:`RankInfo`.

    Raises:
        ValueError: a variable that is not an integer, or values that do not fit
            together (e.g. ``RANK >= WORLD_SIZE``), naming the variable.
    """
    env = os.environ if environ is None else environ
    world = _env_int(env, "WORLD_SIZE", 1)
    rank = _env_int(env, "RANK", 0)
    local_rank = _env_int(env, "LOCAL_RANK", rank)
    local_world = _env_int(env, "LOCAL_WORLD_SIZE", world)
    try:
        return RankInfo(rank, world, local_rank, local_world)
    except ValueError as e:
        raise ValueError(
            f"inconsistent torchrun environment (RANK={rank}, WORLD_SIZE={world}, "
            f"LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world}): {e}"
        ) from None


# ----------------------------------------------------------------------------- devices
def device_for_rank(
    local_rank: int | None = None, *, device: str | None = None, cuda_count: int | None = None
) -> str:
    """The Warp (and torch) device name a rank renders on.

    ``cuda:<local_rank>`` when CUDA is present: one GPU per process, the
    ``torchrun`` convention. When each process sees a single GPU (e.g. a
    scheduler sets ``CUDA_VISIBLE_DEVICES`` per process) it is ``cuda:0`` for
    every local rank. Without CUDA, ``cpu``. The name is the same in Warp and in
    torch (both number the visible GPUs alike).

    Args:
        local_rank: the rank on this machine (default: :func:`rank_info`'s).
        device: an explicit choice (``"cpu"``, ``"cuda:1"``), returned as given;
            a command-line ``--device`` goes here.
        cuda_count: visible CUDA devices (default: Warp's count; initialises
            Warp). For tests and for callers that already know it.

    Returns:
        ``"cuda:<i>"`` or ``"cpu"``.

    Raises:
        ValueError: more local ranks than GPUs (``local_rank >= cuda_count > 1``):
            two ranks sharing one GPU is a launch mistake (``--nproc_per_node``
            larger than the GPU count), not something to paper over.
    """
    if device is not None:
        if not isinstance(device, str):
            raise TypeError(f"device must be a device name (str), got {type(device).__name__}")
        return device
    if local_rank is None:
        local_rank = rank_info().local_rank
    if isinstance(local_rank, bool) or not isinstance(local_rank, int) or local_rank < 0:
        raise ValueError(f"local_rank must be an int >= 0, got {local_rank!r}")
    if cuda_count is None:
        import warp as wp

        wp.init()
        cuda_count = wp.get_cuda_device_count()
    if cuda_count <= 0:
        return "cpu"
    if cuda_count == 1:
        return "cuda:0"
    if local_rank >= cuda_count:
        raise ValueError(
            f"local_rank {local_rank} has no GPU of its own: {cuda_count} CUDA devices are "
            f"visible (start at most {cuda_count} processes per machine, e.g. "
            f"torchrun --nproc_per_node {cuda_count})"
        )
    return f"cuda:{local_rank}"


# ----------------------------------------------------------------------------- sharding
class ShardMode(IntEnum):
    """How :func:`shard_frames` splits a range between ranks.

    Attributes:
        BLOCKS: contiguous blocks, in rank order; block sizes differ by at most
            one (the first ``n % world_size`` ranks take one more). Good for
            caches that favour neighbouring frames (animation, USD time samples).
        ROUND_ROBIN: rank r takes items r, r + world_size, ...; balances work
            that grows along the range (scenes that fill up over time).
    """

    BLOCKS = 0
    ROUND_ROBIN = 1


def _check_index(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def shard_frames(
    frames: int | range | Sequence,
    rank: int | None = None,
    world_size: int | None = None,
    *,
    mode: ShardMode | str = ShardMode.BLOCKS,
) -> range | list:
    """The part of ``frames`` that rank ``rank`` of ``world_size`` handles.

    Over all ranks the parts are disjoint and their union is ``frames``: every
    frame is handled by exactly one rank, none is lost or handled twice. The
    split depends only on ``(len(frames), rank, world_size, mode)``, so every
    rank computes its part without communicating. Ranks beyond the frame count
    (``world_size > len(frames)``) get an empty part. The same function splits
    simulated worlds, batches or any other index range between ranks or devices.

    Args:
        frames: a count ``n`` (frames ``0 .. n-1``), a ``range`` (e.g.
            ``range(first, last + 1, step)``) or a sequence of frame ids (time
            codes, file names).
        rank: this rank (default: :func:`rank_info`'s, with ``world_size``).
        world_size: number of ranks (give both or neither).
        mode: :class:`ShardMode` (or its name, ``"blocks"`` / ``"round_robin"``).

    Returns:
        A ``range`` for an int or a ``range`` (lazy: no list of frames is
        built), else a list of ``frames``' items, in their original order.

    Raises:
        TypeError, ValueError: a negative count, ``rank`` outside
            ``[0, world_size)``, ``world_size < 1``, an unknown mode.
    """
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither (read from the environment)")
    if rank is None:
        info = rank_info()
        rank, world_size = info.rank, info.world_size
    rank = _check_index(rank, "rank")
    world_size = _check_index(world_size, "world_size")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size - 1}], got {rank}")
    if isinstance(mode, str):
        try:
            mode = ShardMode[mode.strip().upper()]
        except KeyError:
            names = ", ".join(m.name.lower() for m in ShardMode)
            raise ValueError(f"mode must be one of {names}, got {mode!r}") from None
    elif not isinstance(mode, ShardMode):
        raise TypeError(f"mode must be a ShardMode or its name, got {type(mode).__name__}")

    if isinstance(frames, bool):
        raise TypeError("frames must be a count, a range or a sequence, got bool")
    if isinstance(frames, int):
        if frames < 0:
            raise ValueError(f"frames must be >= 0 when a count, got {frames}")
        frames = range(frames)
    elif isinstance(frames, (str, bytes)) or not isinstance(frames, Sequence):
        raise TypeError(
            f"frames must be a count, a range or a sequence, got {type(frames).__name__}"
        )
    n = len(frames)
    if mode is ShardMode.ROUND_ROBIN:
        part = frames[rank::world_size]
    else:
        base, extra = divmod(n, world_size)
        start = rank * base + min(rank, extra)
        part = frames[start : start + base + (1 if rank < extra else 0)]
    return part if isinstance(part, range) else list(part)


# ----------------------------------------------------------------------------- torch
def init_process_group(
    backend: str | None = None, *, device: str | None = None, timeout_s: float | None = None
) -> RankInfo:
    """Initialises ``torch.distributed`` from the ``torchrun`` environment (opt-in).

    Imports torch here, not at module import. A no-op when the default process
    group already exists, and when the run is a single process without a
    rendezvous address (``WORLD_SIZE`` unset or 1 and no ``MASTER_ADDR``): a
    plain ``python`` run then behaves as rank 0 of 1. On a CUDA device it also
    makes that device torch's current one (NCCL needs it; Warp's default device
    is left alone: pass ``device=`` to warpraster calls).

    Args:
        backend: ``"nccl"`` or ``"gloo"``; default ``nccl`` on CUDA, else ``gloo``.
        device: this rank's device (default :func:`device_for_rank`).
        timeout_s: the group's timeout in seconds (default torch's).

    Returns:
        :class:`RankInfo` of this process.
    """
    import datetime

    import torch
    import torch.distributed as dist

    info = rank_info()
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed")
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if (rank, world) == (info.rank, info.world_size):
            return info
        # started without torchrun (e.g. torch.multiprocessing.spawn): one machine
        return RankInfo(rank, world, rank, world)
    if not info.is_distributed and "MASTER_ADDR" not in os.environ:
        return info
    device = device_for_rank(info.local_rank, device=device)
    if backend is None:
        backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    kwargs = {}
    if timeout_s is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=float(timeout_s))
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size, **kwargs)
    return info
