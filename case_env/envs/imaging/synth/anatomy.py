"""The phantom's body plan: implicit shapes in millimetres, drawn in order (later shapes win).

Every structure is a function of coordinates, so the same shapes rasterise onto any grid (the `full` and
`ci` profiles, a small reference grid for lesion placement) and can be queried at scattered points (the
profile-independent ground-truth volumes of the manifest).

Placement, radii and draw order follow the phantom parameters of docs/sources.md, Phantom
(x + = patient right, y + = anterior; landmarks as mm below the top of the field of view, scaled by the
subject's body scale). The spine was lengthened to adult vertebral heights so that organs sit near their
usual levels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from case_env.envs.imaging.synth.geometry import TOP_MM, Box
from case_env.envs.imaging.synth.plan import ShapeNoise, SubjectAnatomy, VisitState

Inside = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

LESION_TISSUE = {"cyst": "cyst", "metastasis": "metastasis", "haemangioma": "haemangioma"}

_FOV_BOX: Box = ((-260.0, 260.0), (-200.0, 200.0), (0.0, TOP_MM))


@dataclass(frozen=True)
class Shape:
    name: str
    tissue: str
    label: int | None  # None leaves the organ label untouched (discs, medulla, lesions)
    box: Box
    inside: Inside
    label_at: Inside | None = None  # position-dependent label (lung lobes)
    label_set: tuple[int, ...] = ()  # every label label_at can produce

    @property
    def labels(self) -> tuple[int, ...]:
        if self.label_at is not None:
            return self.label_set
        return () if self.label is None else (self.label,)


def blob(
    name: str,
    tissue: str,
    label: int | None,
    centre: tuple[float, float, float],
    radii: tuple[float, float, float],
    rot_deg: float = 0.0,
    noise: ShapeNoise | None = None,
    amp: float = 0.0,
    wavelength: float = 60.0,
    label_at: Inside | None = None,
    label_set: tuple[int, ...] = (),
) -> Shape:
    """Ellipsoid rotated about z, its boundary perturbed by low-frequency sinusoids."""
    cx, cy, cz = centre
    rx, ry, rz = radii
    cos, sin = math.cos(math.radians(rot_deg)), math.sin(math.radians(rot_deg))
    use_noise = noise is not None and amp > 0
    k = 2 * math.pi / wavelength

    def inside(X: np.ndarray, Y: np.ndarray, Z: np.ndarray) -> np.ndarray:
        f32 = np.float32  # full-size temporaries in half the bytes; sub-micrometre error at body scale
        dx, dy, dz = f32(X - cx), f32(Y - cy), f32(Z - cz)
        xr = cos * dx + sin * dy
        yr = cos * dy - sin * dx
        f = (xr / rx) ** 2 + (yr / ry) ** 2 + (dz / rz) ** 2
        if use_noise:
            pert = 0.0
            for (d0, d1, d2), phase in zip(noise.directions, noise.phases, strict=True):
                pert = pert + np.sin(f32(k * d0) * dx + f32(k * d1) * dy + f32(k * d2) * dz + f32(phase))
            f = f * (1 + amp * pert / math.sqrt(len(noise.phases)))
        return f < 1.0

    reach = 1.0 / math.sqrt(1.0 - amp * math.sqrt(len(noise.phases))) if use_noise else 1.0
    rxy, rzz = max(rx, ry) * reach + 0.5, rz * reach + 0.5
    box = ((cx - rxy, cx + rxy), (cy - rxy, cy + rxy), (cz - rzz, cz + rzz))
    return Shape(name, tissue, label, box, inside, label_at, label_set)


def sphere(name: str, tissue: str, label: int | None, centre, diameter: float) -> Shape:
    return blob(name, tissue, label, centre, (diameter / 2,) * 3)


def _z_tube(name, tissue, label, x, y, radius, z_low, z_high) -> Shape:
    def inside(X, Y, Z):
        return ((X - x) ** 2 + (Y - y) ** 2 < radius**2) & (z_low <= Z) & (z_high >= Z)

    box = ((x - radius, x + radius), (y - radius, y + radius), (z_low, z_high))
    return Shape(name, tissue, label, box, inside)


def _slab(name, tissue, label, rx, ry, y0, z_low, z_high) -> Shape:
    """Elliptic cylinder on the midline (vertebral bodies, discs)."""

    def inside(X, Y, Z):
        return ((X / rx) ** 2 + ((Y - y0) / ry) ** 2 < 1) & (z_low <= Z) & (z_high > Z)

    return Shape(name, tissue, label, ((-rx, rx), (y0 - ry, y0 + ry), (z_low, z_high)), inside)


class BodyPlan:
    """Shapes of one subject at one visit."""

    def __init__(self, anatomy: SubjectAnatomy, state: VisitState):
        self.a = anatomy
        self.s = state
        self.bs = anatomy.body_scale

    # -- helpers ---------------------------------------------------------------------------------------
    def z(self, below_top_mm: float) -> float:
        """z of a landmark given in mm below the top of the field of view (scaled by body size)."""
        return TOP_MM - below_top_mm * self.bs

    def organ_scale(self, organ: str) -> float:
        return self.bs * self.a.size[organ] * self.s.scale[organ]

    def place(self, organ: str, x: float, y: float, below_top: float) -> tuple[float, float, float]:
        jx, jy, jz = self.a.jitter_mm.get(organ, (0.0, 0.0, 0.0))
        return (x * self.bs + jx, y * self.bs + jy, self.z(below_top) + jz)

    def _profile(self, Z: np.ndarray):
        """Body cross-section semi-axes (mm) along z, and where the two thighs begin."""
        d = (TOP_MM - Z) / self.bs
        conds = [d < 60, d < 140, d < 620, d < 760]
        rx = np.select(conds, [60, 60 + (d - 60) * 1.3, 164 - 0.03 * (d - 140), 150 + 0.1 * (d - 620)])
        rx = np.where(d >= 760, 90 - 0.06 * (d - 760), rx)
        ry = np.select(conds, [55, 55 + (d - 60) * 0.6, 103, 100])
        ry = np.where(d >= 760, 85 - 0.05 * (d - 760), ry)
        return rx * self.bs, ry * self.bs, d >= 760, d

    def _body(self, name: str, tissue: str, pad: float) -> Shape:
        leg_offset = 88 * self.bs

        def inside(X, Y, Z):
            # Radii depend on z only: fold them into small per-slice factors before anything full-size.
            X, Y = X.astype(np.float32), Y.astype(np.float32)  # full-size temporaries in half the bytes
            rx, ry, legs, _ = self._profile(Z)
            rx, ry = rx.astype(np.float32), ry.astype(np.float32)
            y2 = Y * Y
            trunk = X * X * (1.0 / (rx + pad) ** 2) + y2 * (1.0 / (ry + 0.8 * pad) ** 2) < 1
            near = np.minimum(np.abs(X - leg_offset), np.abs(X + leg_offset))
            thigh = near * near * (1.0 / (rx + pad) ** 2) + y2 * (1.0 / (ry + pad) ** 2) < 1
            return np.where(legs, thigh, trunk)

        return Shape(name, tissue, 0, _FOV_BOX, inside)

    def _arms(self, name: str, tissue: str, pad: float) -> Shape:
        offset = 164 * self.bs + self.s.sat_mm + 50 * self.bs

        def inside(X, Y, Z):
            _, _, _, d = self._profile(Z)
            radius = (42 - 0.02 * (d - 120)) * self.bs + pad
            arm = lambda cx: (X - cx) ** 2 + (Y + 10) ** 2 < radius**2  # noqa: E731
            return (arm(offset) | arm(-offset)) & (d > 120) & (d < 640)

        return Shape(name, tissue, 0, _FOV_BOX, inside)

    def _cavity(self) -> Shape:
        def inside(X, Y, Z):
            rx, ry, _, d = self._profile(Z)
            return ((X / (rx * 0.82)) ** 2 + ((Y - 10) / (ry * 0.78)) ** 2 < 1) & (d > 300) & (d < 720)

        box = (_FOV_BOX[0], _FOV_BOX[1], (self.z(720), self.z(300)))
        return Shape("abdominal_cavity", "bowel", 0, box, inside)

    def _organ(self, organ, label, tissue, at, radii, rot=0.0, amp=0.12, wl=60.0, noise_key=None) -> Shape:
        scale = self.organ_scale(organ)
        noise = self.a.shape_noise.get(noise_key or organ)
        r = tuple(v * scale for v in radii)
        return blob(organ, tissue, label, at, r, rot, noise, amp, wl)

    def _fixed(self, name, label, tissue, at, radii, rot=0.0, scale_key=None) -> Shape:
        scale = self.organ_scale(scale_key) if scale_key else self.bs
        return blob(name, tissue, label, at, tuple(v * scale for v in radii), rot)

    # -- the plan ----------------------------------------------------------------------------------------
    def shapes(self) -> list[Shape]:
        sat = self.s.sat_mm
        out = [
            self._body("subcutaneous_fat", "adipose", sat),
            self._body("body_wall", "muscle", 0.0),
            self._arms("arm_fat", "adipose", 6.0),
            self._arms("arm_muscle", "muscle", 0.0),
            self._cavity(),
        ]
        out += self._thorax()
        out += self._abdomen()
        out += self._spine()
        out += self._pelvis()
        out += self.lesion_shapes()
        return out

    def _thorax(self) -> list[Shape]:
        out = []
        for side, sx in (("left", -1), ("right", 1)):
            centre = (sx * 95 * self.bs, -5.0, self.z(240))
            upper_plane, mid_plane = self.z(240), self.z(270)

            def lobes(X, Y, Z, side=side, up=upper_plane, mid=mid_plane):
                upper = (Z - up) + 0.6 * (Y + 5) > 0
                if side == "left":
                    return np.where(upper, 28, 29)
                middle = (Z - mid) + 0.6 * (Y + 5) > 0
                return np.where(upper, 30, np.where(middle, 31, 32))

            radii = (72 * self.bs, 95 * self.bs, 150 * self.bs)
            noise = self.a.shape_noise["body"]
            lobe_ids = (28, 29) if side == "left" else (30, 31, 32)
            out.append(
                blob(
                    f"{side}_lung",
                    "lung",
                    lobe_ids[0],
                    centre,
                    radii,
                    0.0,
                    noise,
                    0.05,
                    60.0,
                    lobes,
                    lobe_ids,
                )
            )
        out.append(
            self._organ("heart", 115, "heart", self.place("heart", -20, 30, 265), (60, 48, 58), -30, 0.05)
        )
        return out

    def _abdomen(self) -> list[Shape]:
        liver_right = self.place("liver", 70, 15, 400)
        liver_left = self.place("liver", -25, 45, 385)
        out = [
            self._organ("liver", 1, "liver", liver_right, (86, 74, 62), 15, 0.15),
            self._organ("liver", 1, "liver", liver_left, (52, 30, 40), 10, 0.15),
            self._organ("spleen", 3, "spleen", self.place("spleen", -105, -40, 405), (28, 46, 38), -35, 0.10),
            self._organ("stomach", 12, "stomach", self.place("stomach", -60, 35, 420), (50, 40, 55), -20),
            self._organ(
                "gallbladder", 10, "bile", self.place("gallbladder", 60, 55, 475), (16, 16, 38), 30, 0.05
            ),
        ]
        for organ, label, sx, below in (("left_kidney", 14, -1, 490), ("right_kidney", 5, 1, 515)):
            at = self.place(organ, sx * 65, -55, below)
            out.append(self._organ(organ, label, "kidney", at, (29, 27, 53), sx * 20, 0.06))
            out.append(
                self._fixed(f"{organ}_medulla", None, "kidney_medulla", at, (14, 13, 28), sx * 20, organ)
            )
        for x, below, radii in ((35, 500, (24, 17, 22)), (0, 485, (32, 13, 15)), (-50, 470, (34, 12, 13))):
            at = self.place("pancreas", x, 10, below)
            out.append(self._organ("pancreas", 4, "pancreas", at, radii, -15, 0.10, 30.0))
        out.append(
            self._organ("bladder", 15, "urine", self.place("bladder", 0, 45, 790), (45, 35, 35), 0, 0.05)
        )
        bs = self.bs
        out.append(_z_tube("aorta", "blood", 6, -12 * bs, -20 * bs, 11 * bs, self.z(640), self.z(200)))
        out.append(
            _z_tube("inferior_vena_cava", "blood", 7, 22 * bs, -15 * bs, 12 * bs, self.z(650), self.z(330))
        )
        return out

    def vertebral_levels(self) -> list[tuple[int, str, float, float]]:
        """(VISTA id, level name, z_low, z_high) from C1 down to L5."""
        names = (
            [f"C{n}" for n in range(1, 8)] + [f"T{n}" for n in range(1, 13)] + [f"L{n}" for n in range(1, 6)]
        )
        heights = [17.0] * 7 + [20.0 + 9.0 * i / 11 for i in range(12)] + [37.0] * 5
        ids = list(range(56, 32, -1))  # C1 = 56 ... L5 = 33
        levels, top = [], -70.0
        for vid, name, height in zip(ids, names, heights, strict=True):
            levels.append((vid, name, self.z(top + height), self.z(top)))
            top += height
        return levels

    def _spine(self) -> list[Shape]:
        bs = self.bs
        out = []
        disc = 3.0 * bs
        for vid, name, z_low, z_high in self.vertebral_levels():
            out.append(
                _slab(f"vertebra_{name}", "marrow", vid, 20 * bs, 16 * bs, -70 * bs, z_low + disc, z_high)
            )
            out.append(_slab(f"disc_{name}", "disc", None, 20 * bs, 16 * bs, -70 * bs, z_low, z_low + disc))
        levels = self.vertebral_levels()
        sacrum_top = levels[-1][2]
        out.append(self._fixed("sacrum", 97, "marrow", (0.0, -80 * bs, sacrum_top - 45 * bs), (35, 18, 45)))
        conus = levels[-4][2]  # the cord ends at L2
        out.append(_z_tube("spinal_cord", "cord", 121, 0.0, -95 * bs, 6 * bs, conus, TOP_MM))
        return out

    def _pelvis(self) -> list[Shape]:
        bs = self.bs
        out = []
        for sx, side, hip, femur, glut, ilio, auto in (
            (1, "right", 96, 94, 99, 107, 105),
            (-1, "left", 95, 93, 98, 106, 104),
        ):
            out.append(
                self._fixed(
                    f"{side}_hip", hip, "marrow", (sx * 90 * bs, -40 * bs, self.z(700)), (45, 25, 70), sx * 25
                )
            )
            out.append(
                self._fixed(
                    f"{side}_gluteus_maximus",
                    glut,
                    "muscle",
                    (sx * 95 * bs, -95 * bs, self.z(740)),
                    (60, 35, 80),
                    0,
                    "muscle",
                )
            )
            out.append(
                self._fixed(
                    f"{side}_iliopsoas",
                    ilio,
                    "muscle",
                    (sx * 55 * bs, -30 * bs, self.z(620)),
                    (22, 22, 110),
                    0,
                    "muscle",
                )
            )
            out.append(
                self._fixed(
                    f"{side}_autochthon",
                    auto,
                    "muscle",
                    (sx * 28 * bs, -95 * bs, self.z(480)),
                    (18, 18, 230),
                    0,
                    "muscle",
                )
            )
            out.append(
                _z_tube(
                    f"{side}_femur", "marrow_femur", femur, sx * 95 * bs, -5 * bs, 14 * bs, 0.0, self.z(800)
                )
            )
        return out

    def lesion_shapes(self, instance_labels: bool = False) -> list[Shape]:
        """Lesions as tissue that keeps the host organ's label, or labelled by instance id (lesion map)."""
        return [
            sphere(
                f"lesion_{les.instance}",
                LESION_TISSUE[les.kind],
                les.instance if instance_labels else None,
                les.centre_mm,
                les.diameter_mm,
            )
            for les in self.s.lesions
            if les.centre_mm is not None
        ]
