"""USD cameras onto warpraster cameras, against independent truths.

Truths: USD's own camera math (``Gf.Camera`` -> ``Gf.Frustum`` view and
projection matrices, float64), points projected by hand with the aperture
formulas, and warpraster's ``FoVPerspectiveCameras`` for the equivalent camera.
"""

import math

import numpy as np
import pytest

pytest.importorskip("pxr")
from conftest import DEVICES  # noqa: E402
from pxr import Gf, Usd, UsdGeom, Vt  # noqa: E402

import warpraster as wr  # noqa: E402
import warpraster.usd as wu  # noqa: E402

# one device is enough for scene reading (the rasterizer's own tests cover each device)
DEVICE = DEVICES[0]
from warpraster.usd.cameras import conformed_apertures, look_at_matrix, opencv_from_usd_camera  # noqa: E402
from warpraster.usd.scene import scene_from_arrays  # noqa: E402


def _cam(projection=wu.Projection.PERSPECTIVE, **kw):
    eye = kw.pop("eye", (1.5, 0.8, 4.0))
    target = kw.pop("target", (0.1, -0.2, 0.0))
    return wu.CameraParams(
        name="/Cam",
        cam_to_world=look_at_matrix(eye, target, (0, 1, 0)),
        projection=projection,
        **kw,
    )


def _gf_pixels(cam, points, image_size):
    """Pixel (u, v) of world points through USD's Gf.Camera frustum (float64)."""
    h, w = image_size
    gc = Gf.Camera(
        Gf.Matrix4d(cam.cam_to_world.tolist()),
        Gf.Camera.Perspective
        if cam.projection == wu.Projection.PERSPECTIVE
        else Gf.Camera.Orthographic,
        cam.horizontal_aperture,
        cam.vertical_aperture,
        cam.horizontal_aperture_offset,
        cam.vertical_aperture_offset,
        cam.focal_length,
        Gf.Range1f(cam.near, cam.far),
    )
    fr = gc.frustum
    m = np.array(fr.ComputeViewMatrix()) @ np.array(fr.ComputeProjectionMatrix())
    hom = np.concatenate([points, np.ones((len(points), 1))], 1) @ m
    ndc = hom[:, :2] / hom[:, 3:]
    return np.stack([(ndc[:, 0] + 1) / 2 * w, (1 - ndc[:, 1]) / 2 * h], 1)


def test_opencv_form_equals_usd_frustum_math_with_offsets_and_unlike_aspects():
    rng = np.random.default_rng(0)
    cam = _cam(
        focal_length=28.0,
        horizontal_aperture=24.0,
        vertical_aperture=13.5,
        horizontal_aperture_offset=1.75,
        vertical_aperture_offset=-0.875,
        near=0.5,
        far=50,
    )
    # values exact in float32: Gf.Camera stores its parameters as float32
    pts = rng.uniform(-1, 1, (20, 3))
    for size in [(48, 64), (64, 48), (30, 30)]:  # none with the aperture's 16:9 aspect
        R, t, K = opencv_from_usd_camera(cam, size)
        pc = pts @ R.T + t
        uv = pc[:, :2] / pc[:, 2:] * K[[0, 1], [0, 1]] + K[:2, 2]
        # both float64: agreement to rounding
        np.testing.assert_allclose(uv, _gf_pixels(cam, pts, size), rtol=1e-9, atol=1e-9)


def _centroid_pixel(scene, cam, size, spp=1):
    """Centroid of the covered samples, in output pixels (x right, y down), with the
    apertures across the whole image (adjustPixelAspectRatio: the by-hand mapping below)."""
    r = wu.StageRenderer(scene, camera=cam, image_size=size, spp=spp, device=DEVICE,
                         conform=wu.AspectConform.ADJUST_PIXEL_ASPECT_RATIO)  # fmt: skip
    sy, sx = r.grid
    ys, xs = np.nonzero(r.fragments().pix_to_face.numpy()[0, ..., 0] >= 0)
    assert len(xs) > 0
    return np.array([(xs.mean() + 0.5) / sx, (ys.mean() + 0.5) / sy])


def _tiny_triangle(centre, radius, normal_towards):
    centre = np.asarray(centre, np.float64)
    n = np.asarray(normal_towards, np.float64) - centre
    n /= np.linalg.norm(n)
    a = np.cross(n, [0, 1, 0])
    a /= np.linalg.norm(a)
    b = np.cross(n, a)
    ang = np.radians([90, 210, 330])
    return centre + radius * (np.cos(ang)[:, None] * a + np.sin(ang)[:, None] * b)


@pytest.mark.parametrize("spp", [16, 128], ids=["grid4x4", "grid8x16"])
@pytest.mark.parametrize("projection", [wu.Projection.PERSPECTIVE, wu.Projection.ORTHOGRAPHIC])
def test_a_small_triangle_is_drawn_where_usd_camera_math_puts_it(projection, spp):
    size = (40, 72)  # 9:5, against a 4:3 aperture: non-square pixels (adjustPixelAspectRatio)
    eye = np.array([0.5, 1.0, 6.0])
    cam = _cam(
        projection,
        eye=eye,
        target=(0, 0, 0),
        focal_length=35.0,
        horizontal_aperture=20.0,
        vertical_aperture=15.0,
        horizontal_aperture_offset=2.0,
        vertical_aperture_offset=-1.0,
        near=0.1,
        far=100.0,
    )
    if projection == wu.Projection.ORTHOGRAPHIC:
        cam.horizontal_aperture, cam.vertical_aperture = 60.0, 45.0  # a 6 x 4.5 unit window
    centre = np.array([0.6, -0.3, 0.4])
    tri = _tiny_triangle(centre, 0.2, eye)
    scene = scene_from_arrays(tri, [[0, 1, 2]])
    got = _centroid_pixel(scene, cam, size, spp)
    # by hand: camera coordinates, then the window (offset +- aperture / 2) onto the image
    m = cam.cam_to_world
    pc = (centre - m[3, :3]) @ m[:3, :3].T  # rows orthonormal: inverse = transpose
    h, w = size
    if projection == wu.Projection.PERSPECTIVE:
        xi, yi = cam.focal_length * pc[0] / -pc[2], cam.focal_length * pc[1] / -pc[2]
        scale = 1.0
    else:
        xi, yi = pc[0], pc[1]
        scale = 0.1  # orthographic apertures are tenths of a scene unit
    ha, va = cam.horizontal_aperture * scale, cam.vertical_aperture * scale
    ho, vo = cam.horizontal_aperture_offset * scale, cam.vertical_aperture_offset * scale
    u = (xi - (ho - ha / 2)) / ha * w
    v = ((vo + va / 2) - yi) / va * h
    # the covered samples of a ~5 px triangle, 16-128 per pixel, average to its centroid within
    # 0.06 px (sample quantisation; under perspective the projected vertex centroid and the
    # area centroid also differ by ~0.02 px); the 8 x 16 grid has non-square sample cells and
    # must draw the same window
    np.testing.assert_allclose(got, [u, v], atol=0.06)


def test_usd_camera_and_the_equivalent_fov_camera_give_the_same_fragments():
    from warpraster.primitives import ico_sphere

    v, f = ico_sphere(2)
    eye = np.array([0.8, 1.2, 3.5])
    f_mm, ap = 30.0, 20.0
    cam = _cam(
        eye=eye,
        target=(0, 0, 0),
        focal_length=f_mm,
        horizontal_aperture=ap,
        vertical_aperture=ap,
        near=0.1,
        far=100.0,
    )
    size = (48, 48)
    scene = scene_from_arrays(v, f)
    r = wu.StageRenderer(scene, camera=cam, image_size=size, device=DEVICE)
    ours = r.fragments().numpy()
    R, T = wr.look_at_view_transform(eye=eye[None], at=((0, 0, 0),), up=((0, 1, 0),))
    fov = wr.FoVPerspectiveCameras(
        fov=2 * math.degrees(math.atan(ap / 2 / f_mm)), R=R, T=T, znear=0.1, device=DEVICE
    )
    ras = wr.MeshRasterizer(fov, wr.RasterizationSettings(image_size=size, faces_per_pixel=1))
    ref = ras(v, f, [0], [len(f)]).numpy()
    same = ours["pix_to_face"] == ref["pix_to_face"]
    # two float32 projections (OpenCV-built NDC pinhole vs FoV matrix) differ by rounding
    # only: a pixel flips only if its centre lies within ~1e-5 px of an edge: <= 0.5 %
    assert same.mean() >= 0.995
    hit = same & (ref["pix_to_face"] >= 0)
    assert hit.sum() > 300
    np.testing.assert_allclose(ours["zbuf"][hit], ref["zbuf"][hit], rtol=1e-5)
    np.testing.assert_allclose(ours["bary_coords"][hit], ref["bary_coords"][hit], atol=1e-4)


@pytest.mark.parametrize(
    "policy, expected",
    [
        (wu.AspectConform.ADJUST_PIXEL_ASPECT_RATIO, (20.0, 15.0)),
        (wu.AspectConform.EXPAND_APERTURE, (30.0, 15.0)),  # image wider: grow the width
        (wu.AspectConform.CROP_APERTURE, (20.0, 10.0)),  # image wider: cut the height
        (wu.AspectConform.ADJUST_APERTURE_WIDTH, (30.0, 15.0)),
        (wu.AspectConform.ADJUST_APERTURE_HEIGHT, (20.0, 10.0)),
    ],
)
def test_conform_policies(policy, expected):
    cam = _cam(horizontal_aperture=20.0, vertical_aperture=15.0)
    assert conformed_apertures(cam, (100, 200), policy) == pytest.approx(expected)


def test_camera_read_from_a_stage_with_clipping_and_transform():
    stage = Usd.Stage.CreateInMemory()
    UsdGeom.Xform.Define(stage, "/Rig")
    c = UsdGeom.Camera.Define(stage, "/Rig/Cam")
    c.CreateFocalLengthAttr(24.0)
    c.CreateHorizontalApertureAttr(36.0)
    c.CreateVerticalApertureAttr(24.0)
    c.CreateClippingRangeAttr(Gf.Vec2f(0.2, 30.0))
    c.CreateProjectionAttr("orthographic")
    UsdGeom.Xformable(stage.GetPrimAtPath("/Rig")).AddTranslateOp().Set(Gf.Vec3d(0, 0, 5))
    m = UsdGeom.Mesh.Define(stage, "/M")
    m.CreatePointsAttr(Vt.Vec3fArray([(0, 0, 0), (1, 0, 0), (0, 1, 0)]))
    m.CreateFaceVertexCountsAttr([3])
    m.CreateFaceVertexIndicesAttr([0, 1, 2])
    scene = wu.load_stage(stage)
    cam = scene.cameras["/Rig/Cam"]
    assert cam.projection == wu.Projection.ORTHOGRAPHIC
    assert (cam.focal_length, cam.horizontal_aperture, cam.near, cam.far) == pytest.approx(
        (24.0, 36.0, 0.2, 30.0)
    )
    np.testing.assert_allclose(cam.position, [0, 0, 5])


def test_default_camera_frames_the_scene():
    lo, hi = np.array([-3.0, 0.0, -1.0]), np.array([5.0, 2.0, 4.0])
    cam = wu.default_camera(lo, hi, aspect=16 / 9)
    corners = np.array(
        [[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])]
    )
    size = (90, 160)
    R, t, K = opencv_from_usd_camera(cam, size)
    pc = corners @ R.T + t
    assert (pc[:, 2] > cam.near).all() and (pc[:, 2] < cam.far).all()
    uv = pc[:, :2] / pc[:, 2:] * K[[0, 1], [0, 1]] + K[:2, 2]
    assert (uv >= 0).all() and (uv[:, 0] <= 160).all() and (uv[:, 1] <= 90).all()
