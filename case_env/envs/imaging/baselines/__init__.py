"""Model-free policies: a text reader and an image reader, chosen by the question's template."""

from __future__ import annotations

from case_env.envs.imaging.baselines.base import Agent

IMAGE_TEMPLATES = frozenset({"fat_direction", "artefact_vs_change", "liver_change", "lesion_status"})


def scripted_agent(extra: dict) -> Agent:
    """The best model-free policy for a question: pixels for image questions, text for the rest."""
    from case_env.envs.imaging.baselines.scripted import TextAgent
    from case_env.envs.imaging.baselines.vision import VisionAgent

    return VisionAgent(extra) if extra.get("template") in IMAGE_TEMPLATES else TextAgent(extra)
