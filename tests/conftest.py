"""Shared test set-up: offline model hubs, and the repository root on sys.path for `examples`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# No model hub can be reached: every model comes from disk.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# A real Prometheus for any test that asks for it (`start_prometheus`).
pytest_plugins = ["tests.support.prometheus"]
