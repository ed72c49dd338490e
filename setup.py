"""Package discovery (everything else is in pyproject.toml): every package under case_env/, and the top-level
tools/ and personas/ folders (their place is fixed by the product card) installed as case_env.tools and
case_env.personas, one subpackage per environment, so nothing generic such as `tools` lands in site-packages."""

from setuptools import find_packages, setup


def mapped(prefix: str, folder: str) -> list[str]:
    return [prefix, *(f"{prefix}.{name}" for name in find_packages(folder))]


setup(
    packages=[
        *find_packages(include=["case_env", "case_env.*"]),
        *mapped("case_env.tools", "tools"),
        *mapped("case_env.personas", "personas"),
    ],
    package_dir={"case_env.tools": "tools", "case_env.personas": "personas"},
)
