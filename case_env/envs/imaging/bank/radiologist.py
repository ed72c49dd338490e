"""Radiologist questions (data source medpanel_v2_opsd): what changed in the images, and whether it is real.

Every answer is visible in render_comparison panels; the evidence names the panels that show it. With
measured truth (the default) the answer classes come from the measurements the tools serve: the liver's
signal fat fraction at both visits and the lesions of the lesion map. A change of at least 3 points of fat
fraction is a change and at most 1.5 points is none; a lesion grew when it is at least 3 mm and 15 %
larger (volume-equivalent diameter) and is unchanged within 1 mm. Values between those bounds are too
close to call, and the question is skipped. Whether a difference is a fat-water swap rather than a true
change only a manifest knows: `artefact_vs_change` is asked only where one exists, and a manifest's
knowledge of a swap across the liver vetoes (never answers) the liver questions.
"""

from __future__ import annotations

from case_env.core.frozen import FrozenDraw
from case_env.envs.imaging.bank.anatomist import SWAPPED_FAT
from case_env.envs.imaging.bank.drafts import BankContext, Draft, SkipError, call
from case_env.envs.imaging.bank.facts import PatientFacts, lesion_position
from case_env.envs.imaging.scan_protocol import STATION_NAMES
from case_env.envs.imaging.terms import Persona

LIVER_CHANGE = {
    "new_lesion": "A new focal lesion has appeared",
    "lesion_growth": "A focal lesion seen at baseline has grown",
    "fat_change": "The fat signal of the whole liver has changed",
    "no_change": "No significant change",
}
FAT_DIRECTION = {
    "increased": "It increased",
    "decreased": "It decreased",
    "unchanged": "It is unchanged",
    "artefact": "It only appears changed, because of an image artefact",
}
LESION_STATUS = {
    "new": "It is new: absent at baseline",
    "grew": "It was present at baseline and has grown",
    "unchanged": "It was present at baseline and is unchanged",
    "smaller": "It was present at baseline and is smaller now",
}
REGION_CHANGE = {
    "true_increase": "A true increase in tissue fat",
    "true_decrease": "A true decrease in tissue fat",
    "artefact": "A fat-water swap artefact, with no true change",
    "no_difference": "No visible difference",
}
MUSCLE_OR_PANCREAS_FAT = {"sarcopenia", "pancreatic_fatty_atrophy"}  # real fat changes outside the liver
FAT_CHANGED, FAT_STABLE = 3.0, 1.5  # points of liver signal fat fraction
GROWN_MM, GROWN_RATIO, STABLE_MM = 3.0, 1.15, 1.0


def measured_fat_class(f: PatientFacts) -> str:
    """increased / decreased / unchanged from the measured liver signal fat fraction at both visits."""
    before, after = f.visits["baseline"].fat.get("liver"), f.visits["follow_up"].fat.get("liver")
    if before is None or after is None:
        raise SkipError("no liver fat fraction", "the liver has no interior voxels at a visit")
    if max(before, after) > SWAPPED_FAT:
        raise SkipError("water and fat look exchanged", f"liver signal fat fraction {max(before, after)} %")
    delta = after - before
    if abs(delta) >= FAT_CHANGED:
        return "increased" if delta > 0 else "decreased"
    if abs(delta) <= FAT_STABLE:
        return "unchanged"
    raise SkipError("too close to call", f"liver fat fraction changed by {delta:+.1f} points")


def lesion_class(f: PatientFacts, before: float | None, after: float) -> str:
    """new / grew / unchanged / smaller for a lesion present at follow-up."""
    if before is None:
        return "new"
    if f.truth == "manifest":  # the generator's rule: RECIST 1.1 progression
        return "grew" if after >= before * 1.2 and after - before >= 5 else "unchanged"
    delta = after - before
    if delta >= GROWN_MM and after >= before * GROWN_RATIO:
        return "grew"
    if abs(delta) <= STABLE_MM:
        return "unchanged"
    if -delta >= GROWN_MM and before >= after * GROWN_RATIO:
        return "smaller"
    raise SkipError("too close to call", f"lesion diameter {before} mm to {after} mm")


def _veto_swapped_liver(f: PatientFacts) -> None:
    """A manifest that knows of a fat-water swap across the liver makes its image questions ambiguous."""
    if f.liver_partly_swapped:
        raise SkipError("fat-water swap in part of the liver (manifest)", f"station {f.swap_station}")
    if f.liver_swapped:
        raise SkipError("fat-water swap in the liver (manifest)", f"station {f.swap_station}")


def _draft(
    template: str, category: str, f: PatientFacts, stem: str, options: dict, evidence: list, insight: str
) -> Draft:
    return Draft(
        Persona.RADIOLOGIST,
        template,
        category,
        f.patient_id,
        stem,
        options[category],
        [t for c, t in options.items() if c != category],
        evidence,
        insight,
    )


def _main_liver_lesion(f: PatientFacts) -> dict | None:
    return next((t for t in f.lesion_tracks() if t["organ"] == "liver" and not t["incidental"]), None)


def _liver_change_measured(f: PatientFacts) -> tuple[str, dict | None]:
    """The answer class and the lesion that shows it, from the measurements."""
    lesions = [t for t in f.lesion_tracks() if t["organ"] == "liver" and t["diameters"][1] is not None]
    classes = [(lesion_class(f, *t["diameters"]), t) for t in lesions]
    for wanted, category in (("new", "new_lesion"), ("grew", "lesion_growth")):
        lesion = next((t for c, t in classes if c == wanted), None)
        if lesion:
            return category, lesion
    if any(c == "smaller" for c, _ in classes):
        raise SkipError("no option fits", "a liver lesion became smaller")
    fat = measured_fat_class(f)
    return ("no_change" if fat == "unchanged" else "fat_change"), (lesions[0] if lesions else None)


def _liver_change_manifest(f: PatientFacts) -> tuple[str, dict | None]:
    lesion = _main_liver_lesion(f)
    if f.scenario == "new_liver_lesion" and lesion:
        return "new_lesion", lesion
    if f.scenario == "growing_liver_lesion" and lesion:
        return "lesion_growth", lesion
    if f.scenario in ("steatosis_progression", "steatosis_regression"):
        return "fat_change", lesion
    return "no_change", lesion


def liver_change(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    _veto_swapped_liver(f)  # the liver images carry the artefact: asked by artefact_vs_change instead
    measured = f.truth == "measured"
    category, lesion = _liver_change_measured(f) if measured else _liver_change_manifest(f)
    evidence = [call("render_comparison", sequence="fat", plane="axial", organ="liver", position=50)]
    if lesion:
        position = lesion_position(ctx.imaging, f, "liver", lesion["centre_mm"])
        evidence = [
            call("render_comparison", sequence="water", plane="axial", organ="liver", position=position)
        ]
    insight = {
        "new_lesion": "The follow-up half shows a focal lesion in the liver that is absent at baseline.",
        "lesion_growth": "The liver lesion is visible on both halves and larger at follow-up.",
        "fat_change": "The whole liver's brightness on the fat image differs between the halves.",
        "no_change": "The liver looks the same on both halves; stable findings are not changes.",
    }[category]
    return [
        _draft(
            "liver_change",
            category,
            f,
            "Comparing baseline and follow-up MRI, what has changed in the liver?",
            LIVER_CHANGE,
            evidence,
            insight,
        )
    ]


def fat_direction(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    if f.truth == "measured" or f.liver_partly_swapped:
        _veto_swapped_liver(f)  # manifest truth answers a whole-liver swap: "artefact"
    if f.truth == "measured":
        category = measured_fat_class(f)
    elif f.liver_swapped:
        category = "artefact"
    elif f.scenario == "steatosis_progression":
        category = "increased"
    elif f.scenario == "steatosis_regression":
        category = "decreased"
    else:
        category = "unchanged"
    evidence = [
        call("render_comparison", sequence="fat", plane="axial", organ="liver", position=50),
        call("render_comparison", sequence="in", plane="axial", organ="liver", position=50),
    ]
    before, after = f.visits["baseline"].fat.get("liver"), f.visits["follow_up"].fat.get("liver")
    insight = (
        f"On fat images the liver goes from a signal fat fraction of {before} % to {after} %"
        if category != "artefact"
        else f"Water and fat are exchanged in station {f.swap_station} at follow-up; the in-phase image is "
        "unchanged, so the difference is not in the liver"
    )
    return [
        _draft(
            "fat_direction",
            category,
            f,
            "How did the fat content of the liver change from baseline to follow-up, judged on the images?",
            FAT_DIRECTION,
            evidence,
            insight + ".",
        )
    ]


def _lesion_organ(track: dict) -> tuple[str, str]:
    """(organ argument for the render tools, words for the question)."""
    if track["organ"] == "vertebrae":
        level = track["location"].split()[0].lower()  # "L2 vertebral body" -> "l2"
        return f"vertebrae_{level}", f"the {track['location']}"
    organ_words = track["organ"].replace("_", " ")
    return track["organ"], f"the {organ_words}" + (f" ({track['location']})" if track["location"] else "")


def lesion_status(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft | SkipError]:
    out = []
    for track in f.lesion_tracks():
        before, after = track["diameters"]
        if after is None:
            continue
        try:
            category = lesion_class(f, before, after)
        except SkipError as skip:
            out.append(skip)  # this lesion only; the patient's other lesions are still asked about
            continue
        organ, where = _lesion_organ(track)
        position = lesion_position(ctx.imaging, f, organ, track["centre_mm"])
        sequence = "fat" if track.get("kind") == "haemangioma" else "water"
        evidence = [
            call("render_comparison", sequence=sequence, plane="axial", organ=organ, position=position)
        ]
        sizes = f"{before:.0f} mm at baseline" if before else "absent at baseline"
        out.append(
            _draft(
                "lesion_status",
                category,
                f,
                f"At follow-up there is a focal lesion in {where}. How does it compare with baseline?",
                LESION_STATUS,
                evidence,
                f"The lesion measures {after:.0f} mm at follow-up, {sizes}.",
            )
        )
    return out


def artefact_vs_change(f: PatientFacts, d: FrozenDraw, ctx: BankContext) -> list[Draft]:
    if not f.has_manifest:
        raise SkipError(
            "needs a phantom manifest", "true change or fat-water swap is known only to a generator"
        )
    station = f.swap_station or 3
    if f.swap_station:
        category = "artefact"
    elif f.scenario == "steatosis_progression":
        category = "true_increase"
    elif f.scenario == "steatosis_regression":
        category = "true_decrease"
    elif f.scenario in MUSCLE_OR_PANCREAS_FAT:
        raise SkipError("true fat change outside the liver", f.scenario)
    else:
        category = "no_difference"
    region = STATION_NAMES[station - 1]
    evidence = [
        call("render_comparison", sequence="fat", plane="coronal", position=50),
        call("render_comparison", sequence="in", plane="coronal", position=50),
    ]
    insight = {
        "artefact": f"Station {station} is bright on the follow-up water image and dark on the fat image, exactly "
        "at the station borders, while the in-phase image is unchanged: a fat-water swap.",
        "true_increase": "The liver is brighter on the follow-up fat image, and the in-phase image agrees.",
        "true_decrease": "The liver is darker on the follow-up fat image, and the in-phase image agrees.",
        "no_difference": "The fat images of both visits match in this region.",
    }[category]
    return [
        _draft(
            "artefact_vs_change",
            category,
            f,
            f"Compare the fat images of the two visits in the {region} region (station {station}). What best "
            "describes the difference at follow-up?",
            REGION_CHANGE,
            evidence,
            insight,
        )
    ]


TEMPLATES = (liver_change, fat_direction, lesion_status, artefact_vs_change)
