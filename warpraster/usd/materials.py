"""``UsdPreviewSurface`` materials and their bindings, mapped to Phong materials.

Binding: ``UsdShade.MaterialBindingAPI(prim).ComputeBoundMaterial()`` (direct
bindings, inherited down namespace, collection bindings as USD resolves them),
then each ``GeomSubset`` of family ``materialBind`` with its own binding
overrides the polygons it lists.

Mapping of ``UsdPreviewSurface`` to the renderer's Blinn-Phong material:

* diffuse = ``diffuseColor`` (a constant, or the RGB of a ``UsdUVTexture`` it
  is connected to, times the texture's ``scale`` plus ``bias``) x
  ``(1 - metallic / 2)``: a Phong renderer has no environment to reflect, so a
  metal keeps half its base colour as diffuse instead of turning black;
* specular colour = ``0.04`` grey mixed toward the diffuse colour by
  ``metallic`` (a metal reflects its own colour), or ``specularColor`` when
  ``useSpecularWorkflow = 1``;
* shininess = ``2 / max(roughness, 0.05)^4 - 2``: the Blinn-Phong exponent that
  matches a GGX lobe of ``alpha = roughness^2`` (Walter et al. 2007's
  ``n = 2 / alpha^2 - 2``); roughness 0.5 (the default) gives 30;
* opacity = ``opacity``.

Textures: the ``file`` asset path is resolved relative to the layer that
authored it (USD's resolver). A texture with no file, a path that does not
resolve, or an image Pillow cannot read is drawn as usdview (Storm) draws it:
the ``UsdUVTexture``'s ``fallback`` colour (default black) in place of its
texels, with one warning (naming the material and the file) in
:attr:`MaterialLibrary.warnings`.
8-bit images with ``sourceColorSpace`` ``auto`` or ``sRGB`` are decoded from
sRGB to linear; ``raw`` ones are used as they are. ``st`` comes from the
``UsdPrimvarReader_float2`` connected to the texture (its ``varname``), else
``st``.
"""

from __future__ import annotations

import numpy as np
from pxr import Sdf, Usd, UsdGeom, UsdShade

from .errors import SceneError
from .scene import Material, TextureImage, WrapMode

__all__ = ["MaterialLibrary", "srgb_to_linear", "shininess_from_roughness"]

_WRAP = {
    "repeat": WrapMode.REPEAT,
    "clamp": WrapMode.CLAMP,
    "mirror": WrapMode.MIRROR,
    "black": WrapMode.BLACK,
    "useMetadata": WrapMode.REPEAT,
}


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in [0, 1] to linear (IEC 61966-2-1)."""
    c = np.asarray(c, np.float32)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4).astype(np.float32)


def shininess_from_roughness(roughness: float) -> float:
    """Blinn-Phong exponent of a GGX lobe with ``alpha = roughness^2`` (floor 0.05)."""
    r = max(float(roughness), 0.05)
    return 2.0 / r**4 - 2.0


def _shader_id(shader: UsdShade.Shader) -> str:
    sid = shader.GetIdAttr().Get() if shader else None
    return str(sid) if sid else ""


def _input_value(shader: UsdShade.Shader, name: str, default, time):
    inp = shader.GetInput(name)
    if not inp:
        return default, None
    if inp.HasConnectedSource():
        sources, _ = inp.GetConnectedSources()
        if sources:
            src = sources[0]
            return default, (UsdShade.Shader(src.source.GetPrim()), str(src.sourceName))
    value = inp.Get(time)
    return (default if value is None else value), None


def _load_image(path: str, where: str, color_space: str) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is the "image" extra
        raise SceneError(where, "reading textures needs Pillow (pip install pillow)") from None
    source = path
    if "[" in path and path.endswith("]"):  # inside a package (.usdz): read through USD's resolver
        import io

        from pxr import Ar

        asset = Ar.GetResolver().OpenAsset(Ar.ResolvedPath(path))
        if asset is None:
            raise SceneError(where, f"cannot open texture {path} in its package")
        source = io.BytesIO(asset.GetBuffer())
    try:
        with Image.open(source) as im:
            im.load()
            mode16 = im.mode in ("I;16", "I;16B", "I", "F")
            rgba = np.asarray(im.convert("RGBA"), np.float32) / 255.0
            if mode16:
                rgba = np.asarray(im, np.float32)
                rgba = rgba / max(float(rgba.max()), 1.0)
                rgba = np.stack([rgba, rgba, rgba, np.ones_like(rgba)], -1)
    except (OSError, ValueError) as err:
        raise SceneError(where, f"cannot read texture image {path} ({err})") from None
    if color_space != "raw" and not mode16:
        rgba[..., :3] = srgb_to_linear(rgba[..., :3])
    return np.ascontiguousarray(rgba, np.float32)


class MaterialLibrary:
    """Reads each bound material once; gives the material of every triangle.

    Attributes:
        materials: list of :class:`~warpraster.usd.scene.Material`, in the order
            first met.
        warnings: one line per texture that could not be read (drawn in its
            fallback colour), each once.
    """

    def __init__(self, stage: Usd.Stage, time: Usd.TimeCode):
        self.stage = stage
        self.time = time
        self.materials: list[Material] = []
        self.warnings: list[str] = []
        self._index: dict[str, int] = {}

    # ------------------------------------------------------------------ reading
    def index_of(self, material: UsdShade.Material) -> int:
        """Index of ``material`` in :attr:`materials` (read on first use)."""
        key = str(material.GetPath())
        if key not in self._index:
            self._index[key] = len(self.materials)
            self.materials.append(self._read(material))
        return self._index[key]

    def _read(self, material: UsdShade.Material) -> Material:
        name = str(material.GetPath())
        t = self.time
        out = Material(name=name)
        shader, _, _ = material.ComputeSurfaceSource()
        if not shader or _shader_id(shader) != "UsdPreviewSurface":
            return out  # unknown surface: the default grey (displayColor is not used)
        diffuse, link = _input_value(shader, "diffuseColor", (0.18, 0.18, 0.18), t)
        metallic, _ = _input_value(shader, "metallic", 0.0, t)
        roughness, _ = _input_value(shader, "roughness", 0.5, t)
        opacity, _ = _input_value(shader, "opacity", 1.0, t)
        spec_workflow, _ = _input_value(shader, "useSpecularWorkflow", 0, t)
        spec_color, _ = _input_value(shader, "specularColor", (0.0, 0.0, 0.0), t)
        metallic = float(np.clip(metallic, 0.0, 1.0))
        base = np.asarray(diffuse, np.float32).reshape(3)
        if link is not None:
            tex_shader, _ = link
            if _shader_id(tex_shader) == "UsdUVTexture":
                try:
                    out.texture, out.uv_primvar, fallback = self._texture(tex_shader, name)
                    base = np.ones(3, np.float32)
                except SceneError as err:  # drawn in the texture's fallback colour
                    fallback, _ = _input_value(tex_shader, "fallback", (0.0, 0.0, 0.0, 1.0), t)
                    base = np.asarray(fallback, np.float32).reshape(4)[:3].copy()
                    text = f"{err} (drawn in its fallback colour {tuple(float(x) for x in base)})"
                    if text not in self.warnings:
                        self.warnings.append(text)
        out.diffuse = (base * (1.0 - 0.5 * metallic)).astype(np.float32)
        if int(spec_workflow):
            out.specular = np.asarray(spec_color, np.float32).reshape(3)
        else:
            out.specular = (0.04 * (1.0 - metallic) + base * metallic).astype(np.float32)
        out.shininess = shininess_from_roughness(roughness)
        out.opacity = float(opacity)
        return out

    def _texture(self, shader: UsdShade.Shader, material_name: str):
        t = self.time
        where = f"{material_name} ({shader.GetPath().name})"
        file_input = shader.GetInput("file")
        asset = file_input.Get(t) if file_input else None
        if not isinstance(asset, Sdf.AssetPath) or not asset.path:
            raise SceneError(where, "UsdUVTexture has no file")
        resolved = asset.resolvedPath
        if not resolved:
            raise SceneError(
                where, f"texture file {asset.path!r} not found (resolved from its layer)"
            )
        cs_input = shader.GetInput("sourceColorSpace")
        color_space = str(cs_input.Get(t)) if cs_input and cs_input.Get(t) else "auto"
        texels = _load_image(resolved, where, color_space)
        wrap_s, _ = _input_value(shader, "wrapS", "useMetadata", t)
        wrap_t, _ = _input_value(shader, "wrapT", "useMetadata", t)
        scale, _ = _input_value(shader, "scale", (1.0, 1.0, 1.0, 1.0), t)
        bias, _ = _input_value(shader, "bias", (0.0, 0.0, 0.0, 0.0), t)
        fallback, _ = _input_value(shader, "fallback", (0.0, 0.0, 0.0, 1.0), t)
        uv_name = "st"
        _, st_link = _input_value(shader, "st", None, t)
        if st_link is not None:
            reader = st_link[0]
            if _shader_id(reader).startswith("UsdPrimvarReader"):
                var, _ = _input_value(reader, "varname", "st", t)
                uv_name = str(var) if var else "st"
        tex = TextureImage(
            path=resolved,
            texels=texels,
            wrap_s=_WRAP.get(str(wrap_s), WrapMode.REPEAT),
            wrap_t=_WRAP.get(str(wrap_t), WrapMode.REPEAT),
            scale=tuple(float(x) for x in scale),
            bias=tuple(float(x) for x in bias),
        )
        return tex, uv_name, fallback

    # ------------------------------------------------------------------ binding
    def uv_primvar_for(self, prim: Usd.Prim) -> str | None:
        """The texture-coordinate primvar of the material bound to ``prim`` (if textured)."""
        mat, _ = UsdShade.MaterialBindingAPI(prim).ComputeBoundMaterial()
        if not mat:
            return None
        m = self.materials[self.index_of(mat)]
        return m.uv_primvar if m.texture is not None else None

    def per_triangle(self, prim: Usd.Prim, tri, time) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Material index of each triangle of ``prim`` (-1: none) and its subsets.

        Returns:
            (T,) int32 material indices, and ``{subset path: (n,) int64 triangle
            indices local to the mesh}`` for every ``GeomSubset`` of the mesh.
        """
        where = str(prim.GetPath())
        mat, _ = UsdShade.MaterialBindingAPI(prim).ComputeBoundMaterial()
        poly = np.full(tri.num_polygons, self.index_of(mat) if mat else -1, np.int32)
        subsets = {}
        for subset in UsdGeom.Subset.GetAllGeomSubsets(UsdGeom.Imageable(prim)):
            if subset.GetElementTypeAttr().Get() != UsdGeom.Tokens.face:
                continue
            idx = subset.GetIndicesAttr().Get(time)
            idx = np.zeros(0, np.int64) if idx is None else np.asarray(idx, np.int64)
            if idx.size and (idx.min() < 0 or idx.max() >= tri.num_polygons):
                raise SceneError(
                    str(subset.GetPath()),
                    f"GeomSubset lists face {int(idx.max())} but {where} has "
                    f"{tri.num_polygons} faces",
                )
            in_subset = np.zeros(tri.num_polygons, bool)
            in_subset[idx] = True
            subsets[str(subset.GetPath())] = np.nonzero(in_subset[tri.face])[0]
            if subset.GetFamilyNameAttr().Get() == UsdShade.Tokens.materialBind:
                smat, _ = UsdShade.MaterialBindingAPI(subset.GetPrim()).ComputeBoundMaterial()
                if smat:
                    poly[idx] = self.index_of(smat)
        return poly[tri.face], subsets
