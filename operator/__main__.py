"""`python -m batchd.operator`: run Kopf with the handlers and the settings from the environment."""

from __future__ import annotations

import kopf

from batchd.operator import handlers  # noqa: F401  (registers the handlers)
from batchd.operator.settings import Settings


def main() -> None:
    settings = Settings.from_env()
    kopf.configure(verbose=False)
    kopf.run(
        standalone=not settings.peering_name,
        peering_name=settings.peering_name or None,
        namespaces=settings.namespaces,
        clusterwide=not settings.namespaces,
        liveness_endpoint=settings.liveness_endpoint or None,
        memo=kopf.Memo(settings=settings),
    )


if __name__ == "__main__":
    main()
