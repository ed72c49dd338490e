"""`case-env serve --ray --replicas N`: the same app as replicas of a Ray Serve deployment.

A verl job already runs on a Ray cluster; deploying the tool server there lets a lab scale it with the
rollout workers instead of running a separate service. Each replica builds the app with the same factory
`case-env serve` uses (Ray's ingress builder runs on the replica, so nothing is pickled but settings), and
Ray's HTTP proxy spreads calls across replicas.

What changes against uvicorn workers: the episode database must be reachable from every replica (a SQLite
file on shared storage; the default here is a file in a local temporary directory, right for one machine),
and `/metrics` answers for whichever replica takes the request.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def _build_app():
    from case_env.server.app import create_app

    return create_app()


def deploy(
    replicas: int,
    host: str,
    port: int,
    env: dict[str, str],
    cpus_per_replica: float = 1.0,
    address: str | None = None,
) -> Callable[[], None]:
    """Start (or join) Ray, deploy `replicas` replicas behind Ray Serve's proxy on host:port, return a
    function that tears it down. `env` (the CASE_ENV_* settings) is set in every replica."""
    import ray
    from ray import serve

    ray.init(
        address=address,
        ignore_reinit_error=True,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env},
    )
    serve.start(http_options={"host": host, "port": port}, detached=False)

    @serve.ingress(_build_app)
    class CaseEnvReplica:
        """One replica of the tool server; its routes come from the app factory."""

    deployment = serve.deployment(
        CaseEnvReplica,
        name="case-env",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica},
        max_ongoing_requests=int(env.get("CASE_ENV_MAX_IN_FLIGHT", "256")),
    )
    serve.run(deployment.bind(), name="case-env", route_prefix="/", blocking=False)

    def shutdown() -> None:
        serve.shutdown()
        ray.shutdown()

    return shutdown


def settings_env() -> dict[str, str]:
    """The CASE_ENV_* variables of this process, passed on to the replicas."""
    return {k: v for k, v in os.environ.items() if k.startswith("CASE_ENV_")}
