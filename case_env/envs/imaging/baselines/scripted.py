"""A model-free policy that reads tool *text*: volumes, changes, dates and report statements.

It makes the calls the row's evidence names (after list_visits), parses what comes back the way a careful
reader would, and picks the option that matches. It never sees the ground truth; if the bank asks something
the text cannot settle, this agent fails, which is how the bank is checked for solvability.
"""

from __future__ import annotations

import re

from case_env.core.policy import Observation
from case_env.envs.imaging.baselines.base import Agent, Decision

_VOLUME = re.compile(r"volume ([\d,]+\.\d) mL")
_FAT = re.compile(r"signal fat fraction ([\d.]+) %")
_CHANGE = re.compile(r"change [+-][\d,.]+ mL \(([+-][\d.]+) %\)")
_CLAIM = re.compile(
    r'"(?P<report>.+?), and the (?P<organ>[a-z ]+?) measures (?P<dir>more|less) than '
    r'(?P<amount>[\d,]+) mL at follow-up\."'
)
_GRADE = re.compile(r"grades the liver fat as (.+)$")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _simplify(text: str) -> str:
    return text.lower().replace(" muscle", "").replace("_", " ").strip()


class TextAgent(Agent):
    """Anatomist and consultant questions."""

    def plan(self) -> list[tuple[str, dict]]:
        return [("list_visits", {})] + [(e["tool"], e["arguments"]) for e in self.extra["evidence"]]

    def next_call(self, outputs: list[Observation]) -> tuple[str, dict] | None:
        plan = self.plan()
        return plan[len(outputs)] if len(outputs) < len(plan) else None

    def decide(self, outputs: list[Observation]) -> Decision:
        template = self.extra.get("template", "")
        handler = getattr(self, f"_{template}", None)
        decision = handler(outputs) if handler else None
        return decision or Decision("A", "The evidence does not settle it; guessing.")

    # -- anatomist -------------------------------------------------------------------------------------
    def _organ_volume(self, outputs):
        match = _VOLUME.search(outputs[-1].text)
        value = match and f"{match.group(1)} mL"
        letter = self.option_where(lambda t: t == value)
        return letter and Decision(letter, f"The measured volume is {value}.")

    def _liver_fat_fraction(self, outputs):
        match = _FAT.search(outputs[-1].text)
        value = match and f"{float(match.group(1)):.1f} %"
        letter = self.option_where(lambda t: t == value)
        return letter and Decision(letter, f"The liver's signal fat fraction is {value}.")

    def _most_changed(self, outputs):
        changes = {}
        for out in outputs:
            match = _CHANGE.search(out.text)
            if out.tool == "compare_organ_volume" and match:
                changes[_simplify(out.arguments["organ"])] = abs(float(match.group(1)))
        if not changes:
            return None
        top = max(changes, key=changes.get)
        letter = self.option_where(lambda t: _simplify(t) == top)
        return letter and Decision(
            letter, f"Between baseline and follow-up, the {top} changed most ({changes[top]:.1f} %)."
        )

    def _kidney_sides(self, outputs):
        volumes = {}
        for out in outputs:
            match = _VOLUME.search(out.text)
            if out.tool == "get_organ_volume" and match:
                volumes[out.arguments["organ"]] = _number(match.group(1))
        if set(volumes) != {"left_kidney", "right_kidney"}:
            return None
        left, right = volumes["left_kidney"], volumes["right_kidney"]
        side = "left" if left > right else "right"
        excess = 100 * (max(left, right) - min(left, right)) / min(left, right)
        much = excess > 5
        letter = self.option_where(
            lambda t: t.lower().startswith(f"the {side} kidney") and (("more than" in t) == much)
        )
        return letter and Decision(
            letter, f"Left {left} mL, right {right} mL: {side} larger by {excess:.1f} %."
        )

    # -- consultant ------------------------------------------------------------------------------------
    def _report(self, outputs, visit: str) -> str:
        return next(
            (o.text for o in outputs if o.tool == "read_report" and o.arguments.get("visit") == visit), ""
        )

    def _pick_code(self, code: str | None, none_option: str, none_why: str, why: str, quoted: str):
        """The option of a diagnosis code, or the "none" option when the reports support no code; the reason
        quotes the impressions it read."""
        if code is None:
            letter = self.option_where(lambda t: t.startswith(none_option))
            return letter and Decision(letter, f"{none_why} {quoted}")
        letter = self.option_where(lambda t: t.startswith(code))
        return letter and Decision(letter, f"{why.format(code=code)} {quoted}")

    def _quoted(self, outputs, *visits: str) -> str:
        """Each visit's report impression as the report words it."""
        return " ".join(
            f'The {visit.replace("_", "-")} impression reads: "{_impression(self._report(outputs, visit))}".'
            for visit in visits
        )

    def _diagnosis(self, outputs):
        code = _impression_code(self._report(outputs, "follow_up"), at_baseline=False)
        return self._pick_code(
            code,
            "No new diagnosis",
            "The follow-up report shows no significant interval change.",
            "The follow-up impression supports {code}.",
            self._quoted(outputs, "follow_up"),
        )

    def _interval_diagnosis(self, outputs):
        before = _impression_code(self._report(outputs, "baseline"), at_baseline=True)
        after = _impression_code(self._report(outputs, "follow_up"), at_baseline=False)
        return self._pick_code(
            None if after == before else after,
            "None of these",
            "The follow-up report shows no finding the baseline lacked.",
            "The follow-up impression adds {code}.",
            self._quoted(outputs, "baseline", "follow_up"),
        )

    def _prior_diagnosis(self, outputs):
        code = _impression_code(self._report(outputs, "baseline"), at_baseline=True)
        return self._pick_code(
            code,
            "None of these",
            "The baseline report shows no such finding.",
            "The baseline impression already shows {code}.",
            self._quoted(outputs, "baseline"),
        )

    def _claim(self, outputs):
        match = _CLAIM.search(self.extra["question"])
        if not match:
            return None
        report = self._report(outputs, "follow_up").lower()
        measured = next((o for o in outputs if o.tool == "get_organ_volume"), None)
        value = _VOLUME.search(measured.text) if measured else None
        if value is None:
            letter = self.option_where(lambda t: t.startswith("Cannot be determined"))
            return letter and Decision(letter, "The segmentation does not contain that organ.")
        volume, amount = _number(value.group(1)), _number(match.group("amount"))
        measurement_holds = volume > amount if match.group("dir") == "more" else volume < amount
        report_holds = _report_claim_holds(match.group("report").lower(), report)
        if report_holds is None:
            return None
        measured = f"The follow-up measurement is {volume:,.1f} mL."
        if report_holds and measurement_holds:
            verdict, why = "Supported", f"Both the report and the measurement agree. {measured}"
        elif not report_holds:
            verdict, why = "Refuted: the report", f"The report contradicts the first part. {measured}"
        else:
            verdict, why = "Refuted: the measurement", f"{measured} It contradicts the claim."
        letter = self.option_where(lambda t: t.startswith(verdict))
        return letter and Decision(letter, why)


_IMPRESSION_RULES = (
    ("hepatic steatosis", "K76.0"),
    ("suspicious for metastasis", "C78.7"),
    ("splenomegaly", "R16.1"),
    ("pancreatic fatty atrophy", "K86.8"),
    ("loss of skeletal muscle", "M62.5"),
)


def _impression(report: str) -> str:
    """A report's impression, its numbered points joined."""
    lines = report.split("## Impression", 1)[-1].strip().splitlines()
    return " ".join(line.split(". ", 1)[-1] for line in lines if line.strip())


def _impression_code(report: str, at_baseline: bool) -> str | None:
    """The ICD-10 code a report's impression supports. A cyst counts at follow-up only when it is new or
    enlarging (a stable one is no interval diagnosis); at baseline any cyst in the impression counts."""
    impression = report.split("## Impression", 1)[-1].lower()
    code = next((c for key, c in _IMPRESSION_RULES if key in impression), None)
    if (
        code is None
        and "cyst" in impression
        and (at_baseline or "new" in impression or "enlarg" in impression)
    ):
        code = "N28.1" if "kidney" in impression else "K76.8"
    return code


def _report_claim_holds(claim: str, report: str) -> bool | None:
    """Does the follow-up report say what the claim says it says?"""
    spleen_line = next((line for line in report.splitlines() if line.startswith("- spleen volume")), "")
    if "spleen as enlarged" in claim:
        return "; enlarged" in spleen_line
    if "spleen as normal in size" in claim:
        return "normal size" in spleen_line
    grade = _GRADE.search(claim)
    if grade:
        liver_line = next((line for line in report.splitlines() if line.startswith("- liver volume")), "")
        return f"({grade.group(1)})" in liver_line
    findings = report.split("## findings", 1)[-1].split("## other findings", 1)[0]
    new_lesion = "- new " in findings
    if "describes no new focal lesion" in claim:
        return not new_lesion
    if "describes a new focal lesion" in claim:
        return new_lesion
    return None
