"""The tools a model can call: one module per tool (installed as `case_env.tools`).

Each module defines NAME, DESCRIPTION, PERSONAS, a pydantic `Args` model of scalars and enums, and
`run(ctx, args) -> ToolResult`; `case_env.tooling.load_tools` finds them. Modules whose names start with
an underscore are helpers, not tools.
"""
