"""Kubernetes resource quantities (`512Mi`, `2G`, `1e9`) read as numbers, and the memory a pod's
`resources` ask for: what a replica sizes its caches by.

The format is the API server's own (`k8s.io/apimachinery/pkg/api/resource`): a decimal number and
one suffix, binary (Ki ... Ei), decimal (n, u, m, k, M ... E) or a decimal exponent (e3, E-2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def parse_quantity(text: str) -> float:
    """The number a quantity stands for (`1Gi` -> 1073741824.0); ValueError naming the text when it
    is no quantity."""
    found = _QUANTITY.match(text.strip())
    if found is None:
        raise ValueError(f"expected a Kubernetes quantity such as 512Mi or 2G, got {text!r}")
    number, exponent, suffix = found.groups()
    if exponent is not None:
        return float(number + exponent)
    return float(number) * (_BINARY.get(suffix) or _DECIMAL[suffix or ""])


def memory_request_bytes(resources: Mapping[str, Any]) -> int | None:
    """The memory a container's `resources` ask for, in bytes: its request, else its limit (the API
    server then sets the request to the limit); None when neither names memory or the value is
    not a quantity (the API server would have refused it)."""
    for section in ("requests", "limits"):
        value = (resources.get(section) or {}).get("memory")
        if value is None:
            continue
        try:
            return int(parse_quantity(str(value)))
        except ValueError:
            return None
    return None
