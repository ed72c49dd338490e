"""Real ids for the reliability suite's schemathesis run (loaded by its CLI through SCHEMATHESIS_HOOKS).

Generated bodies name random patients, so nearly every tool call would stop at 404. Every positive call of
each tool here names a real case of the tool's environment (negative ones keep their generated ids, 404 among
them), and half reuse one of a few episode ids, so that calls reach the tools, episodes bind and a patient
switch meets 403; episode lookups ask for those episodes.
The choice is seeded by the generated case, so a run with a fixed seed is the same run. Negative cases are
left as generated: a real id would make some of them valid."""

from __future__ import annotations

import json
import os
import random

import schemathesis

IDS = json.loads(os.environ.get("CASE_ENV_FUZZ_IDS", "{}"))
EPISODES = [f"fuzz-{n}" for n in range(6)]


@schemathesis.hook
def map_case(context, case):
    if case.meta is not None and case.meta.generation.mode.is_negative:
        return case  # a negative case keeps what makes it invalid
    path = case.operation.path
    rng = random.Random(repr((path, case.body, case.path_parameters)))
    if path.startswith("/v1/tools/") and isinstance(case.body, dict):
        patients = IDS.get("tools", {}).get(path.rsplit("/", 1)[-1])
        if patients and "patient_id" in case.body:
            case.body["patient_id"] = rng.choice(patients)
        if "episode_id" in case.body and rng.random() < 0.5:
            case.body["episode_id"] = rng.choice(EPISODES)
    elif path == "/v1/episodes/{episode_id}" and case.path_parameters and rng.random() < 0.75:
        case.path_parameters["episode_id"] = rng.choice(EPISODES)
    return case
