"""`python -m batchd.operator`: run Kopf with the handlers and the settings from the environment."""

from __future__ import annotations

import sys

import kopf

from batchd.api.environment import SettingsError
from batchd.operator import kopf_handlers  # noqa: F401  (registers the handlers)
from batchd.operator.settings import Settings


def main() -> int:
    try:
        settings = Settings.from_env()
    except SettingsError as error:
        print(f"batchd-operator: {error}", file=sys.stderr)
        return 2
    kopf.configure(verbose=False)
    kopf.run(
        standalone=not settings.peering_name,
        peering_name=settings.peering_name or None,
        namespaces=settings.namespaces,
        clusterwide=not settings.namespaces,
        liveness_endpoint=settings.liveness_endpoint or None,
        memo=kopf.Memo(settings=settings),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
