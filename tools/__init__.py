"""The tools a model can call: one folder per environment, one module per tool (installed as
`case_env.tools.<env>`).

Each module defines NAME, DESCRIPTION, PERSONAS, a pydantic `Args` model of scalars and enums, and
`run(ctx, args) -> ToolResult` (`case_env.core.tools`). Modules whose names start with an underscore are
helpers, not tools.
"""
