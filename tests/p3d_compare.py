"""Parity check of rasterizer outputs against PyTorch3D (or the NumPy oracle).

``compare_fragments`` asserts the rules from the reference README:

* ``pix_to_face`` identical on at least ``min_match_fraction`` of all slots,
  and every pixel whose K slots differ is *explained* by float rounding
  (:func:`explain_mismatch`): a z tie, or a face whose coverage of the pixel
  centre is decided within rounding (centre on an edge, on the blur boundary,
  at z = 0, or a face whose area is at the degenerate threshold);
* ``zbuf``, ``bary_coords``, ``dists`` close where the two agree on the face;
* unused slots hold -1 everywhere, used slots come first, no face twice.

Tolerances (float32 kernels compared in float64; one float32 ulp at 1 is
1.2e-7):

* ``EDGE_TOL = 1e-6`` (NDC units, *unsquared* distance; squared: 1e-12). The
  inside test is the sign of an edge function ``E = |e| * dist_to_line``
  evaluated in float32 from coordinates of magnitude <= ~2: its rounding error
  is a few ulps of ``|p - a| * |e|``, i.e. an error in the distance of a few
  ulps of ``|p - a| <= ~3`` (~4e-7). 1e-6 covers that with margin and is still
  far below the pixel pitch (>= 2/96). The same bound is used for the blur
  boundary, which is ``sqrt(dist) = sqrt(blur_radius)`` in unsquared terms.
* z ties: ``Z_TIE_REL = 1e-6`` of ``max(1, sum_i |b_i z_i|)``. zbuf is a
  3-term dot product of float32 barycentrics (each carrying a few ulps of
  relative error) with the vertex depths, so its rounding error scales with
  the magnitude of the terms, which exceeds ``|z|`` when the barycentrics are
  extrapolated (blur); 1e-6 is ~8 ulps of that magnitude.
* values: ``|a - b| <= atol + rtol * scale`` with ``atol = rtol = 1e-5`` and
  ``scale`` the same magnitude of terms (``sum |b_i z_i|`` for zbuf,
  ``sum |b_i|`` for the barycentrics, ``|dists|``): float64 vs PyTorch3D's
  float32 measured up to 1.3e-5 absolute on an extrapolated zbuf of 3.0
  (p06, blur) where ``sum |b_i z_i|`` is ~ 6, and up to 7e-6 on a barycentric
  of -25.7 (p05, blur 0.01).
"""

from __future__ import annotations

import numpy as np
from np_reference import EPS, face_area, pixel_centers, pixel_math

__all__ = [
    "EDGE_TOL",
    "Z_TIE_REL",
    "compare_fragments",
    "compare_with_case",
    "explain_mismatch",
]

EDGE_TOL = 1e-6
Z_TIE_REL = 1e-6
_F32_EPS = float(np.finfo(np.float32).eps)


def _face_at_pixel(f, px, py, verts, faces, *, blur_radius, perspective_correct, clip, cull):
    """Float64 facts about face ``f`` at pixel centre ``(px, py)``."""
    v = np.asarray(verts, dtype=np.float64)[np.asarray(faces)[f]]
    tri = tuple(v.reshape(-1))
    x0, y0, z0, x1, y1, z1, x2, y2, z2 = tri
    m = pixel_math(
        np.float64(px),
        np.float64(py),
        tri,
        perspective_correct=perspective_correct,
        clip_barycentric_coords=clip,
        dtype=np.float64,
    )
    z = float(m["z"])
    b = np.array([float(x) for x in m["bary"]])
    zscale = max(1.0, float(np.sum(np.abs(b * np.array([z0, z1, z2])))))
    blur = float(np.float32(blur_radius))
    d = float(m["dist"])
    sd, sb = np.sqrt(d), np.sqrt(blur)
    area = float(face_area(x0, y0, x1, y1, x2, y2))
    # Rounding bound of the float32 area: a few ulps of the two products.
    area_err = 8 * _F32_EPS * (abs((x0 - x1) * (y2 - y1)) + abs((y0 - y1) * (x2 - x1)))
    inside = bool(m["inside"])
    reasons = []
    if abs(area) <= EPS + area_err:
        reasons.append(f"area {area:.3g} at the degenerate/cull threshold")
    if sd <= EDGE_TOL and not sd + EDGE_TOL < sb:
        reasons.append(f"pixel centre {sd:.2g} from an edge")
    if blur > 0 and abs(sd - sb) <= EDGE_TOL:
        reasons.append(f"pixel centre {abs(sd - sb):.2g} from the blur boundary")
    if abs(z) <= Z_TIE_REL * zscale:
        reasons.append(f"z = {z:.3g} at the z >= 0 threshold")
    covers = (
        abs(area) > EPS
        and not (cull and area < 0)
        and min(z0, z1, z2) >= EPS
        and z >= 0
        and (inside or d < blur)
    )
    return {"z": z, "zscale": zscale, "marginal": reasons, "covers": covers}


def explain_mismatch(
    ours,
    ref,
    *,
    px: float,
    py: float,
    verts,
    faces,
    blur_radius: float,
    perspective_correct: bool,
    clip_barycentric_coords: bool = False,
    cull_backfaces: bool = False,
) -> tuple[bool, str]:
    """Decide whether two K-slot ``pix_to_face`` lists of one pixel differ only by rounding.

    Rules, evaluated in float64 at the pixel centre:

    * a face in only one list is fine if its coverage is *marginal* (centre
      within ``EDGE_TOL`` of an edge or of the blur boundary, ``|z|`` within the
      tie tolerance of 0, area at the degenerate threshold), or if the list
      lacking it is full (K faces) and the face's z is not below that list's
      last z (minus the tie tolerance): truncation, possibly after a marginal
      face took a slot;
    * a non-marginal face in only one list must cover the pixel in float64;
    * after dropping those marginal faces, the two lists must agree slot by slot
      up to z ties (same face, or z within the tie tolerance).

    Args:
        ours, ref: ``(K,)`` int face indices, -1 padded at the end.
        px, py: pixel-centre NDC coordinates.
        verts, faces: the packed geometry the faces index.
        blur_radius, perspective_correct, clip_barycentric_coords,
            cull_backfaces: the rasterization settings.

    Returns:
        ``(explained, reason)``.
    """
    K = len(ours)
    if len(ref) != K:
        raise ValueError(f"ours has {K} slots, ref {len(ref)}")
    ours = [int(f) for f in ours if f >= 0]
    ref = [int(f) for f in ref if f >= 0]
    facts = {}
    for f in set(ours) | set(ref):
        facts[f] = _face_at_pixel(
            f,
            px,
            py,
            verts,
            faces,
            blur_radius=blur_radius,
            perspective_correct=perspective_correct,
            clip=clip_barycentric_coords,
            cull=cull_backfaces,
        )
    return _explain(ours, ref, facts, K)


def _tie(fa, fb):
    tol = Z_TIE_REL * max(fa["zscale"], fb["zscale"])
    return abs(fa["z"] - fb["z"]) <= tol


def _explain(ours, ref, facts, K):
    """Core of :func:`explain_mismatch` on unpadded lists; ``K`` = slots per pixel."""
    reasons = []
    drop = set()
    for f in sorted(set(ours) ^ set(ref)):
        fa = facts[f]
        lacks, lname = (ref, "ref") if f in ours else (ours, "ours")
        if fa["marginal"]:
            reasons.append(f"face {f} marginal: {'; '.join(fa['marginal'])}")
            drop.add(f)
            continue
        if not fa["covers"]:
            return False, f"face {f} (only in {'ours' if lname == 'ref' else 'ref'}) does not cover"
        if len(lacks) < K:
            return False, f"face {f} missing from {lname}, which is not full"
        last = facts[lacks[-1]]
        if fa["z"] < last["z"] and not _tie(fa, last):
            return False, (
                f"face {f} (z={fa['z']:.7g}) missing from {lname} although it is nearer "
                f"than its last face {lacks[-1]} (z={last['z']:.7g})"
            )
        reasons.append(f"face {f} truncated from {lname} (z={fa['z']:.7g} >= {last['z']:.7g})")
    a = [f for f in ours if f not in drop]
    b = [f for f in ref if f not in drop]
    for fa, fb in zip(a, b, strict=False):
        if fa == fb:
            continue
        if not _tie(facts[fa], facts[fb]):
            return False, (
                f"order differs: face {fa} (z={facts[fa]['z']:.7g}) vs face {fb} "
                f"(z={facts[fb]['z']:.7g}), not a tie"
            )
        reasons.append(f"z tie {fa}/{fb} (dz={facts[fa]['z'] - facts[fb]['z']:.2g})")
    return True, "; ".join(reasons) if reasons else "no difference"


def _check_layout(p2f, zbuf, bary, dists, label):
    """Valid slots first, no duplicates, -1 fill. Returns a list of problems."""
    problems = []
    valid = p2f >= 0
    if np.any(~valid[..., :-1] & valid[..., 1:]):
        problems.append(f"{label}: a valid slot follows an empty one")
    s = np.sort(np.where(valid, p2f, -np.arange(1, p2f.shape[-1] + 1)), axis=-1)
    if np.any(s[..., 1:] == s[..., :-1]):
        problems.append(f"{label}: a face appears twice in one pixel")
    empty = ~valid
    if not (np.all(zbuf[empty] == -1) and np.all(dists[empty] == -1)):
        problems.append(f"{label}: zbuf/dists not -1 in empty slots")
    if not np.all(bary[empty] == -1):
        problems.append(f"{label}: bary_coords not -1 in empty slots")
    return problems


def compare_fragments(
    pix_to_face,
    zbuf,
    bary,
    dists,
    ref_pix_to_face,
    ref_zbuf,
    ref_bary,
    ref_dists,
    *,
    verts,
    faces,
    image_size,
    blur_radius: float,
    perspective_correct: bool,
    name: str = "",
    clip_barycentric_coords: bool = False,
    cull_backfaces: bool = False,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    min_match_fraction: float = 0.999,
    mesh_to_face_first_idx=None,
    num_faces_per_mesh=None,
) -> dict:
    """Assert that rasterizer outputs match a reference, up to float rounding.

    Args:
        pix_to_face, zbuf, bary, dists: outputs under test, NumPy arrays
            ``(N, H, W, K)`` (``bary``: ``(N, H, W, K, 3)``).
        ref_pix_to_face, ref_zbuf, ref_bary, ref_dists: the reference (e.g. a
            PyTorch3D case or ``rasterize_reference``).
        verts, faces: packed geometry the faces index (NDC verts for camera
            cases); used to explain mismatches and to scale tolerances.
        image_size: ``(H, W)``.
        blur_radius, perspective_correct: rasterization settings.
        name: label for messages.
        clip_barycentric_coords, cull_backfaces: further settings (needed to
            recompute z / coverage exactly when explaining).
        atol, rtol: value tolerance ``atol + rtol * scale`` (module docstring).
        min_match_fraction: fraction of all N*H*W*K slots whose ``pix_to_face``
            must be identical.
        mesh_to_face_first_idx, num_faces_per_mesh: optional ``(N,)`` per-mesh
            face ranges; when given, every face in image n must belong to mesh n.

    Returns:
        dict of statistics: ``slots``, ``valid_ref``, ``valid_ours``,
        ``slot_mismatches``, ``pixel_mismatches``, ``match_fraction``,
        ``explained`` (list of ``((n, y, x), reason)``), ``max_err_zbuf``,
        ``max_err_bary``, ``max_err_dists`` (absolute, on agreeing slots).

    Raises:
        AssertionError: listing every rule that failed.
    """
    label = f"[{name}] " if name else ""
    p2f = np.asarray(pix_to_face).astype(np.int64)
    rp2f = np.asarray(ref_pix_to_face).astype(np.int64)
    H, W = (int(s) for s in image_size)
    if p2f.shape != rp2f.shape or p2f.ndim != 4 or p2f.shape[1:3] != (H, W):
        raise AssertionError(f"{label}pix_to_face shape {p2f.shape} vs ref {rp2f.shape}")
    K = p2f.shape[-1]
    arrs = {}
    for key, a, r, shape in (
        ("zbuf", zbuf, ref_zbuf, p2f.shape),
        ("bary", bary, ref_bary, p2f.shape + (3,)),
        ("dists", dists, ref_dists, p2f.shape),
    ):
        a = np.asarray(a, dtype=np.float64)
        r = np.asarray(r, dtype=np.float64)
        if a.shape != shape or r.shape != shape:
            raise AssertionError(f"{label}{key} shape {a.shape} / ref {r.shape}, expected {shape}")
        arrs[key] = (a, r)
    verts64 = np.asarray(verts, dtype=np.float64)
    faces = np.asarray(faces, dtype=np.int64)
    F = len(faces)

    problems = _check_layout(p2f, arrs["zbuf"][0], arrs["bary"][0], arrs["dists"][0], "ours")
    problems += _check_layout(rp2f, arrs["zbuf"][1], arrs["bary"][1], arrs["dists"][1], "ref")
    if np.any(p2f >= F) or np.any(rp2f >= F):
        problems.append(f"face index >= F = {F}")
    if mesh_to_face_first_idx is not None:
        lo = np.asarray(mesh_to_face_first_idx, dtype=np.int64).reshape(-1, 1, 1, 1)
        hi = lo + np.asarray(num_faces_per_mesh, dtype=np.int64).reshape(-1, 1, 1, 1)
        for label_, p in (("ours", p2f), ("ref", rp2f)):
            if np.any((p >= 0) & ((p < lo) | (p >= hi))):
                problems.append(f"{label_}: a face appears in another mesh's image")

    # 1. pix_to_face, with every differing pixel explained.
    diff = p2f != rp2f
    slots = p2f.size
    match_fraction = 1.0 - diff.sum() / slots
    if match_fraction < min_match_fraction:
        problems.append(
            f"pix_to_face identical on {match_fraction:.5f} of slots < {min_match_fraction}"
        )
    ys, xs = pixel_centers((H, W))
    explained = []
    if F and not any(p.startswith("face index") for p in problems):
        for n, y, x in zip(*np.nonzero(diff.any(-1)), strict=True):
            a, b = p2f[n, y, x], rp2f[n, y, x]
            fs = {int(f) for f in np.concatenate([a, b]) if f >= 0}
            facts = {
                f: _face_at_pixel(
                    f,
                    xs[x],
                    ys[y],
                    verts64,
                    faces,
                    blur_radius=blur_radius,
                    perspective_correct=perspective_correct,
                    clip=clip_barycentric_coords,
                    cull=cull_backfaces,
                )
                for f in fs
            }
            ok, why = _explain(
                [int(f) for f in a if f >= 0], [int(f) for f in b if f >= 0], facts, K
            )
            where = (int(n), int(y), int(x))
            if ok:
                explained.append((where, why))
            else:
                problems.append(f"pixel {where}: ours {a.tolist()} ref {b.tolist()}: {why}")

    # 2. Values where both hold the same face.
    same = (p2f == rp2f) & (rp2f >= 0)
    errs = {}
    if same.any():
        fz = verts64[faces[rp2f[same]], 2]  # (M, 3) vertex depths
        rb = arrs["bary"][1][same]
        scales = {
            "zbuf": np.sum(np.abs(rb * fz), axis=-1),
            "bary": np.sum(np.abs(rb), axis=-1)[:, None],
            "dists": np.abs(arrs["dists"][1][same]),
        }
        for key in ("zbuf", "bary", "dists"):
            a, r = arrs[key][0][same], arrs[key][1][same]
            err = np.abs(a - r)
            errs[key] = float(np.max(err))
            bad = ~(err <= atol + rtol * scales[key])  # also catches NaN
            if bad.any():
                idx = np.argwhere(same)[np.nonzero(bad.reshape(len(err), -1).any(-1))[0]]
                first = tuple(int(i) for i in idx[0])
                i0 = np.nonzero(bad.reshape(len(err), -1).any(-1))[0][0]
                problems.append(
                    f"{key}: {len(idx)} slots beyond atol {atol} + rtol {rtol} * scale, "
                    f"first at (n, y, x, k) = {first}: {a[i0]} vs ref {r[i0]}"
                )
    else:
        errs = dict.fromkeys(("zbuf", "bary", "dists"), 0.0)

    stats = {
        "name": name,
        "slots": int(slots),
        "valid_ref": int((rp2f >= 0).sum()),
        "valid_ours": int((p2f >= 0).sum()),
        "slot_mismatches": int(diff.sum()),
        "pixel_mismatches": int(diff.any(-1).sum()),
        "match_fraction": float(match_fraction),
        "explained": explained,
        "max_err_zbuf": errs["zbuf"],
        "max_err_bary": errs["bary"],
        "max_err_dists": errs["dists"],
    }
    if problems:
        shown = problems[:20]
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise AssertionError(
            f"{label}fragments differ from the reference:\n  " + "\n  ".join(shown) + more
        )
    return stats


def compare_with_case(ours, case: dict, **kwargs) -> dict:
    """:func:`compare_fragments` against a loaded PyTorch3D case (see ``p3d_cases``).

    Args:
        ours: an object with attributes, or a mapping with keys,
            ``pix_to_face``, ``zbuf``, ``bary_coords``, ``dists`` (NumPy arrays).
        case: a dict from ``p3d_cases.load_case``.
        **kwargs: passed on (``atol``, ``rtol``, ``min_match_fraction``).
    """

    def get(key):
        return ours[key] if isinstance(ours, dict) else getattr(ours, key)

    verts = case["verts_ndc_packed"] if case["case_kind"] == "camera" else case["verts_packed"]
    return compare_fragments(
        get("pix_to_face"),
        get("zbuf"),
        get("bary_coords"),
        get("dists"),
        case["pix_to_face"],
        case["zbuf"],
        case["bary_coords"],
        case["dists"],
        verts=verts,
        faces=case["faces_packed"],
        image_size=case["image_size"],
        blur_radius=case["blur_radius"],
        perspective_correct=case["perspective_correct"],
        clip_barycentric_coords=case["clip_barycentric_coords"],
        cull_backfaces=case["cull_backfaces"],
        mesh_to_face_first_idx=case["mesh_to_face_first_idx"],
        num_faces_per_mesh=case["num_faces_per_mesh"],
        name=case.get("name", ""),
        **kwargs,
    )
