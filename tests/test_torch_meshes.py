"""PyTorch3D code with its imports changed: the torch MeshRenderer / MeshRasterizer on a
``Meshes``-like object with its textures attached (ours in PyTorch3D's batched shapes,
and stand-ins of PyTorch3D's own texture classes, read by their public methods),
PyTorch3D's per-call keywords, mip-mapped UV textures, and every name exported from
``warpraster.torch``.

PyTorch3D is not a test dependency: ``_Meshes``, ``_P3DTexturesVertex`` and
``_P3DTexturesUV`` below offer only the public methods the renderer reads, with
PyTorch3D's shapes (padded UV faces whose rows past a mesh's face count are padding).
Equalities are exact (``torch.equal``): the same tensors reach the same custom op,
whichever form they came in.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import warpraster.torch as wrt  # noqa: E402
from warpraster.torch import (  # noqa: E402
    BlendParams,
    FoVPerspectiveCameras,
    HardPhongShader,
    Materials,
    MeshRasterizer,
    MeshRenderer,
    PerspectiveCameras,
    PointLights,
    RasterizationSettings,
    SoftPhongShader,
    SoftSilhouetteShader,
    TexturesUV,
    TexturesUVMipmap,
    TexturesVertex,
    look_at_rotation,
    look_at_view_transform,
)

# PyTorch3D's ``from pytorch3d.renderer import ...`` names used by its mesh tutorials
# and docs, all importable from warpraster.torch.
P3D_NAMES = (
    "AmbientLights BlendParams DirectionalLights FoVOrthographicCameras FoVPerspectiveCameras "
    "HardFlatShader HardGouraudShader HardPhongShader Materials MeshRasterizer MeshRenderer "
    "MeshRendererWithFragments PerspectiveCameras PointLights RasterizationSettings "
    "SoftGouraudShader SoftPhongShader SoftSilhouetteShader TexturesUV TexturesVertex "
    "camera_position_from_spherical_angles look_at_rotation look_at_view_transform"
).split()


# ----------------------------------------------------------------------------- stand-ins
class _Meshes:
    """The part of PyTorch3D's ``Meshes`` the renderer reads (lists of per-mesh verts
    and local faces, ``textures`` attached)."""

    def __init__(self, verts, faces, textures=None):
        self._verts, self._faces, self.textures = list(verts), list(faces), textures

    def verts_packed(self):
        return torch.cat(self._verts)

    def faces_packed(self):
        offsets = torch.tensor([0] + [len(v) for v in self._verts[:-1]]).cumsum(0)
        return torch.cat([f + o for f, o in zip(self._faces, offsets, strict=True)])

    def num_faces_per_mesh(self):
        return torch.tensor([len(f) for f in self._faces])

    def num_verts_per_mesh(self):
        return torch.tensor([len(v) for v in self._verts])

    def mesh_to_faces_packed_first_idx(self):
        return torch.cumsum(self.num_faces_per_mesh(), 0) - self.num_faces_per_mesh()


class _P3DTexturesVertex:
    """PyTorch3D's ``TexturesVertex`` public surface: per-mesh features, packed on demand."""

    def __init__(self, verts_features_list):
        self._list = verts_features_list

    def verts_features_list(self):
        return self._list

    def verts_features_packed(self):
        return torch.cat(self._list)


class _P3DTexturesUV:
    """PyTorch3D's ``TexturesUV`` public surface, padded as PyTorch3D pads: (N, Fmax, 3)
    UV faces (rows past a mesh's count are padding) and (N, Tmax, 2) UVs."""

    def __init__(self, maps, faces_uvs_padded, verts_uvs_padded, num_faces, **options):
        self._maps, self._faces, self._uvs, self._num_faces = (
            maps, faces_uvs_padded, verts_uvs_padded, num_faces)  # fmt: skip
        self.padding_mode = options.get("padding_mode", "border")
        self.align_corners = options.get("align_corners", True)
        self.sampling_mode = options.get("sampling_mode", "bilinear")

    def maps_padded(self):
        return self._maps

    def maps_ids_padded(self):
        return None

    def faces_uvs_list(self):
        return [f[:n] for f, n in zip(self._faces, self._num_faces, strict=True)]

    def verts_uvs_list(self):
        return list(self._uvs.unbind(0))


# ----------------------------------------------------------------------------- the scene
def _geometry():
    """Two meshes: a quad (4 verts, 2 faces) and a triangle (3 verts, 1 face), local
    faces, both in front of a camera at distance 3; per-mesh UVs (4 and 3 of them)."""
    quad = torch.tensor([[-0.8, -0.8, 0.0], [0.8, -0.8, 0.1], [0.8, 0.8, 0.0], [-0.8, 0.8, -0.1]])
    tri = torch.tensor([[-0.5, -0.6, 0.3], [0.6, -0.2, 0.2], [0.0, 0.7, 0.4]])
    faces = [torch.tensor([[0, 1, 2], [0, 2, 3]]), torch.tensor([[0, 1, 2]])]
    uvs = [torch.tensor([[0.1, 0.1], [0.9, 0.1], [0.9, 0.9], [0.1, 0.9]]),
           torch.tensor([[0.2, 0.3], [0.8, 0.4], [0.5, 0.9]])]  # fmt: skip
    return [quad, tri], faces, uvs


def _renderer(shader_cls=HardPhongShader, cameras=None, size=12, k=1, blur=0.0):
    if cameras is None:
        R, T = look_at_view_transform(dist=3.0, elev=15.0, azim=25.0)
        cameras = FoVPerspectiveCameras(R=R, T=T)
    settings = RasterizationSettings(image_size=size, faces_per_pixel=k, blur_radius=blur)
    if shader_cls is SoftSilhouetteShader:
        shader = SoftSilhouetteShader(blend_params=BlendParams(sigma=1e-4, gamma=1e-4))
    else:
        shader = shader_cls(cameras=cameras, lights=PointLights(location=((1.0, 2.0, 3.0),)))
    return MeshRenderer(MeshRasterizer(cameras=cameras, raster_settings=settings), shader)


def _leaves(tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def _grads(img, leaves, seed=0):
    g = torch.rand(img.shape, generator=torch.Generator().manual_seed(seed))
    (img * g).sum().backward()
    return [leaf.grad.clone() for leaf in leaves]


def _packed_call(renderer, verts, faces, textures, **kwargs):
    m = _Meshes(verts, faces)
    return renderer(m.verts_packed(), m.faces_packed(), m.mesh_to_faces_packed_first_idx(),
                    m.num_faces_per_mesh(), textures=textures, **kwargs)  # fmt: skip


# ----------------------------------------------------------------------------- textures
def _vertex_colours():
    return [torch.rand(4, 3, generator=torch.Generator().manual_seed(1)),
            torch.rand(3, 3, generator=torch.Generator().manual_seed(2))]  # fmt: skip


@pytest.mark.parametrize("form", ["ours_list", "ours_padded", "pytorch3d"])
def test_meshes_with_vertex_textures_match_the_packed_call(form):
    """A Meshes with per-vertex colours, ours as a list of (V_i, 3) or padded (N, V, 3)
    (PyTorch3D's shapes), or PyTorch3D's class, renders the packed call's image, and
    gradients reach the verts and colours identically."""
    ren = _renderer()
    verts, faces, _ = _geometry()
    cols = _vertex_colours()
    ref_v, ref_c = _leaves(verts), _leaves(cols)
    ref = _packed_call(ren, ref_v, faces, TexturesVertex(torch.cat(ref_c)))
    ref_grads = _grads(ref, ref_v + ref_c)

    v, c = _leaves(verts), _leaves(cols)
    if form == "ours_list":
        tex = TexturesVertex(c)
    elif form == "ours_padded":  # padded to 4 rows; the triangle's 4th row is padding
        tex = TexturesVertex(torch.stack([c[0], torch.cat([c[1], torch.zeros(1, 3)])]))
    else:
        tex = _P3DTexturesVertex(c)
    img = ren(_Meshes(v, faces, textures=tex))
    assert torch.equal(img, ref)
    for got, want in zip(_grads(img, v + c), ref_grads, strict=True):
        assert torch.equal(got, want)


def _maps():
    return torch.rand(2, 8, 8, 3, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("form", ["ours_list", "ours_padded", "pytorch3d"])
def test_meshes_with_uv_textures_match_the_packed_call(form):
    """Per-mesh UV faces with local indices (ours as lists or padded, or PyTorch3D's
    class with padded rows past a mesh's face count) pack to the packed call's global
    indices: the same image, the same gradients to maps and UVs."""
    ren = _renderer()
    verts, faces, uvs = _geometry()
    options = {"padding_mode": "zeros", "align_corners": False, "sampling_mode": "bilinear"}
    ref_m, ref_uv = _leaves([_maps()])[0], _leaves(uvs)
    packed_faces = torch.cat([faces[0], faces[1] + 4])  # the UV topology follows the mesh's
    ref = _packed_call(ren, verts, faces,
                       TexturesUV(ref_m, packed_faces, torch.cat(ref_uv), **options))  # fmt: skip
    ref_grads = _grads(ref, [ref_m, *ref_uv])

    m, uv = _leaves([_maps()])[0], _leaves(uvs)
    if form == "ours_list":
        tex = TexturesUV(m, faces, uv, **options)
        leaves = [m, *uv]
    else:
        # padded: the triangle's UV faces get a padding row, its UVs a padding UV
        faces_padded = torch.stack([faces[0], torch.cat([faces[1], torch.zeros(1, 3).long()])])
        uv_padded = torch.stack([uv[0], torch.cat([uv[1], torch.zeros(1, 2)])])
        if form == "ours_padded":
            tex = TexturesUV(m, faces_padded, uv_padded, **options)
        else:
            tex = _P3DTexturesUV(m, faces_padded, uv_padded, [2, 1], **options)
        leaves = [m, *uv]
    img = ren(_Meshes(verts, faces, textures=tex))
    assert torch.equal(img, ref)
    for got, want in zip(_grads(img, leaves), ref_grads, strict=True):
        assert torch.equal(got, want)


def test_textures_that_do_not_match_the_meshes_are_refused():
    ren = _renderer()
    verts, faces, uvs = _geometry()
    with pytest.raises(ValueError, match="mesh 1 has 0 UV faces for 1 faces"):
        ren(_Meshes(verts, faces, TexturesUV(_maps(), [faces[0], faces[1][:0]], uvs)))
    with pytest.raises(ValueError, match="verts_features has 6 rows for 7 vertices"):
        ren(_Meshes(verts, faces, TexturesVertex([torch.rand(3, 3), torch.rand(3, 3)])))
    with pytest.raises(TypeError, match="textures must be"):
        ren(_Meshes(verts, faces, textures=object()))


# ----------------------------------------------------------------------------- keywords
def _pose():
    R, T = look_at_view_transform(dist=2.8, elev=-20.0, azim=-30.0)
    return R, T


def test_per_call_R_T_match_a_camera_built_with_them():
    """``R=``/``T=`` override the camera's pose for the call (the shader shares the
    rasterizer's camera, so the specular eye moves too, as in PyTorch3D): image and
    gradients to R, T and verts equal those of a camera constructed at R, T; the
    renderer's own camera is unchanged afterwards."""
    verts, faces, _ = _geometry()
    tex = TexturesVertex(_vertex_colours())
    R, T = _pose()
    cams = FoVPerspectiveCameras(R=torch.eye(3)[None], T=torch.tensor([[0.1, 0.0, 4.0]]))
    ren = _renderer(cameras=cams)
    r, t, *v = _leaves([R, T, *verts])
    img = ren(_Meshes(v, faces, tex), R=r, T=t)
    got = _grads(img, [r, t, *v])
    assert torch.equal(cams.T, torch.tensor([[0.1, 0.0, 4.0]]))

    r2, t2, *v2 = _leaves([R, T, *verts])
    explicit = _renderer(cameras=FoVPerspectiveCameras(R=r2, T=t2))
    ref = explicit(_Meshes(v2, faces, tex))
    assert torch.equal(img, ref)
    for a, b in zip(got, _grads(ref, [r2, t2, *v2]), strict=True):
        assert torch.equal(a, b)
    assert got[0].abs().sum() > 0 and got[1].abs().sum() > 0


def test_a_shader_with_its_own_camera_keeps_its_eye_under_R_T():
    """PyTorch3D's shader reads its own camera: with a shader camera that is not the
    rasterizer's, ``R=``/``T=`` move only the rasterizer's. Same image as building the
    rasterizer's camera at R, T and the shader's at its pose; and a separate shader
    camera equal to the rasterizer's renders what one shared camera renders."""
    verts, faces, _ = _geometry()
    tex = TexturesVertex(_vertex_colours())
    R, T = _pose()
    settings = RasterizationSettings(image_size=12, faces_per_pixel=1)
    lights = PointLights(location=((1.0, 2.0, 3.0),))

    def render(raster_cams, shader_cams, **kwargs):
        ren = MeshRenderer(MeshRasterizer(cameras=raster_cams, raster_settings=settings),
                           HardPhongShader(cameras=shader_cams, lights=lights))  # fmt: skip
        return ren(_Meshes(verts, faces, tex), **kwargs)

    home = {"R": torch.eye(3)[None], "T": torch.tensor([[0.0, 0.0, 3.0]])}
    own = render(FoVPerspectiveCameras(**home), FoVPerspectiveCameras(**home), R=R, T=T)
    split = render(FoVPerspectiveCameras(R=R, T=T), FoVPerspectiveCameras(**home))
    assert torch.equal(own, split)
    shared = FoVPerspectiveCameras(R=R, T=T)
    assert torch.equal(render(shared, shared), render(shared, FoVPerspectiveCameras(R=R, T=T)))
    # the eye matters: a shared camera moved by R, T gives another specular
    assert not torch.equal(own, render(shared, shared))


def test_per_call_cameras_lights_materials_match_construction():
    """``cameras=``, ``lights=``, ``materials=``, ``blend_params=`` replace the
    renderer's for one call: the image and gradients of a renderer built with them."""
    verts, faces, _ = _geometry()
    tex = TexturesVertex(_vertex_colours())
    R, T = _pose()
    loc, diffuse = _leaves([torch.tensor([[0.5, 1.0, 2.0]]), torch.tensor([[0.9, 0.4, 0.7]])])
    cams = FoVPerspectiveCameras(R=R, T=T, fov=50.0)
    ren = _renderer(SoftPhongShader, k=3, blur=1e-3)
    img = ren(_Meshes(verts, faces, tex), cameras=cams, lights=PointLights(location=loc),
              materials=Materials(diffuse_color=diffuse),
              blend_params=BlendParams(sigma=1e-3, background_color=(0.0, 0.0, 0.0)))  # fmt: skip
    got = _grads(img, [loc, diffuse])

    loc2, diffuse2 = _leaves([loc, diffuse])
    settings = RasterizationSettings(image_size=12, faces_per_pixel=3, blur_radius=1e-3)
    built = MeshRenderer(
        MeshRasterizer(cameras=cams, raster_settings=settings),
        SoftPhongShader(cameras=cams, lights=PointLights(location=loc2),
                        materials=Materials(diffuse_color=diffuse2),
                        blend_params=BlendParams(sigma=1e-3, background_color=(0.0, 0.0, 0.0))),
    )  # fmt: skip
    ref = built(_Meshes(verts, faces, tex))
    assert torch.equal(img, ref)
    for a, b in zip(got, _grads(ref, [loc2, diffuse2]), strict=True):
        assert torch.equal(a, b)


def test_per_call_projection_and_raster_settings():
    """``fov=``, ``znear=`` and ``raster_settings=`` for one call equal a renderer built
    with them (znear also sets the soft blend's depth range, as PyTorch3D's shader
    reads it; the clip plane stays at the camera's own znear / 2, as PyTorch3D's)."""
    verts, faces, _ = _geometry()
    tex = TexturesVertex(_vertex_colours())
    R, T = _pose()
    settings = RasterizationSettings(image_size=10, faces_per_pixel=2, blur_radius=1e-3,
                                     z_clip_value=0.5)  # fmt: skip
    ren = _renderer(SoftPhongShader, cameras=FoVPerspectiveCameras(R=R, T=T))
    img = ren(_Meshes(verts, faces, tex), fov=40.0, znear=1.5, raster_settings=settings)
    built = _renderer(SoftPhongShader, cameras=FoVPerspectiveCameras(R=R, T=T, fov=40.0,
                                                                     znear=1.5))  # fmt: skip
    built.rasterizer.raster_settings = settings
    assert torch.equal(img, built(_Meshes(verts, faces, tex)))


def test_a_keyword_nothing_uses_is_a_type_error_naming_it():
    verts, faces, _ = _geometry()
    meshes = _Meshes(verts, faces, TexturesVertex(_vertex_colours()))
    ren = _renderer()
    with pytest.raises(TypeError, match=r"\['light'\]"):
        ren(meshes, light=PointLights())
    with pytest.raises(TypeError, match="eps is not used"):
        ren(meshes, eps=1e-4)
    with pytest.raises(TypeError, match=r"\['fov'\]"):  # not a PerspectiveCameras parameter
        ren(meshes, cameras=PerspectiveCameras(), fov=30.0)
    with pytest.raises(TypeError, match=r"\['lights'\]"):  # a rasterizer has no lights
        ren.rasterizer(meshes, lights=PointLights())
    with pytest.raises(TypeError, match="lights must be"):
        ren(meshes, lights="sun")
    ren(meshes, eps=None)  # PyTorch3D's default: accepted


def test_silhouette_renderer_accepts_lights_as_pytorch3d_does():
    """PyTorch3D's fit_textured_mesh passes ``lights=`` to a silhouette renderer (whose
    shader ignores them); that call runs unchanged and lights change nothing."""
    verts, faces, _ = _geometry()
    meshes = _Meshes(verts, faces)
    ren = _renderer(SoftSilhouetteShader, k=4, blur=1e-3)
    assert torch.equal(ren(meshes, lights=PointLights(location=((9.0, 9.0, 9.0),))), ren(meshes))


def test_rasterizer_takes_meshes_and_R_T():
    verts, faces, _ = _geometry()
    R, T = _pose()
    ras = MeshRasterizer(cameras=FoVPerspectiveCameras(),
                         raster_settings=RasterizationSettings(image_size=12))  # fmt: skip
    frags = ras(_Meshes(verts, faces), R=R, T=T)
    ref = MeshRasterizer(cameras=FoVPerspectiveCameras(R=R, T=T),
                         raster_settings=RasterizationSettings(image_size=12))  # fmt: skip
    ref = ref(_Meshes(verts, faces))
    assert torch.equal(frags.pix_to_face, ref.pix_to_face) and torch.equal(frags.zbuf, ref.zbuf)
    assert (frags.pix_to_face >= 0).any()


# ----------------------------------------------------------------------------- a pose fit
def test_camera_pose_fit_through_R_T_keywords():
    """PyTorch3D's camera-position tutorial in small: Adam on a camera position, R and T
    from look_at_rotation and passed per call to a silhouette renderer; the silhouette
    loss decreases over a few steps."""
    verts, faces, _ = _geometry()
    meshes = _Meshes(verts, faces)
    ren = _renderer(SoftSilhouetteShader, cameras=FoVPerspectiveCameras(), size=24, k=4,
                    blur=2e-3)  # fmt: skip
    R, T = look_at_view_transform(dist=3.0, elev=10.0, azim=20.0)
    target = ren(meshes, R=R, T=T)[..., 3].detach()
    position = torch.nn.Parameter(torch.tensor([1.6, 1.2, 2.4]))
    opt = torch.optim.Adam([position], lr=0.05)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        R = look_at_rotation(position[None])
        T = -torch.bmm(R.transpose(1, 2), position[None, :, None])[:, :, 0]
        loss = ((ren(meshes, R=R, T=T)[..., 3] - target) ** 2).sum()
        loss.backward()
        assert position.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


# ----------------------------------------------------------------------------- mip-mapped UVs
def test_mipmap_linear_clamp_equals_bilinear_border_without_corners():
    """``TexturesUVMipmap(filter_mode="linear", boundary_mode="clamp")`` samples as
    PyTorch3D's bilinear ``TexturesUV`` with ``align_corners=False`` and border
    padding (texel centres at (i + 0.5) / size, clamped to the edge texels). The two
    samplers round differently: 1e-6 is a few float32 ulps of values in [0, 1]."""
    verts, faces, uvs = _geometry()
    ren = _renderer()
    uvs = [u * 1.4 - 0.2 for u in uvs]  # some UVs outside [0, 1]: the clamp matters
    mip = TexturesUVMipmap(_maps(), faces, uvs, filter_mode="linear", boundary_mode="clamp")
    grid = TexturesUV(_maps(), faces, uvs, padding_mode="border", align_corners=False)
    a, b = ren(_Meshes(verts, faces, mip)), ren(_Meshes(verts, faces, grid))
    assert (a - b).abs().max() <= 1e-6


def test_mipmap_gradients_reach_maps_and_uvs():
    """Gradients of a linear-mipmap-linear render reach the maps (through the pyramid)
    and the UVs, and match central differences.

    Maps: the image is linear in the texels (fixed lighting), so a central difference
    of one texel with step 1 is exact up to the float32 rounding of the summed image
    (~2e3 values <= 2 with ~1e-7 relative error each: < 1e-3 absolute).
    UVs: with a ramp map (texel value = its centre's u, v) every level of a two-level
    pyramid holds the same ramp, so away from the clamped border the texel read is
    linear in the UVs whatever level the footprint picks; then a central difference
    of step 0.05 is exact up to the same rounding over 0.1: 1e-2 absolute."""
    verts, faces, uvs = _geometry()
    ren = _renderer(size=16)
    g = torch.rand(2, 16, 16, 4, generator=torch.Generator().manual_seed(5))

    def loss(m, u, **options):
        return (ren(_Meshes(verts, faces, TexturesUVMipmap(m, faces, u, **options))) * g).sum()

    maps, *uv = _leaves([_maps(), *uvs])
    loss(maps, uv).backward()
    assert uv[0].grad.abs().sum() > 0
    with torch.no_grad():
        for idx in [
            tuple(int(i) for i in torch.nonzero(maps.grad.abs() > 1e-3)[j]) for j in (0, -1)
        ]:
            m_plus, m_minus = maps.detach().clone(), maps.detach().clone()
            m_plus[idx] += 1.0
            m_minus[idx] -= 1.0
            fd = (loss(m_plus, uv) - loss(m_minus, uv)).item() / 2.0
            assert abs(maps.grad[idx].item() - fd) <= 1e-3, (idx, maps.grad[idx].item(), fd)

    centres = (torch.arange(8) + 0.5) / 8
    ramp = torch.stack([centres[None, :].expand(8, 8), 1 - centres[:, None].expand(8, 8),
                        torch.full((8, 8), 0.5)], -1)[None].expand(2, 8, 8, 3)  # fmt: skip
    options = {"boundary_mode": "clamp", "max_mip_level": 1}
    uv = _leaves([0.5 + 0.6 * (u - 0.5) for u in uvs])  # in [0.26, 0.74]: off the border
    loss(ramp, uv, **options).backward()
    with torch.no_grad():
        for mesh, row, col in ((0, 1, 0), (1, 2, 1)):
            moved = []
            for h in (0.05, -0.05):
                u = [t.detach().clone() for t in uv]
                u[mesh][row, col] += h
                moved.append(loss(ramp, u, **options).item())
            fd = (moved[0] - moved[1]) / 0.1
            assert abs(uv[mesh].grad[row, col].item() - fd) <= 1e-2, (mesh, row, col, fd)


# ----------------------------------------------------------------------------- imports
def test_every_pytorch3d_renderer_name_imports_from_warpraster_torch():
    for name in P3D_NAMES:
        assert name in wrt.__all__, name
        assert getattr(wrt, name) is getattr(wrt.shading, name), name  # one class, two paths


def test_import_warpraster_torch_imports_no_pxr():
    code = "import sys, warpraster.torch; print(any(m.startswith('pxr') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_torch_step_reads_back_no_light_or_material_values(monkeypatch):
    """The torch classes check their values once, when made (a NaN light location,
    a negative shininess: ValueError there); the op then builds its Warp lights and
    materials on every call without reading them back (each read is a device
    synchronisation on CUDA)."""
    import warp as wp
    from test_torch_shading import torch_scene

    from warpraster.torch import Materials, PointLights

    with pytest.raises(ValueError, match="location must be finite"):
        PointLights(location=[[float("nan"), 0.0, 1.0]])
    with pytest.raises(ValueError, match="shininess must be >= 0"):
        Materials(shininess=-1.0)
    d, spec, ren, inputs, tex, leaves = torch_scene("r03_softphong_directional_k8")
    target = torch.tensor(d["images"] * 0.9)
    ren(*inputs, textures=tex)  # the first call
    reads = []
    real = wp.array.numpy

    def counting(self):
        import traceback

        where = "".join(traceback.format_stack(limit=4))
        if "lighting.py" in where or "materials.py" in where or "params.py" in where:
            reads.append(where)
        return real(self)

    monkeypatch.setattr(wp.array, "numpy", counting)
    img = ren(*inputs, textures=tex)
    ((img - target) ** 2).mean().backward()
    assert reads == []


def test_the_backward_runs_the_forwards_recorded_render(monkeypatch):
    """A forward whose inputs require gradients records its Warp launches; its
    backward runs that record instead of rendering again (one render per step).
    More forwards than are kept before their backwards: the older ones render
    again on a tape, with the same gradients."""
    from test_torch_shading import torch_scene

    from warpraster.torch import render_op

    d, spec, ren, inputs, tex, leaves = torch_scene("r03_softphong_directional_k8")
    target = torch.tensor(d["images"] * 0.9)
    runs = []
    real_run = render_op._run
    monkeypatch.setattr(render_op, "_run", lambda *a, **k: (runs.append(1), real_run(*a, **k))[1])
    img = ren(*inputs, textures=tex)
    ((img - target) ** 2).mean().backward()
    assert len(runs) == 1  # the forward's render, and no second one for the backward
    want = {k: t.grad.clone() for k, t in leaves.items() if t.grad is not None}
    # six forwards, then their backwards in reverse: more than the kept records
    for t in leaves.values():
        t.grad = None
    images = [ren(*inputs, textures=tex) for _ in range(render_op._Recorded.capacity + 2)]
    for image in reversed(images):
        ((image - target) ** 2).mean().backward()
    n = len(images)
    for k, g in want.items():
        # n equal steps summed by autograd: n x one step's gradient, to float32
        # rounding of the n-term sum (relative ~n x 6e-8)
        scale = float(g.abs().max())
        torch.testing.assert_close(leaves[k].grad, n * g, rtol=1e-5, atol=1e-6 * scale,
                                   msg=k)  # fmt: skip


def test_repeated_calls_do_not_recheck_unchanged_topology(monkeypatch):
    """The index values of a packed batch are checked (a host read) the first time;
    a call with the same, unchanged index tensors reads nothing back; an in-place
    change (torch's version counter) is checked again, and a bad one refused."""
    from test_torch_shading import torch_scene

    from warpraster.torch import checks

    d, spec, ren, inputs, tex, leaves = torch_scene("r03_softphong_directional_k8")
    calls = []
    real = checks.check_index_range

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(checks, "check_index_range", counted)
    ren(*inputs, textures=tex)
    first = len(calls)
    assert first >= 1
    ren(*inputs, textures=tex)
    ren(*inputs, textures=tex)
    assert len(calls) == first  # unchanged: not read again
    faces = inputs[1]
    with torch.no_grad():
        faces[0, 0] = faces[0, 0].clone()  # an in-place write (same value)
    ren(*inputs, textures=tex)
    assert len(calls) > first
    with torch.no_grad():
        faces[0, 0] = 10**6
    with pytest.raises(ValueError, match="faces"):
        ren(*inputs, textures=tex)


def test_a_new_tensor_at_a_reused_address_is_checked():
    """The topology check is skipped only for the same live tensor objects: a new
    index tensor, even one at the address of a freed one, is checked."""
    from warpraster.torch import checks

    first, count = torch.tensor([0]), torch.tensor([2])
    good = torch.tensor([[0, 1, 2], [1, 2, 3]])
    checks.check_packed_values(4, good, first, count)
    del good
    bad = torch.tensor([[0, 1, 2], [1, 2, 9]])  # the allocator may hand back the address
    with pytest.raises(ValueError, match="faces"):
        checks.check_packed_values(4, bad, first, count)


def test_only_the_tensors_that_require_gradients_get_them(monkeypatch):
    """The op gives a gradient buffer (and so an adjoint's work) only to the tensors
    autograd differentiates: a camera that is not trained gets none, and the
    trained tensors' gradients are the same as when everything is trained."""
    from test_torch_shading import torch_scene

    from warpraster.torch import render_op

    made = []
    real = render_op._grad_buffers

    def spy(tensors, config):
        made.append(real(tensors, config))
        return made[-1]

    monkeypatch.setattr(render_op, "_grad_buffers", spy)
    d, spec, ren, inputs, tex, leaves = torch_scene("r03_softphong_directional_k8")
    target = torch.tensor(d["images"] * 0.9)
    cams = ren.rasterizer.cameras
    results, counts = [], []
    for train_camera in (True, False):
        for t in (*leaves.values(), cams.R, cams.T):
            t.grad = None
        cams.R.requires_grad_(train_camera)
        cams.T.requires_grad_(train_camera)
        made.clear()
        img = ren(*inputs, textures=tex)
        ((img - target) ** 2).mean().backward()
        results.append({k: t.grad.clone() for k, t in leaves.items() if t.grad is not None})
        counts.append(sum(g is not None for g in made[0]))
    assert cams.R.grad is None and cams.T.grad is None
    assert counts[1] == counts[0] - 2  # R and T got no buffer
    assert results[0].keys() == results[1].keys() and results[0]
    for k in results[0]:
        # the same adjoint on the same values for the trained tensors: equal
        torch.testing.assert_close(results[1][k], results[0][k], rtol=0, atol=0, msg=k)
