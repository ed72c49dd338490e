"""The imaging environment's benchmark mixes: what one episode of each calls, with drawn arguments."""

from __future__ import annotations

import random

ORGANS = ("liver", "spleen", "pancreas", "left_kidney", "right_kidney", "gallbladder")
SEQUENCES = ("water", "fat", "in", "opp")
PLANES = ("axial", "coronal", "sagittal")


def episode_calls(rng: random.Random) -> list[tuple[str, dict]]:
    """One episode's calls: the shape of a Radiologist or Anatomist trajectory, with drawn arguments."""
    organ = rng.choice(ORGANS[:3])
    position = rng.randint(20, 80)
    return [
        ("list_visits", {}),
        ("get_clinical_context", {"section": rng.choice(("demographics", "study", "history"))}),
        ("get_organ_volume", {"organ": rng.choice(ORGANS), "visit": rng.choice(("baseline", "follow_up"))}),
        ("compare_organ_volume", {"organ": rng.choice(ORGANS)}),
        (
            "render_slice",
            {
                "visit": "baseline",
                "sequence": rng.choice(SEQUENCES),
                "plane": "axial",
                "organ": organ,
                "position": position,
            },
        ),
        (
            "render_slice",
            {
                "visit": "follow_up",
                "sequence": rng.choice(SEQUENCES),
                "plane": rng.choice(PLANES),
                "overlay": True,
                "position": rng.randint(20, 80),
            },
        ),
        (
            "render_comparison",
            {
                "sequence": rng.choice(("fat", "water")),
                "plane": "axial",
                "organ": organ,
                "position": position,
            },
        ),
        (
            "render_slice",
            {"visit": "follow_up", "sequence": "opp", "plane": "sagittal", "position": rng.randint(20, 80)},
        ),
        ("read_report", {"visit": rng.choice(("baseline", "follow_up"))}),
    ]


def cheap_calls(rng: random.Random) -> list[tuple[str, dict]]:
    """The cheap mix: an episode of list_visits calls only (answered from memory, no pixels)."""
    return [("list_visits", {})] * 9


def render_calls(rng: random.Random) -> list[tuple[str, dict]]:
    """The render mix: render_slice calls only, a third of them with the organ overlay."""
    return [
        (
            "render_slice",
            {
                "visit": rng.choice(("baseline", "follow_up")),
                "sequence": rng.choice(SEQUENCES),
                "plane": rng.choice(PLANES),
                "position": rng.randint(5, 95),
                **({"overlay": True} if rng.random() < 1 / 3 else {}),
            },
        )
        for _ in range(9)
    ]


# the mixes the shared load generator plays (`case_env.bench.load`, the `Benchmarks` part): `episode` a whole
# imaging episode, renders included; `cheap` list_visits only, the framework's own cost per call; `render`
# render_slice only, a render's
MIXES = {"episode": episode_calls, "cheap": cheap_calls, "render": render_calls}
