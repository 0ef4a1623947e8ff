"""Renderers: rasterize and shade in one call.

* :class:`MeshRenderer` is PyTorch3D's ``MeshRenderer`` for migrating code:
  ``MeshRenderer(rasterizer=MeshRasterizer(cameras=..., raster_settings=...),
  shader=SoftPhongShader(...))``, called on a packed batch of world-space meshes.
  Convenient, validating, allocating per call.
* :class:`Renderer` is the Warp-native object: it owns every buffer (projected
  vertices, the raster workspace, normals, per-slot colours, image and the
  extra channels), allocates nothing per call and reads nothing back, so a render
  (with a loss and ``tape.backward()``) can be captured in one graph.
"""

from __future__ import annotations

import warp as wp

from .camera import vert_to_mesh_from_faces
from .fragments import Fragments
from .meshes import as_faces_array, as_index_array, as_vec3_array
from .rasterizer import MeshRasterizer
from .shading.shaders import ShaderBase

__all__ = ["MeshRenderer"]


class MeshRenderer:
    """Rasterizer + shader, as PyTorch3D's ``MeshRenderer``.

    Args:
        rasterizer: a :class:`warpraster.MeshRasterizer` (cameras and settings).
        shader: one of the shaders of :mod:`warpraster.shading`.

    After a call, :attr:`fragments` holds the fragments the shader saw.
    """

    def __init__(self, rasterizer: MeshRasterizer, shader: ShaderBase):
        if not isinstance(rasterizer, MeshRasterizer):
            raise TypeError(f"rasterizer must be a MeshRasterizer, got {type(rasterizer).__name__}")
        if not isinstance(shader, ShaderBase):
            raise TypeError(f"shader must be a warpraster shader, got {type(shader).__name__}")
        self.rasterizer = rasterizer
        self.shader = shader
        self.fragments: Fragments | None = None

    def __call__(
        self,
        verts_world,
        faces,
        mesh_to_face_first_idx,
        num_faces_per_mesh,
        *,
        textures=None,
        return_fragments: bool = False,
        **shader_kwargs,
    ):
        """Renders a packed batch of world-space meshes (mesh n into image n).

        Args:
            verts_world: (V, 3) world-space vertices: ``wp.array`` of ``vec3`` or
                (V, 3) float32 (gradients arrive in its ``.grad`` on a ``wp.Tape``),
                or NumPy.
            faces: (F, 3) int32 packed faces.
            mesh_to_face_first_idx, num_faces_per_mesh: (N,) per-mesh face ranges.
            textures: ``None`` (white), ``TexturesVertex``, ``TexturesUV`` (see
                :mod:`warpraster.shading.shaders`).
            return_fragments: also return the fragments.
            **shader_kwargs: passed to the shader (``lights=``, ``materials=``,
                ``blend_params=``, ``verts_normals=``, ``znear=``, ...).

        Returns:
            The (N, H, W, 4) float32 RGBA image (``wp.array``), or ``(image,
            fragments)``. Gradients flow on a ``wp.Tape`` to the vertices, the
            textures and every light/material/camera array with ``requires_grad``.
        """
        cameras = shader_kwargs.pop("cameras", None) or self.rasterizer.cameras
        device = cameras.device if cameras is not None else None
        verts = as_vec3_array(verts_world, "verts_world", device)
        f = as_faces_array(faces, "faces", verts.device)
        first = as_index_array(mesh_to_face_first_idx, "mesh_to_face_first_idx", verts.device)
        count = as_index_array(num_faces_per_mesh, "num_faces_per_mesh", verts.device)
        v2m = None
        if first.shape[0] > 1:
            v2m = vert_to_mesh_from_faces(f, first, count, verts.shape[0], device=verts.device)
        needs_grad = verts.requires_grad or cameras.requires_grad()
        verts_ndc = wp.empty(verts.shape[0], dtype=wp.vec3, device=verts.device,
                             requires_grad=needs_grad)  # fmt: skip
        fragments = self.rasterizer(
            verts, f, first, count, cameras=cameras, vert_to_mesh=v2m, verts_ndc=verts_ndc
        )
        self.fragments = fragments
        shader_kwargs.setdefault("vert_to_mesh", v2m)
        shader_kwargs.setdefault("verts_ndc", verts_ndc)
        shader_kwargs.setdefault(
            "perspective_correct",
            self.rasterizer.resolved_settings(cameras)["perspective_correct"],
        )
        image = self.shader(
            fragments, verts, f, textures=textures, cameras=cameras, **shader_kwargs
        )
        return (image, fragments) if return_fragments else image
