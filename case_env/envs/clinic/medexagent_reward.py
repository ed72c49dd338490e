"""MedExAgent's reward terms, written from its `train/rl/reward.py` (docs/sources.md, MedExAgent).

A tool is `(name, arguments)` as the model called it. The ground truth is the case's work-up, one tool per
distinct exam (MedExAgent's executor keys its exam map by name and lower-cased values).

- `tool_match`: ToolRL's three levels: the multiset Jaccard of tool names, plus for each ground-truth tool
  the best remaining predicted tool of that name (parameter-name Jaccard + count of values equal as
  lower-cased strings; the first best wins and is used up), over 1 + sum(1 + parameters of each
  ground-truth tool). 1 when both lists are empty, 0 when only one is.
- `cost_penalty`: each ground-truth name grants one free call per occurrence; every other call pays
  cost + discomfort (`EXAM_COST`, (2, 2) for a name it lacks; 1 each with `uniform`), over 6, unbounded.
- `cost_totals`: the three totals MedExAgent logs (every call; calls whose name is not in the work-up; the
  work-up itself).
- `format_penalty`: the share of tool-call turns with a malformed call or more than one call.
- The judge: its prompt and reply format (`gt_count`, `pred_count`, `matched`; counts at least 1, matched at
  least 0 and at most either count; unreadable lines keep the defaults 1, 1, 0), scored as the Jaccard.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from case_env.medicine.exams import DEFAULT_TIERS, EXAMS, MAX_EXAM_SCORE

Tool = tuple[str, dict[str, Any]]


def _jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def _multiset_jaccard(a: list[str], b: list[str]) -> float:
    ca, cb = Counter(a), Counter(b)
    keys = set(ca) | set(cb)
    union = sum(max(ca[k], cb[k]) for k in keys)
    return sum(min(ca[k], cb[k]) for k in keys) / union if union else 1.0


def tool_match(predicted: list[Tool], truth: list[Tool]) -> float:
    if not predicted and not truth:
        return 1.0
    if not predicted or not truth:
        return 0.0
    names = _multiset_jaccard([n for n, _ in predicted], [n for n, _ in truth])
    remaining = list(predicted)
    earned, possible = 0.0, 0.0
    for name, params in truth:
        possible += 1.0 + len(params)
        best, best_at = -1.0, None
        for at, (other, given) in enumerate(remaining):
            if other != name:
                continue
            values = sum(1 for k in params if k in given and str(params[k]).lower() == str(given[k]).lower())
            score = _jaccard(set(params), set(given)) + values
            if score > best:
                best, best_at = score, at
        if best_at is not None:
            earned += best
            remaining.pop(best_at)
    return (names + earned) / (1.0 + possible)


def charge(name: str) -> int:
    exam = EXAMS.get(name)
    return exam.charge if exam is not None else sum(DEFAULT_TIERS)


def cost_penalty(predicted: list[Tool], truth: list[Tool], uniform: bool = False) -> float:
    free = Counter(name for name, _ in truth)
    total = 0.0
    for name, _ in predicted:
        if free[name] > 0:
            free[name] -= 1
        else:
            total += 1.0 if uniform else charge(name)
    return total / MAX_EXAM_SCORE


def cost_totals(predicted: list[Tool], truth: list[Tool]) -> dict[str, float]:
    names = {name for name, _ in truth}
    return {
        "tool_cost_total": float(sum(charge(n) for n, _ in predicted)),
        "tool_cost_unnecessary": float(sum(charge(n) for n, _ in predicted if n not in names)),
        "tool_cost_ground_truth": float(sum(charge(n) for n, _ in truth)),
    }


def format_penalty(attempts: int, errors: int) -> float:
    return errors / attempts if attempts > 0 else 0.0


JUDGE_PROMPT = """\
You are a medical expert evaluating a diagnosis prediction.

Ground truth diagnosis: {ground_truth}
Predicted diagnosis: {prediction}

Instructions:
1. Identify the individual medical conditions in the ground truth. Note that a comma may be part of a single \
condition name (e.g. "seminoma, classic type" is ONE condition, "Follicular lymphoma, grade 2" is ONE \
condition). Semicolons or "and" typically separate distinct conditions.
2. Identify the individual medical conditions in the prediction, using the same logic.
3. For each ground truth condition, check if any predicted condition refers to the same disease. Consider \
synonyms (e.g. "heart attack" = "myocardial infarction"), abbreviations, and minor wording differences.
4. Count how many ground truth conditions have a match in the predictions.

You MUST respond in exactly this format (numbers only):
gt_count: <number of ground truth conditions>
pred_count: <number of predicted conditions>
matched: <number of matched conditions>"""
JUDGE_MODEL = "gpt-4.1-mini"  # MedExAgent's judge
JUDGE_TEMPERATURE = 0.7  # MedExAgent's judge temperature (reward.py); an option here
JUDGE_MAX_TOKENS = 50


def parse_judge(reply: str) -> tuple[int, int, int]:
    """(gt_count, pred_count, matched) from a judge reply, read as MedExAgent reads it."""
    counts = {"gt_count": 1, "pred_count": 1, "matched": 0}
    for line in reply.split("\n"):
        line = line.strip().lower()
        for key in counts:
            if line.startswith(f"{key}:"):
                try:
                    value = int(line.split(":")[1].strip())
                except (ValueError, IndexError):
                    continue
                counts[key] = max(0 if key == "matched" else 1, value)
    gt, pred = counts["gt_count"], counts["pred_count"]
    return gt, pred, min(counts["matched"], gt, pred)
