"""The built-in environments, each one package of the same shape (`case_env.core.environment`), registered
under the entry-point group `case_env.environments` like any other."""
