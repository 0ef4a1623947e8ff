"""Textures on tensors: PyTorch3D's ``TexturesVertex`` and ``TexturesUV``, the
mip-mapped ``TexturesUVMipmap``, and the reader that packs any of them (ours, or
PyTorch3D's own objects, read by their public methods) for the render op.

Our classes take PyTorch3D's batched shapes (per-mesh lists, or padded (N, ...)
tensors with per-mesh local indices) and, as before, the packed shapes of a
``MeshRenderer`` call on packed tensors ((V, C) features; (F, 3) UV faces
indexing (T, 2) UVs over the whole batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..shading import BoundaryMode, FilterMode
from ..shading.textures import PaddingMode, SamplingMode, parse_enum
from .cameras import _f32, _Holder
from .checks import ReadOnce, check_index_range, float_tensor, int_tensor, to_int32

__all__ = ["TexturesUV", "TexturesUVMipmap", "TexturesVertex"]


def _tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def _batched(x, name: str, packed_ndim: int):
    """(kind, value): ``x`` as "packed" (a tensor of ``packed_ndim`` dims), "padded"
    (one more leading dim) or "list" (of packed-shaped tensors)."""
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, torch.Tensor) for t in x):
        items = list(x)
        if any(t.ndim != packed_ndim for t in items):
            raise ValueError(f"{name}: every tensor of the list must have {packed_ndim} dims")
        return "list", items
    t = _tensor(x)
    if t.ndim == packed_ndim:
        return "packed", t
    if t.ndim == packed_ndim + 1:
        return "padded", t
    raise ValueError(f"{name} must have {packed_ndim} dims (packed) or {packed_ndim + 1} "
                     f"(padded per mesh), got shape {tuple(t.shape)}")  # fmt: skip


class TexturesVertex(_Holder):
    """PyTorch3D's ``TexturesVertex``: ``verts_features`` (N, V, 3) padded or a list of
    (V_i, 3) (PyTorch3D's shapes), or (V, 3) packed over the whole batch (RGB: the
    shaders read three channels, so other widths are refused here)."""

    _names = ("verts_features",)
    _warp = "TexturesVertex"

    def __init__(self, verts_features):
        self._kind, value = _batched(verts_features, "verts_features", 2)
        items = value if self._kind == "list" else [value]
        for t in items:  # RGB: the shaders read three channels
            float_tensor(t, "verts_features", t.ndim, (None,) * (t.ndim - 2) + (3,))
        if self._kind == "list":
            self._list = items
            self.verts_features = None
        else:
            self.verts_features = _f32(value) if self._kind == "packed" else value

    def to(self, device):
        if self._kind == "list":
            self._list = [t.to(device) for t in self._list]
        else:
            self.verts_features = self.verts_features.to(device)
        return self

    def verts_features_list(self) -> list[torch.Tensor]:
        if self._kind == "list":
            return list(self._list)
        if self._kind == "padded":
            return list(self.verts_features.unbind(0))
        return [self.verts_features]

    def verts_features_padded(self) -> torch.Tensor:
        if self._kind == "list":
            return torch.nn.utils.rnn.pad_sequence(self._list, batch_first=True)
        return self.verts_features if self._kind == "padded" else self.verts_features[None]

    def verts_features_packed(self) -> torch.Tensor:
        if self._kind == "packed":
            return self.verts_features
        return torch.cat(self.verts_features_list())


class TexturesUV(_Holder):
    """PyTorch3D's ``TexturesUV``: ``maps`` (N, Ht, Wt, C) one per mesh (row 0 at
    v = 1, as PyTorch3D) or (1, Ht, Wt, C) shared; ``faces_uvs`` (N, F, 3) or a list
    of (F_i, 3) with ``verts_uvs`` (N, T, 2) or a list of (T_i, 2) (PyTorch3D's
    shapes: per-mesh indices), or packed (F, 3) indexing (T, 2) over the batch."""

    _names = ("maps", "verts_uvs")
    _warp = "TexturesUV"

    def __init__(self, maps, faces_uvs, verts_uvs, padding_mode="border", align_corners=True,
                 sampling_mode="bilinear"):  # fmt: skip
        self._set_geometry(maps, faces_uvs, verts_uvs)
        self.padding_mode, self.align_corners = padding_mode, bool(align_corners)
        self.sampling_mode = sampling_mode
        parse_enum(padding_mode, PaddingMode, "padding_mode")
        parse_enum(sampling_mode, SamplingMode, "sampling_mode")

    def _set_geometry(self, maps, faces_uvs, verts_uvs) -> None:
        if isinstance(maps, (list, tuple)):
            maps = torch.stack([_tensor(m) for m in maps])
        maps = _tensor(maps)
        float_tensor(maps, "maps", 4, (None, None, None))
        self.maps = _f32(maps)
        fk, fv = _batched(faces_uvs, "faces_uvs", 2)
        vk, vv = _batched(verts_uvs, "verts_uvs", 2)
        if (fk == "packed") != (vk == "packed"):
            raise ValueError("faces_uvs and verts_uvs must both be packed or both per mesh")
        faces = fv if fk == "list" else (list(fv.unbind(0)) if fk == "padded" else [fv])
        uvs = vv if vk == "list" else (list(vv.unbind(0)) if vk == "padded" else [vv])
        if len(faces) != len(uvs):
            raise ValueError(f"faces_uvs has {len(faces)} meshes, verts_uvs {len(uvs)}")
        for f, uv in zip(faces, uvs, strict=True):
            float_tensor(uv, "verts_uvs", 2, (2,))
            int_tensor(f, "faces_uvs", 2, 3)
            check_index_range(f, "faces_uvs", uv.shape[0], "UVs in verts_uvs")
        self.packed = fk == "packed"
        self._faces_list, self._uvs_list = faces, [_f32(uv) for uv in uvs]
        if self.packed:
            self.faces_uvs, self.verts_uvs = to_int32(fv), _f32(vv)

    def to(self, device):
        self.maps = self.maps.to(device)
        self._faces_list = [f.to(device) for f in self._faces_list]
        self._uvs_list = [uv.to(device) for uv in self._uvs_list]
        if self.packed:
            self.faces_uvs, self.verts_uvs = self._faces_list[0], self._uvs_list[0]
        return self

    def maps_padded(self) -> torch.Tensor:
        return self.maps

    def maps_list(self) -> list[torch.Tensor]:
        return list(self.maps.unbind(0))

    def faces_uvs_list(self) -> list[torch.Tensor]:
        return list(self._faces_list)

    def verts_uvs_list(self) -> list[torch.Tensor]:
        return list(self._uvs_list)

    def _static(self) -> dict:
        return {
            "padding_mode": self.padding_mode,
            "align_corners": self.align_corners,
            "sampling_mode": self.sampling_mode,
        }


class TexturesUVMipmap(TexturesUV):
    """UV textures sampled mip-mapped, as :class:`warpraster.shading.TexturesUVMipmap`
    (nvdiffrast's ``texture``): the inputs of :class:`TexturesUV`, then nvdiffrast's
    ``filter_mode`` (default ``"linear-mipmap-linear"``), ``boundary_mode`` (``"wrap"``,
    ``"clamp"``, ``"zero"``), ``max_mip_level`` and ``flip_v`` (True: PyTorch3D's map
    rows). The pyramid is rebuilt from ``maps`` by every render, so gradients reach
    ``maps`` (through every level read) and ``verts_uvs``; the level comes from the
    UVs' screen-space derivatives, i.e. from the projected vertices."""

    _warp = "TexturesUVMipmap"

    def __init__(self, maps, faces_uvs, verts_uvs, *, filter_mode="linear-mipmap-linear",
                 boundary_mode="wrap", max_mip_level=None, flip_v=True):  # fmt: skip
        self._set_geometry(maps, faces_uvs, verts_uvs)
        self.filter_mode = parse_enum(filter_mode, FilterMode, "filter_mode")
        self.boundary_mode = parse_enum(boundary_mode, BoundaryMode, "boundary_mode")
        if max_mip_level is not None and (not isinstance(max_mip_level, int) or max_mip_level < 0):
            raise ValueError(f"max_mip_level must be None or an int >= 0, got {max_mip_level!r}")
        self.max_mip_level, self.flip_v = max_mip_level, bool(flip_v)

    def _static(self) -> dict:
        return {
            "filter_mode": int(self.filter_mode),
            "boundary_mode": int(self.boundary_mode),
            "max_mip_level": self.max_mip_level,
            "flip_v": self.flip_v,
        }


# ----------------------------------------------------------------------------- the reader
@dataclass
class PackedTextures:
    """A texture of one render, packed over the batch: ``kind`` (the Warp class),
    its tensors in the op's order and its static options."""

    kind: str
    tensors: list[torch.Tensor]
    static: dict = field(default_factory=dict)


#: per-mesh counts read back to the host once per unchanged tensor (on CUDA each read
#: waits for the device, and the render's launches could not be queued ahead of it)
_COUNTS = ReadOnce(64)


def _counts(x) -> list[int]:
    if not isinstance(x, torch.Tensor):
        return [int(c) for c in x]
    return _COUNTS.get(x, lambda t: [int(c) for c in t.tolist()])[0]


def _vertex_features(textures, num_verts: int, verts_per_mesh) -> torch.Tensor:
    """(V, C) features: ours packed as given, else per mesh (PyTorch3D's padded
    features cut to each mesh's vertex count when the meshes give it)."""
    if isinstance(textures, TexturesVertex) and textures._kind == "padded":
        feats = textures.verts_features
        if verts_per_mesh is not None:
            sizes = _counts(verts_per_mesh)
            if len(sizes) != feats.shape[0]:
                raise ValueError(f"textures.verts_features has {feats.shape[0]} meshes, "
                                 f"the meshes {len(sizes)}")  # fmt: skip
            return torch.cat([feats[i, :n] for i, n in enumerate(sizes)])
        return feats.reshape(-1, feats.shape[-1])
    return textures.verts_features_packed()


def _uv_geometry(textures, faces_per_mesh: list[int]):
    """(faces_uvs (F, 3) packed, verts_uvs (T, 2) packed) from per-mesh lists: mesh i's
    first F_i UV faces (PyTorch3D's padded rows past F_i are padding), shifted by the
    UVs of the meshes before it."""
    if isinstance(textures, TexturesUV) and textures.packed:
        return textures.faces_uvs, textures.verts_uvs
    faces, uvs = textures.faces_uvs_list(), textures.verts_uvs_list()
    if len(faces) != len(faces_per_mesh) or len(uvs) != len(faces_per_mesh):
        raise ValueError(f"textures have {len(faces)} meshes of UV faces and {len(uvs)} of "
                         f"UVs, the meshes {len(faces_per_mesh)}")  # fmt: skip
    out, offset = [], 0
    for i, (f, uv, n) in enumerate(zip(faces, uvs, faces_per_mesh, strict=True)):
        if f.shape[0] < n:
            raise ValueError(f"textures: mesh {i} has {f.shape[0]} UV faces for {n} faces")
        out.append(f[:n].to(torch.int64) + offset)
        offset += uv.shape[0]
    return torch.cat(out), torch.cat([_f32(uv) for uv in uvs])


def pack_textures(
    textures, num_verts: int, faces_per_mesh, verts_per_mesh=None, num_faces: int | None = None
):
    """The :class:`PackedTextures` of ``textures`` for a batch of meshes, or None.

    Reads ours and PyTorch3D's objects alike through their public methods:
    ``verts_features_packed()`` (``TexturesVertex``), ``maps_padded()``,
    ``faces_uvs_list()``, ``verts_uvs_list()``, ``padding_mode``, ``align_corners``,
    ``sampling_mode`` (``TexturesUV``).

    Raises:
        TypeError: not a texture this renderer reads (e.g. ``TexturesAtlas``, maps_ids).
        ValueError: texture rows that do not match the meshes.
    """
    if textures is None:
        return None
    name = type(textures).__name__
    if isinstance(textures, TexturesVertex) or hasattr(textures, "verts_features_packed"):
        feats = _f32(_vertex_features(textures, num_verts, verts_per_mesh))
        if feats.ndim != 2 or feats.shape[0] != num_verts:
            raise ValueError(f"textures.verts_features has {feats.shape[0]} rows for "
                             f"{num_verts} vertices in verts")  # fmt: skip
        return PackedTextures("TexturesVertex", [feats])
    if isinstance(textures, TexturesUV) or all(
        hasattr(textures, m) for m in ("maps_padded", "faces_uvs_list", "verts_uvs_list")
    ):
        ids = getattr(textures, "maps_ids_padded", None)
        if ids is not None and ids() is not None:
            raise TypeError(f"{name} with maps_ids (several maps per mesh) is not supported")
        packed_uv = isinstance(textures, TexturesUV) and textures.packed
        # packed UV faces need no per-mesh counts: F is the faces' row count
        counts = None if packed_uv and num_faces is not None else _counts(faces_per_mesh)
        faces_uvs, verts_uvs = _uv_geometry(textures, counts)
        total = num_faces if counts is None else sum(counts)
        if faces_uvs.shape[0] != total:
            raise ValueError(f"textures.faces_uvs has {faces_uvs.shape[0]} faces, "
                             f"faces has {total}")  # fmt: skip
        maps = _f32(textures.maps_padded())
        if isinstance(textures, TexturesUV):
            kind, static = textures._warp, textures._static()
        else:  # PyTorch3D's: its grid_sample options
            kind = "TexturesUV"
            static = {k: getattr(textures, k) for k in ("padding_mode", "sampling_mode")}
            static["align_corners"] = bool(textures.align_corners)
        return PackedTextures(kind, [maps, verts_uvs, to_int32(faces_uvs)], static)
    raise TypeError(f"textures must be TexturesVertex, TexturesUV or TexturesUVMipmap (ours "
                    f"or PyTorch3D's), got {name}")  # fmt: skip
