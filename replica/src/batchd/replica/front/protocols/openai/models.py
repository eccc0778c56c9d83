"""The model as OpenAI clients name and list it: `model.served_model_name`, else the model's name.

`GET /v1/models` and `GET /v1/models/{name}` are also KServe V1's model listing and status
(`protocols.kserve_v1`): one route answers both protocols, with KServe's fields (`models`;
`name`, `ready`) and OpenAI's (`object`, `data`; `id`, `created`, `owned_by`) side by side, so
that the openai client, LangChain and a KServe client all read the same answer.
"""

from __future__ import annotations

import time
from typing import Any

from batchd.replica.errors import UnknownModel
from batchd.replica.replica import Replica

OWNER = "batchd"
_STARTED = int(time.time())  # OpenAI's `created`: when this replica's process started


def served_names(replica: Replica) -> tuple[str, ...]:
    """The names a request's `model` may give: the served name, then the model's name."""
    served = replica.manifest.served_model_name
    return (served,) if served == replica.model_name else (served, replica.model_name)


def check_model(replica: Replica, name: str) -> None:
    if name not in served_names(replica):
        raise UnknownModel(
            f"model: {name!r} is not served here; this replica serves {served_names(replica)[0]!r} "
            "(GET /v1/models)"
        )


def model_card(replica: Replica) -> dict[str, Any]:
    """OpenAI's model object for the served name."""
    return {"id": served_names(replica)[0], "object": "model", "created": _STARTED, "owned_by": OWNER}


def model_list(replica: Replica) -> dict[str, Any]:
    """OpenAI's list of models: this replica's one."""
    return {"object": "list", "data": [model_card(replica)]}
