"""`python -m case_env.cli`, as the `case-env` script."""

from case_env.cli import main

main()
