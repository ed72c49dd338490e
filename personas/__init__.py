"""Who the model is, per environment: one folder per environment, one module per persona (installed as
`case_env.personas.<env>`), read by `case_env.core.personas`. Each folder's `ANSWER_RULE` ends every system
prompt of its personas unless a persona sets its own."""
