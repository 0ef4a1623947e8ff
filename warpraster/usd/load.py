"""One call from a file or a ``Usd.Stage`` to a :class:`~warpraster.usd.scene.Scene`."""

from __future__ import annotations

import warnings

import numpy as np
from pxr import Usd, UsdGeom

from .cameras import read_camera
from .diagnostics import collecting_diagnostics, composition_problems
from .errors import SceneError, SceneWarning
from .lights import read_lights
from .materials import MaterialLibrary
from .meshes import MeshSet
from .scene import AspectConform, RenderSettings, Scene
from .stage import frame_range, open_stage, stage_name, time_code, up_axis

__all__ = ["load_stage", "read_cameras", "read_render_settings"]


def read_cameras(stage: Usd.Stage, time) -> dict:
    """Every ``UsdGeom.Camera`` of the stage (instance proxies included) at ``time``."""
    out = {}
    for prim in Usd.PrimRange.Stage(stage, Usd.TraverseInstanceProxies()):
        if prim.IsA(UsdGeom.Camera):
            out[str(prim.GetPath())] = read_camera(prim, time)
    return out


_CONFORM = {
    "adjustPixelAspectRatio": AspectConform.ADJUST_PIXEL_ASPECT_RATIO,
    "expandAperture": AspectConform.EXPAND_APERTURE,
    "cropAperture": AspectConform.CROP_APERTURE,
    "adjustApertureWidth": AspectConform.ADJUST_APERTURE_WIDTH,
    "adjustApertureHeight": AspectConform.ADJUST_APERTURE_HEIGHT,
}


def read_render_settings(stage: Usd.Stage) -> RenderSettings | None:
    """The stage's render settings: camera, resolution and conform policy where authored.

    Only authored values count (an unauthored policy is not UsdRender's
    fallback ``expandAperture`` here, so the renderer's own default applies).
    """
    from pxr import UsdRender

    rs = UsdRender.Settings.GetStageRenderSettings(stage)
    if not rs:
        prim = next((p for p in stage.Traverse() if p.IsA(UsdRender.Settings)), None)
        if prim is None:
            return None
        rs = UsdRender.Settings(prim)
    targets = rs.GetCameraRel().GetTargets()
    res = rs.GetResolutionAttr()
    policy = rs.GetAspectRatioConformPolicyAttr()
    return RenderSettings(
        path=str(rs.GetPath()),
        camera=str(targets[0]) if targets else None,
        resolution=tuple(int(x) for x in res.Get()) if res.HasAuthoredValue() else None,
        conform=_CONFORM.get(str(policy.Get())) if policy.HasAuthoredValue() else None,
    )


def load_stage(
    source,
    *,
    time=None,
    purposes=("default", "render"),
    require_meshes: bool = False,
) -> Scene:
    """Reads a stage's meshes, materials, cameras and lights at one time.

    Args:
        source: a path to a ``.usd``/``.usda``/``.usdc``/``.usdz`` file or a ``Usd.Stage``.
        time: a time code (float); None reads the stage's start time when it has
            a frame range, else the default values.
        purposes: the ``purpose`` values drawn.
        require_meshes: raise when nothing would be drawn.

    Returns:
        :class:`~warpraster.usd.scene.Scene`; ``scene.mesh_set`` keeps the
        per-mesh data to evaluate other times (see
        :class:`~warpraster.usd.animation.StageAnimation`).

        USD's own warnings while reading are collected into ``scene.diagnostics``
        (not printed), what the stage could not compose into ``scene.unresolved``;
        a texture that cannot be read is drawn in its fallback colour and named in
        ``scene.warnings`` (each also issued once as a :class:`SceneWarning`).

    Raises:
        SceneError: an unreadable file, bad topology or primvars (naming the prim),
            or (``require_meshes``) no mesh with faces.
    """
    # NaN / inf points: kept (never drawn, flagged per mesh), without NumPy warnings
    with collecting_diagnostics() as diagnostics, np.errstate(invalid="ignore", over="ignore"):
        scene = _load(source, time, purposes, require_meshes)
    scene.diagnostics = diagnostics
    for text in scene.warnings:
        warnings.warn(text, SceneWarning, stacklevel=2)
    return scene


def _load(source, time, purposes, require_meshes: bool) -> Scene:
    stage = open_stage(source)
    name = stage_name(stage)
    rng = frame_range(stage)
    if time is None and rng is not None:
        time = rng[0]
    t = time_code(time)
    library = MaterialLibrary(stage, t)
    mesh_set = MeshSet(stage, t, materials=library, purposes=purposes)
    if require_meshes and mesh_set.num_faces == 0:
        unresolved = composition_problems(stage)
        why = (
            f"; {len(unresolved)} unresolved (references, payloads or sublayers), the first: "
            f"{unresolved[0]}"
            if unresolved
            else ""
        )
        raise SceneError(name, f"no meshes to render (no visible UsdGeom.Mesh with faces{why})")
    scene = Scene(
        source=name,
        meshes=mesh_set.evaluate(t),
        materials=library.materials,
        cameras=read_cameras(stage, t),
        lights=read_lights(stage, t),
        frame_range=rng,
        time=None if time is None else float(time),
        up_axis=up_axis(stage),
        render_settings=read_render_settings(stage),
        warnings=list(library.warnings),
        unresolved=composition_problems(stage),
    )
    scene.mesh_set = mesh_set
    scene.stage = stage
    return scene
