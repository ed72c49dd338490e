"""A model-free policy that answers image questions from the PNG *pixels* the tools return.

It reads images the way a radiologist does with these tools: it outlines the liver once with an overlay
(orange contour) to know where to look, compares mean fat-image brightness inside the liver between visits
(one shared intensity window makes that meaningful), checks the subcutaneous fat ring, which can only turn
dark on a fat image through a fat-water swap, and sweeps comparison panels through an organ looking for
compact spots that differ between the baseline and follow-up halves.
"""

from __future__ import annotations

import re
from collections import deque

import numpy as np
from PIL import Image

from case_env.core.policy import Observation
from case_env.envs.imaging.baselines.base import Agent, Decision
from case_env.envs.imaging.labels import ORGAN_IDS, colour_of
from case_env.envs.imaging.scan_protocol import STATION_BOUNDS_BELOW_TOP
from case_env.envs.imaging.viewer.render import HEADER_PX

FAT_UP, FAT_DOWN = 1.4, 0.7  # liver fat-image brightness ratios read as a real change
SWAP_RING = 0.5  # subcutaneous fat this much darker at follow-up: water and fat are exchanged
MIN_SPOT_PX = 12  # about 8 mm across at 2.2 mm per pixel; lesions asked about are 10 mm or more
SPOT_DIFF = 40.0  # grey levels a focal region differs from the organ's typical signal
SWEEP = tuple(range(6, 100, 8))


def gray(image) -> np.ndarray:
    return np.asarray(image.convert("L"), dtype=np.float32)


def _grow(mask: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Flood `mask` through 4-connected `allowed` pixels until it stops growing."""
    while True:
        grown = mask.copy()
        grown[1:] |= mask[:-1]
        grown[:-1] |= mask[1:]
        grown[:, 1:] |= mask[:, :-1]
        grown[:, :-1] |= mask[:, 1:]
        grown &= allowed
        if (grown == mask).all():
            return mask
        mask = grown


def _erode(mask: np.ndarray, steps: int = 1) -> np.ndarray:
    for _ in range(steps):
        inner = mask.copy()
        inner[1:] &= mask[:-1]
        inner[:-1] &= mask[1:]
        inner[:, 1:] &= mask[:, :-1]
        inner[:, :-1] &= mask[:, 1:]
        mask = inner
    return mask


def organ_rgb(organ: str) -> tuple[int, int, int]:
    """The outline colour the overlay legend names for an organ (the fixed palette of the label table)."""
    colour = colour_of(ORGAN_IDS[organ])
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def organ_mask(overlay_image, organ: str = "liver", shrink: int = 1) -> np.ndarray:
    """Inside of an organ's outline in an overlay render (outline excluded, then shrunk by `shrink` px)."""
    rgb = np.asarray(overlay_image.convert("RGB"))
    contour = np.all(rgb == organ_rgb(organ), axis=-1)
    if contour.sum() < 10:
        return np.zeros(contour.shape, bool)
    border = np.zeros(contour.shape, bool)
    border[0, :] = border[-1, :] = True
    border[:, 0] = border[:, -1] = True
    outside = _grow(border & ~contour, ~contour)
    return _erode(~outside & ~contour, shrink)


def body_ring(in_phase: np.ndarray, width: int = 4) -> np.ndarray:
    """The outermost `width` pixels of the body (subcutaneous fat), from an in-phase render, where every
    tissue is bright and the body outline is closed."""
    body = in_phase > 20
    border = np.zeros(body.shape, bool)
    border[0, :] = border[-1, :] = True
    border[:, 0] = border[:, -1] = True
    filled = ~_grow(border & ~body, ~body)  # fill holes (lungs, bowel gas)
    return filled & ~_erode(filled, width)


def _ratio(after: float, before: float) -> float:
    return (after + 1.0) / (before + 1.0)


def halves(panel) -> tuple[np.ndarray, np.ndarray]:
    image = gray(panel)[HEADER_PX:]
    w = image.shape[1] // 2
    return image[:, :w], image[:, w : 2 * w]


def _components(mask: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """4-connected components of a small boolean image, as (ys, xs) arrays."""
    seen = np.zeros(mask.shape, bool)
    out = []
    for y, x in zip(*np.nonzero(mask), strict=True):
        if seen[y, x]:
            continue
        queue, pixels = deque([(y, x)]), []
        seen[y, x] = True
        while queue:
            cy, cx = queue.popleft()
            pixels.append((cy, cx))
            for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        ys, xs = np.array(pixels).T
        out.append((ys, xs))
    return out


def spots(image: np.ndarray, organ: np.ndarray, darker: bool = True) -> list[np.ndarray]:
    """Regions inside an organ that differ from its typical (median) signal by more than SPOT_DIFF grey
    levels: darker (cysts and metastases on water images) or brighter (fat-containing lesions on fat
    images). Each region is a boolean mask."""
    if organ.sum() < 6:
        return []
    typical = float(np.median(image[organ]))
    outliers = (image < typical - SPOT_DIFF) if darker else (image > typical + SPOT_DIFF)
    found = []
    for ys, xs in _components(outliers & organ):
        if len(ys) < MIN_SPOT_PX or len(ys) > 0.4 * organ.sum():
            continue  # texture and noise, or a region too large to be focal
        region = np.zeros(image.shape, bool)
        region[ys, xs] = True
        found.append(region)
    return found


def compare_spots(left: np.ndarray, right: np.ndarray, organ: np.ndarray, darker: bool = True) -> str:
    """'new', 'grew' or 'unchanged' for the focal regions of the follow-up half, judged by how much of the
    same footprint already stood out at baseline: nothing (new), less (it was smaller), as much (unchanged)."""
    if organ.sum() < 6:
        return "unchanged"
    sign = 1.0 if darker else -1.0
    typical_left, typical_right = float(np.median(left[organ])), float(np.median(right[organ]))
    verdict = "unchanged"
    for region in sorted(spots(right, organ, darker), key=lambda r: -int(r.sum())):
        now = sign * (typical_right - float(right[region].mean()))
        before = sign * (typical_left - float(left[region].mean()))
        if before < 0.35 * now:
            return "new"
        if before < 0.8 * now and now - before >= 15 and region.sum() >= 20:  # a grown lesion is no speck
            verdict = "grew"
    return verdict


def mask_for_half(overlay_image, organ: str, half_shape: tuple[int, int]) -> np.ndarray:
    """The organ mask of a full-size overlay render, scaled to one half of a comparison panel."""
    mask = organ_mask(overlay_image, organ, shrink=2)
    small = Image.fromarray(mask.astype(np.uint8) * 255).resize(half_shape[::-1], Image.NEAREST)
    return np.asarray(small) > 0


# (option prefix, reason) when the fat images show a swap, more liver fat, less, or no change
_FAT_ANSWERS = {
    "fat_direction": (
        ("It only appears", "Subcutaneous fat went dark on the fat image (x{sat:.2f})."),
        ("It increased", "The liver is brighter on the fat image (x{liver:.2f})."),
        ("It decreased", "The liver is darker on the fat image (x{liver:.2f})."),
        ("It is unchanged", "The liver's fat signal is the same (x{liver:.2f})."),
    ),
    "artefact_vs_change": (
        ("A fat-water swap", "Subcutaneous fat is dark on the follow-up fat image (x{sat:.2f})."),
        ("A true increase", "Liver fat signal rose (x{liver:.2f}) with normal fat elsewhere."),
        ("A true decrease", "Liver fat signal fell (x{liver:.2f}) with normal fat elsewhere."),
        ("No visible difference", "The fat images match."),
    ),
}


class VisionAgent(Agent):
    """Radiologist questions: fat direction, artefact or change, what changed in the liver, lesion status."""

    def __init__(self, extra: dict):
        super().__init__(extra)
        self.template = extra.get("template", "")

    # -- plans ------------------------------------------------------------------------------------------
    def _level_calls(self, **where) -> list[tuple[str, dict]]:
        return [
            (
                "render_slice",
                {"visit": "baseline", "sequence": "in", "plane": "axial", "overlay": True, **where},
            ),
            ("render_slice", {"visit": "baseline", "sequence": "fat", "plane": "axial", **where}),
            ("render_slice", {"visit": "follow_up", "sequence": "fat", "plane": "axial", **where}),
        ]

    def plan(self) -> list:
        """Calls in order; a callable entry builds its call from the outputs so far."""
        calls: list = [("list_visits", {})]
        if self.template == "fat_direction":
            calls += self._level_calls(organ="liver")
        elif self.template == "artefact_vs_change":
            station = int(self.extra["question"].split("(station ")[1].split(")")[0])
            if station == 3:  # the upper-abdomen station holds the liver: look through its middle
                calls += self._level_calls(organ="liver")
            else:
                below = (STATION_BOUNDS_BELOW_TOP[station - 1] + STATION_BOUNDS_BELOW_TOP[station]) / 2
                calls += self._level_calls(
                    position=round(100 * (1 - below / STATION_BOUNDS_BELOW_TOP[-1]), 1)
                )
        elif self.template == "liver_change":
            calls += self._level_calls(organ="liver")
            for p in SWEEP:
                calls += self._sweep_calls("liver", "water", p)
        else:  # lesion_status: the evidence panel shows the lesion's level
            panel = self.extra["evidence"][0]["arguments"]
            calls += self._sweep_calls(panel["organ"], panel["sequence"], panel["position"])
        return calls

    @staticmethod
    def _sweep_calls(organ: str, sequence: str, position: float) -> list:
        """The comparison panel at a level, then the organ's outline on that very slice."""

        def outline(outputs: list[Observation]) -> tuple[str, dict]:
            match = re.search(r"slice (\d+) of (\d+)", outputs[-1].text)
            k, n = (int(match.group(1)), int(match.group(2))) if match else (1, 1)
            percent = round(100.0 * (k - 1) / max(n - 1, 1), 3)
            return (
                "render_slice",
                {
                    "visit": "follow_up",
                    "sequence": sequence,
                    "plane": "axial",
                    "position": percent,
                    "overlay": True,
                },
            )

        panel = (
            "render_comparison",
            {"sequence": sequence, "plane": "axial", "organ": organ, "position": position},
        )
        return [panel, outline]

    def next_call(self, outputs: list[Observation]) -> tuple[str, dict] | None:
        plan = self.plan()
        if len(outputs) >= len(plan):
            return None
        step = plan[len(outputs)]
        return step(outputs) if callable(step) else step

    # -- readings ---------------------------------------------------------------------------------------
    def _level_reading(self, outputs: list[Observation]) -> dict:
        overlay, before, after = (o.image for o in outputs[1:4])
        b, a = gray(before), gray(after)
        liver = organ_mask(overlay, "liver")
        ring = body_ring(gray(overlay))
        reading = {"sat": _ratio(a[ring].mean(), b[ring].mean()) if ring.any() else 1.0, "liver": None}
        if liver.sum() > 30:
            reading["liver"] = _ratio(a[liver].mean(), b[liver].mean())
        return reading

    def decide(self, outputs: list[Observation]) -> Decision:
        if any(o.image is None and o.tool.startswith("render") for o in outputs):
            return Decision("A", "An image did not come back; guessing.")
        return getattr(self, f"_{self.template}")(outputs)

    def _pick(self, prefix: str, reason: str) -> Decision:
        return Decision(self.option_where(lambda t: t.startswith(prefix)) or "A", reason)

    def _fat_verdict(self, outputs):
        """Both fat templates read the same two panels the same way; only their answer texts differ."""
        r = self._level_reading(outputs)
        liver = r["liver"] or 1.0
        swap, up, down, same = _FAT_ANSWERS[self.template]
        prefix, reason = (
            swap if r["sat"] < SWAP_RING else up if liver > FAT_UP else down if liver < FAT_DOWN else same
        )
        return self._pick(prefix, reason.format(sat=r["sat"], liver=liver))

    _fat_direction = _artefact_vs_change = _fat_verdict

    def _panel_verdicts(self, outputs: list[Observation], organ: str, darker: bool) -> list[str]:
        verdicts = []
        for panel, outline in zip(outputs[::2], outputs[1::2], strict=False):
            if outline.image is None or panel.image is None:
                continue
            left, right = halves(panel.image)
            mask = mask_for_half(outline.image, organ, left.shape)
            if mask.sum() >= 6:
                verdicts.append(compare_spots(left, right, mask, darker))
        return verdicts

    def _liver_change(self, outputs):
        r = self._level_reading(outputs)
        liver = r["liver"] or 1.0
        if liver > FAT_UP or liver < FAT_DOWN:
            return self._pick("The fat signal", f"Liver fat-image brightness changed (x{liver:.2f}).")
        verdicts = self._panel_verdicts(outputs[4:], "liver", darker=True)
        grew, new = verdicts.count("grew"), verdicts.count("new")
        if grew and grew >= new:
            return self._pick(
                "A focal lesion seen at baseline", "A dark spot present at baseline is larger now."
            )
        if new:
            return self._pick("A new focal lesion", "A dark spot appears only on the follow-up half.")
        return self._pick("No significant change", "No focal difference between the halves at any level.")

    def _lesion_status(self, outputs):
        panel = self.extra["evidence"][0]["arguments"]
        darker = panel["sequence"] != "fat"  # fat-containing lesions are bright on fat images
        verdicts = self._panel_verdicts(outputs[1:], panel["organ"], darker)
        verdict = verdicts[0] if verdicts else "unchanged"
        if verdict == "new":
            return self._pick("It is new", "The spot is absent from the baseline half.")
        if verdict == "grew":
            return self._pick("It was present at baseline and has grown", "The spot is larger at follow-up.")
        return self._pick(
            "It was present at baseline and is unchanged", "The spot is the same at both visits."
        )
