"""The imaging environment (CASE): longitudinal whole-body Dixon MRI behind patient-scoped tools.

Its parts: the data layer (`data/`), the synthetic generator (`synth/`), rendering (`viewer/`), the question
bank (`bank/`), scripted baselines (`agents/`), the letter reward, benchmarks (`bench/`) and the UK Biobank
scan protocol (`scan_protocol`).
"""

from case_env.envs.imaging.environment import ImagingEnvironment

__all__ = ["ImagingEnvironment"]
