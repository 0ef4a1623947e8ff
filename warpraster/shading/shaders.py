"""Shaders: PyTorch3D's Phong, Gouraud, flat and silhouette shaders on Warp arrays.

A shader turns fragments into an RGBA image as PyTorch3D's does: a colour per
slot ``(n, y, x, k)``, then a blend over the K slots:

* Phong: position and vertex normal interpolated with the barycentrics, lit per
  slot: ``(ambient + diffuse) * texel + specular``;
* flat: the face centroid and face normal, lit the same way;
* Gouraud: every vertex lit (``colour * (ambient + diffuse) + specular``), then
  the lit vertex colours interpolated;
* silhouette: white;

and the blend is hard for the ``Hard*`` shaders, softmax for
``Soft*Phong``/``SoftGouraud`` (with the camera's znear/zfar, 1 and 100 if it has
none), sigmoid alpha for the silhouette.

Phong and flat shaders light and blend in one pixel kernel
(:mod:`warpraster.shading.fused`): no per-slot colour array is written, and its
hand-written adjoint sends gradients to the world vertices (through the
interpolated positions and through the barycentrics into the rasterizer's own
backward), the normals (and from them the vertices, when the normals were
computed on the same tape), vertex colours or texels, light, material and camera
(R, T: the specular term's eye position) arrays with ``requires_grad``.
:func:`shade_slots` gives the per-slot colours alone (for a blend of your own).

Positions, normals, lights and the eye are in world space, as PyTorch3D's
``MeshRenderer`` uses them. Textures: ``None`` (white), a ``TexturesVertex``-like
object (``verts_features``), a ``TexturesUV``-like object (sampled per slot by
its own ``sample`` method), or a (N, H, W, K) ``vec3`` texel array.
"""

from __future__ import annotations

import warp as wp

from ..backward.tape import active_tape
from ..geometry import finite_vec3
from ..grad_buffers import clear_if_recording, note_on_tape
from ..meshes import as_faces_array, as_index_array, as_vec3_array
from ..structs import StructCache, placeholder
from .blending import BlendParams, check_fragments, launch_sigmoid_blend, z_param
from .fused import (
    ShadeInputs,
    camera_centre,
    launch_shade_blend,
    lit_colour_toward,
    new_inputs,
    slot_colour,
)
from .interpolate import interpolate_vertex_attributes
from .lighting import LightsBase, PointLights
from .materials import Materials, face_materials_array
from .mipmap import TexturesUVMipmap
from .modes import BlendMode, ShadingMode, TexelSource
from .normals import face_normals, vertex_normals
from .pixel_args import pixel_fragments
from .shading_buffers import FaceTables, ShadingBuffers, gather_faces
from .shading_buffers import _gather_faces_kernel as _gather_faces_kernel  # former home

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "HardFlatShader",
    "HardGouraudShader",
    "HardPhongShader",
    "ShaderBase",
    "ShadingBuffers",
    "ShadingMode",
    "SoftGouraudShader",
    "SoftPhongShader",
    "SoftSilhouetteShader",
    "TexelSource",
    "shade_slots",
    "shade_vertices",
]


# ----------------------------------------------------------------------------- kernels
# ----------------------------------------------------------------------------- kernels
@wp.kernel
def _shade_slots_kernel(
    # Fragments in (plain arrays: as a PixelFragments struct, Warp's generated
    # backward of this kernel took 121 registers instead of 101 on sm_90):
    pix_to_face: wp.array4d(dtype=wp.int32),
    bary_coords: wp.array4d(dtype=wp.vec3),
    # Shading in (lit = 1):
    a: ShadeInputs,
    # Data out:
    colors_out: wp.array4d(dtype=wp.vec3),
):
    n, y, x, k = wp.tid()
    f = pix_to_face[n, y, x, k]
    c = wp.vec3(0.0)
    if f >= 0:
        eye = camera_centre(a.cam, n)
        c = slot_colour(a, n, y, x, k, f, bary_coords[n, y, x, k], eye)
    colors_out[n, y, x, k] = c


@wp.kernel
def _shade_vertices_kernel(
    # Mesh in:
    verts: wp.array(dtype=wp.vec3),
    normals: wp.array(dtype=wp.vec3),
    vert_colors: wp.array(dtype=wp.vec3),
    vert_to_mesh: wp.array(dtype=wp.int32),
    per_vertex_mesh: int,
    # Camera, light, material in (texel_source: white or vertex colours):
    a: ShadeInputs,
    # Data out:
    shaded_out: wp.array(dtype=wp.vec3),
):
    v = wp.tid()
    m = int(0)
    if per_vertex_mesh != 0:
        m = vert_to_mesh[v]
    texel = wp.vec3(1.0)
    if a.texel_source == TexelSource.VERTEX:
        texel = vert_colors[v]
    if not finite_vec3(verts[v]):
        # its faces are never drawn: a constant colour, so the adjoint sends nothing
        # (0 * inf) to the lights, materials, camera or colours
        shaded_out[v] = wp.vec3(0.0)
        return
    point = verts[v]
    eye = camera_centre(a.cam, m)
    shaded_out[v] = lit_colour_toward(a, m, m, point, normals[v], texel, eye - point)


# ----------------------------------------------------------------------------- helpers
def _camera_arrays(cameras, device):
    if cameras is None:
        raise ValueError(
            "cameras must be specified either at initialization or in the call of the shader"
        )
    R, T = getattr(cameras, "R", None), getattr(cameras, "T", None)
    if not isinstance(R, wp.array) or not isinstance(T, wp.array):
        raise TypeError(f"cameras must be a warpraster camera, got {type(cameras).__name__}")
    if R.dtype != wp.mat33:
        R = R.view(wp.mat33) if R.dtype == wp.float32 else R
    if T.dtype != wp.vec3:
        T = as_vec3_array(T, "cameras.T", device)
    if wp.get_device(R.device) != wp.get_device(device):
        raise ValueError(f"cameras are on device {R.device}, the fragments on {device}")
    return R, T


def _z_planes(cameras, znear, zfar, device, cache: dict):
    """znear/zfar arrays: the call's, else the camera's, else PyTorch3D's 1 and 100."""
    out = []
    for name, given, default in (("znear", znear, 1.0), ("zfar", zfar, 100.0)):
        val = given if given is not None else getattr(cameras, name, None)
        out.append(z_param(default if val is None else val, name, device, cache))
    return out


def _vertex_colors(textures, num_verts: int, device):
    feats = getattr(textures, "verts_features", None)
    if feats is None:
        return None
    if isinstance(feats, wp.array) and feats.dtype == wp.float32 and feats.ndim == 2:
        if feats.shape[1] != 3:
            raise ValueError(f"textures must have 3 channels (RGB), got {feats.shape[1]}")
    arr = as_vec3_array(feats, "textures.verts_features", device)
    if arr.shape[0] != num_verts:
        raise ValueError(
            f"textures.verts_features has {arr.shape[0]} rows for {num_verts} vertices"
        )
    return arr


def texel_source(
    textures,
    fragments,
    verts,
    faces,
    device,
    *,
    buffers=None,
    verts_ndc=None,
    perspective_correct: bool = True,
):
    """(TexelSource, vertex colours, texel array) for ``textures`` (see module docs).

    Vertex colours are read by the shading kernel itself (fused); other textures
    are sampled per slot by their ``sample_textures`` into ``buffers.texels``.
    """
    dummy_v = placeholder(wp.vec3, 1, device)
    dummy_t = placeholder(wp.vec3, 4, device)
    if textures is None:
        return TexelSource.WHITE, dummy_v, dummy_t
    if isinstance(textures, wp.array):
        shape = tuple(fragments.pix_to_face.shape)
        if textures.dtype != wp.vec3 or tuple(textures.shape) != shape:
            raise ValueError(f"a texel array must be vec3 of shape {shape}, got {textures.shape}")
        return TexelSource.PIXEL, dummy_v, textures
    vc = _vertex_colors(textures, verts.shape[0], device)
    if vc is not None:
        return TexelSource.VERTEX, vc, dummy_t
    sample = getattr(textures, "sample_textures", None)
    if sample is None:
        raise TypeError(
            "textures must be None, a TexturesVertex, a TexturesUV(Mipmap) or a (N, H, W, K) "
            f"vec3 texel array, got {type(textures).__name__}"
        )
    if getattr(textures, "channels", 3) != 3:
        raise ValueError(f"textures must have 3 channels (RGB), got {textures.channels}")
    out = None if buffers is None else buffers.texels
    extra = {}
    if buffers is not None and isinstance(textures, TexturesUVMipmap):
        extra["corners"] = buffers.corner_tables(faces.shape[0])
        extra["corner_lists"] = buffers.corner_lists
    texels = sample(
        fragments,
        faces,
        verts_ndc=verts_ndc,
        perspective_correct=perspective_correct,
        out=out,
        validate=buffers is None,
        **extra,
    )
    return TexelSource.PIXEL, dummy_v, texels


def _normals(kind: str, given, verts, faces, device, buffers: ShadingBuffers):
    """Given normals (checked), else computed from ``verts`` into ``buffers`` (on the tape)."""
    if given is not None:
        arr = as_vec3_array(given, f"{kind}_normals", device)
        want = verts.shape[0] if kind == "verts" else faces.shape[0]
        if arr.shape[0] != want:
            raise ValueError(f"{kind}_normals must have {want} rows, got {arr.shape[0]}")
        return arr
    if kind == "verts":
        return vertex_normals(verts, faces, out=buffers.verts_normals,
                              sums_out=buffers.normal_sums, validate=False,
                              corner_lists=buffers.corner_lists)  # fmt: skip
    return face_normals(verts, faces, out=buffers.faces_normals, validate=False)


def lit_inputs(
    *, mode, texels_from, texels, tables: FaceTables, cameras_RT, lights, materials
) -> ShadeInputs:
    """The :class:`~warpraster.shading.fused.ShadeInputs` of a lit (Phong/flat) shade."""
    a = new_inputs(tables.pos.device)
    a.lit = 1
    a.mode = int(mode)
    a.texel_source = int(texels_from)
    a.faces = tables.corners
    a.texels = texels
    set_viewing(a, cameras_RT, lights, materials)
    return a


def set_viewing(a: ShadeInputs, cameras_RT, lights: LightsBase, materials: Materials) -> None:
    """Puts the camera (R, T), light and material arrays into ``a`` (its nested structs)."""
    cam, light, mat = a.cam, a.light, a.mat
    cam.R, cam.T = cameras_RT
    light.kind, light.param, light.ambient, light.diffuse, light.specular = lights.kernel_args()
    mat.ambient, mat.diffuse, mat.specular, mat.shininess = materials.kernel_args()


def _viewing_key(cameras_RT, lights: LightsBase, materials: Materials) -> tuple:
    """What :func:`set_viewing` puts into a struct (a :class:`StructCache` key)."""
    return (*cameras_RT, *lights.kernel_args(), *materials.kernel_args())


def shade_slots(
    fragments,
    verts,
    faces,
    normals,
    *,
    mode,
    texels_from,
    vert_colors,
    texels,
    cameras_RT,
    lights: LightsBase,
    materials: Materials,
    out,
    tables: FaceTables | None = None,
) -> wp.array:
    """Per-slot Phong/flat colours (N, H, W, K) ``vec3`` into ``out`` (no checks; on the tape).

    The shaders light and blend in one kernel; this gives the colours alone, for a
    blend of your own. ``tables``: preallocated :class:`FaceTables` (allocated
    here when None).
    """
    n, h, w, k = fragments.pix_to_face.shape
    device = fragments.pix_to_face.device
    nf = faces.shape[0]
    if tables is None or tables.num_faces != nf:
        tables = FaceTables(nf, device, out.requires_grad)
    gather_faces(verts, faces, normals, mode=mode, texels_from=texels_from,
                 vert_colors=vert_colors, tables=tables)  # fmt: skip
    a = lit_inputs(mode=mode, texels_from=texels_from, texels=texels, tables=tables,
                   cameras_RT=cameras_RT, lights=lights, materials=materials)  # fmt: skip
    wp.launch(
        _shade_slots_kernel,
        dim=(n, h, w, k),
        inputs=[fragments.pix_to_face, fragments.bary_coords, a],
        outputs=[out],
        device=device,
    )
    return out


def shade_vertices(
    verts,
    normals,
    vert_colors,
    texels_from,
    vert_to_mesh,
    *,
    cameras_RT,
    lights: LightsBase,
    materials: Materials,
    out,
    structs: StructCache | None = None,
) -> wp.array:
    """Launches the per-vertex (Gouraud) lighting kernel (no checks; on the tape).
    ``structs``: where to keep its argument struct between calls (optional)."""
    per_vertex = vert_to_mesh is not None
    v2m = vert_to_mesh if per_vertex else placeholder(wp.int32, 1, verts.device)
    if verts.shape[0] == 0:
        return out

    def build() -> ShadeInputs:
        a = new_inputs(verts.device)
        a.texel_source = int(texels_from)
        set_viewing(a, cameras_RT, lights, materials)
        return a

    key = (int(texels_from), *_viewing_key(cameras_RT, lights, materials))
    a = build() if structs is None else structs.get("vertex_inputs", key, build)
    wp.launch(
        _shade_vertices_kernel,
        dim=verts.shape[0],
        inputs=[verts, normals, vert_colors, v2m, int(per_vertex), a],
        outputs=[out],
        device=verts.device,
    )
    return out


# ----------------------------------------------------------------------------- shaders
class ShaderBase:
    """Holds cameras, lights, materials and blend parameters (PyTorch3D's ``ShaderBase``).

    Args (keyword-only):
        cameras: a warpraster camera (its ``R``, ``T`` give the eye position; FoV
            cameras' ``znear``/``zfar`` the softmax depth range). May be given per call.
        lights: default ``PointLights()``.
        materials: default ``Materials()``.
        blend_params: default ``BlendParams()``.
        device: Warp device of the default lights/materials.

    Call: ``shader(fragments, verts, faces, *, textures=None, vert_to_mesh=None,
    verts_normals=None, faces_normals=None, cameras=None, lights=None,
    materials=None, blend_params=None, znear=None, zfar=None, buffers=None)``:

        fragments: :class:`warpraster.Fragments` of the render.
        verts: (V, 3) world-space vertices (``vec3``/float32 Warp array or NumPy).
        faces: (F, 3) int32 packed faces.
        textures: see the module docs.
        vert_to_mesh: (V,) int32 mesh of each vertex (Gouraud with N > 1 meshes;
            derived from the faces on the device when not given).
        verts_normals / faces_normals: (V, 3) / (F, 3) normals to use instead of
            computing them from the vertices (area-weighted, as PyTorch3D).
        verts_ndc, perspective_correct: the projected vertices and the raster
            setting, for mip-mapped UV textures (UV derivatives).
        buffers: :class:`ShadingBuffers` for allocation-free calls.
        compact_slots: the fragments come from warpraster's rasterizer, whose
            filled slots come first in every pixel: the blend stops at the first
            empty slot. Leave False for fragments made otherwise.
        face_materials: (F,) int32 per-face rows of ``materials``, which is then a
            material table of any number of rows (Phong and flat shaders): face f
            is lit with row ``face_materials[f]``; gradients reach each row.
            None: one material per image (PyTorch3D).
        validate: check ``face_materials``' values on the host (pass False in a
            captured loop once they have been checked).

    Returns the (N, H, W, 4) float32 RGBA image (a Warp array).
    """

    mode: ShadingMode = ShadingMode.PHONG
    blend: BlendMode = BlendMode.HARD

    def __init_subclass__(
        cls, *, mode: ShadingMode | None = None, blend: BlendMode | None = None, **kwargs
    ):
        """A shader is its (``mode``, ``blend``) pair, given as class keywords."""
        super().__init_subclass__(**kwargs)
        if mode is not None:
            cls.mode = ShadingMode(mode)
        if blend is not None:
            cls.blend = BlendMode(blend)

    def __init__(
        self,
        *,
        cameras=None,
        lights: LightsBase | None = None,
        materials: Materials | None = None,
        blend_params: BlendParams | None = None,
        device=None,
    ):
        self.cameras = cameras
        self.lights = lights if lights is not None else PointLights(device=device)
        self.materials = materials if materials is not None else Materials(device=device)
        self.blend_params = blend_params if blend_params is not None else BlendParams()
        self._check_types(self.lights, self.materials, self.blend_params)
        self._cache: dict = {}

    @staticmethod
    def _check_types(lights, materials, blend_params):
        if not isinstance(lights, LightsBase):
            raise TypeError(f"lights must be a warpraster light, got {type(lights).__name__}")
        if not isinstance(materials, Materials):
            raise TypeError(f"materials must be Materials, got {type(materials).__name__}")
        if not isinstance(blend_params, BlendParams):
            raise TypeError(f"blend_params must be BlendParams, got {type(blend_params).__name__}")

    def __call__(
        self,
        fragments,
        verts,
        faces,
        *,
        textures=None,
        vert_to_mesh=None,
        verts_normals=None,
        faces_normals=None,
        cameras=None,
        lights: LightsBase | None = None,
        materials: Materials | None = None,
        blend_params: BlendParams | None = None,
        znear=None,
        zfar=None,
        verts_ndc=None,
        perspective_correct: bool = True,
        buffers: ShadingBuffers | None = None,
        compact_slots: bool = False,
        face_materials=None,
        validate: bool = True,
    ) -> wp.array:
        shape = check_fragments(fragments)
        device = fragments.pix_to_face.device
        cameras = self.cameras if cameras is None else cameras
        lights = self.lights if lights is None else lights
        materials = self.materials if materials is None else materials
        blend_params = self.blend_params if blend_params is None else blend_params
        self._check_types(lights, materials, blend_params)
        per_face = face_materials is not None
        for name, obj in (("lights", lights), ("materials", materials)):
            if per_face and obj is materials:
                continue  # a material table: any number of rows, checked with the ids
            if len(obj) not in (1, shape[0]):
                raise ValueError(
                    f"{name} has a batch of {len(obj)} for {shape[0]} images (expected 1 or N)"
                )
            if obj.device != wp.get_device(device):
                raise ValueError(f"{name} are on device {obj.device}, the fragments on {device}")
        v = as_vec3_array(verts, "verts", device)
        f = as_faces_array(faces, "faces", device)
        face_mat = None
        if per_face:
            if self.mode == ShadingMode.GOURAUD or self.blend == BlendMode.SIGMOID:
                raise ValueError(
                    "face_materials: per-face materials light faces per pixel (Phong and "
                    "flat shaders); Gouraud lights vertices and the silhouette has no material"
                )
            face_mat = face_materials_array(face_materials, f.shape[0], len(materials), device,
                                            validate=validate)  # fmt: skip
        if buffers is None:
            buffers = ShadingBuffers(
                shape, v.shape[0], f.shape[0], device, requires_grad=active_tape() is not None
            )
        elif not buffers.matches(shape, v.shape[0], f.shape[0], device):
            raise ValueError(
                "buffers were made for another image shape, vertex or face count or device"
            )
        else:
            clear_if_recording(buffers)  # reused: its gradients start from zero
        # the texture's arrays reach the kernels inside structs: tape.zero() must know them
        note_on_tape(*(getattr(textures, name, None)
                       for name in ("maps", "verts_uvs", "verts_features")))  # fmt: skip
        if buffers.corner_lists is not None:
            buffers.corner_lists.check(f, v.shape[0], "buffers.corner_lists")
        frag_key = (
            fragments.pix_to_face,
            fragments.bary_coords,
            fragments.zbuf,
            fragments.dists,
        )
        frag = buffers.structs.get("fragments", frag_key, lambda: pixel_fragments(fragments))
        buffers.loss_armed = None
        if self.blend == BlendMode.SIGMOID:
            colors = self._colors(fragments, v, f, buffers=buffers)
            launch_sigmoid_blend(frag, colors, float(blend_params.sigma), buffers.image)
            return buffers.image
        RT = _camera_arrays(cameras, device)
        slot = self._slot_inputs(
            fragments,
            v,
            f,
            textures=textures,
            vert_to_mesh=vert_to_mesh,
            verts_normals=verts_normals,
            faces_normals=faces_normals,
            cameras_RT=RT,
            lights=lights,
            materials=materials,
            buffers=buffers,
            device=device,
            verts_ndc=verts_ndc,
            perspective_correct=perspective_correct,
        )
        blend = self._blend_fields(cameras, blend_params, znear, zfar, device, compact_slots)
        fields = {**slot, **blend}
        if face_mat is not None:
            fields["face_material"] = face_mat
            fields["material_per_face"] = 1

        def build() -> ShadeInputs:
            a = new_inputs(device)
            for name, value in fields.items():
                setattr(a, name, value)
            if slot["lit"] != 0:
                a.faces = buffers.face_tables.corners
            set_viewing(a, RT, lights, materials)
            return a

        key = (*fields.values(), *_viewing_key(RT, lights, materials))
        inputs = buffers.structs.get("inputs", key, build)
        buffers.loss_armed = launch_shade_blend(
            frag, inputs, buffers.image, buffers.image_grad, specialize=buffers.specialize
        )
        return buffers.image

    # -- step 1
    def _slot_inputs(
        self,
        fragments,
        v,
        f,
        *,
        textures,
        vert_to_mesh,
        verts_normals,
        faces_normals,
        cameras_RT,
        lights,
        materials,
        buffers,
        device,
        verts_ndc,
        perspective_correct,
    ) -> dict:
        """Launches the per-vertex or per-face work of the slot colours; returns the
        :class:`ShadeInputs` fields (other than camera, light and material) they give."""
        if (
            self.mode == ShadingMode.GOURAUD
            and textures is not None
            and (_vertex_colors(textures, v.shape[0], device) is None)
        ):
            raise ValueError("Gouraud shading needs vertex colours (TexturesVertex) or None")
        src, vc, tx = texel_source(
            textures,
            fragments,
            v,
            f,
            device,
            buffers=buffers,
            verts_ndc=verts_ndc,
            perspective_correct=perspective_correct,
        )
        if self.mode == ShadingMode.GOURAUD:
            nrm = _normals("verts", verts_normals, v, f, device, buffers)
            n_img = fragments.pix_to_face.shape[0]
            v2m = None
            if n_img > 1:
                if vert_to_mesh is None:
                    raise ValueError(
                        "vert_to_mesh ((V,) int32 mesh of each vertex) is required for "
                        "Gouraud shading of more than one mesh"
                    )
                v2m = as_index_array(vert_to_mesh, "vert_to_mesh", device, length=v.shape[0])
            shaded = buffers.shaded_verts
            if v.shape[0] == 0:
                shaded = shaded[:0]
            shade_vertices(v, nrm, vc, src, v2m, cameras_RT=cameras_RT, lights=lights,
                           materials=materials, out=shaded, structs=buffers.structs)  # fmt: skip
            colors = interpolate_vertex_attributes(
                fragments.pix_to_face,
                fragments.bary_coords,
                shaded,
                f,
                out=buffers.colors,
                validate=False,
            )
            return {"lit": 0, "colors": colors}
        if self.mode == ShadingMode.FLAT:
            nrm = _normals("faces", faces_normals, v, f, device, buffers)
        else:
            nrm = _normals("verts", verts_normals, v, f, device, buffers)
        gather_faces(v, f, nrm, mode=self.mode, texels_from=src, vert_colors=vc,
                     tables=buffers.face_tables, corner_lists=buffers.corner_lists)  # fmt: skip
        return {"lit": 1, "mode": int(self.mode), "texel_source": int(src), "texels": tx}

    # -- step 2
    def _blend_fields(self, cameras, blend_params, znear, zfar, device, compact_slots) -> dict:
        """The blend's :class:`ShadeInputs` fields."""
        fields = {
            "blend": int(self.blend),
            "background": blend_params.background_array(device),
            "sigma": float(blend_params.sigma),
            "gamma": float(blend_params.gamma),
            "compact": int(bool(compact_slots)),
        }
        if self.blend == BlendMode.SOFTMAX:
            fields["znear"], fields["zfar"] = _z_planes(cameras, znear, zfar, device, self._cache)
        return fields


class HardPhongShader(ShaderBase, mode=ShadingMode.PHONG, blend=BlendMode.HARD):
    """Per-pixel lighting, nearest face's colour (PyTorch3D's ``HardPhongShader``)."""


class SoftPhongShader(ShaderBase, mode=ShadingMode.PHONG, blend=BlendMode.SOFTMAX):
    """Per-pixel lighting, softmax blend of the K faces (PyTorch3D's ``SoftPhongShader``)."""


class HardGouraudShader(ShaderBase, mode=ShadingMode.GOURAUD, blend=BlendMode.HARD):
    """Per-vertex lighting, nearest face's colour (PyTorch3D's ``HardGouraudShader``)."""


class SoftGouraudShader(ShaderBase, mode=ShadingMode.GOURAUD, blend=BlendMode.SOFTMAX):
    """Per-vertex lighting, softmax blend (PyTorch3D's ``SoftGouraudShader``)."""


class HardFlatShader(ShaderBase, mode=ShadingMode.FLAT, blend=BlendMode.HARD):
    """Per-face lighting (centroid, face normal), nearest face (PyTorch3D's ``HardFlatShader``)."""


class SoftSilhouetteShader(ShaderBase, blend=BlendMode.SIGMOID):
    """Sigmoid-alpha silhouette, RGB ones (PyTorch3D's ``SoftSilhouetteShader``).

    Only ``blend_params`` matters (sigma); use ``blur_radius = log(1/1e-4 - 1) * sigma``
    in the rasterizer, as SoftRas. ``verts``/``faces`` are accepted for a uniform call.
    """

    def __init__(self, *, blend_params: BlendParams | None = None, **kwargs):
        super().__init__(blend_params=blend_params, **kwargs)

    def _colors(self, fragments, v, f, *, buffers):
        return buffers.ones
