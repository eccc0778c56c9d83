"""`load_model`: the loader a model spec needs. It sits above `models` and `generation`, which never
import each other: a text-generation model is served by the generation package, every other task by
a pipeline, a custom handler by its own class."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from batchd.api.spec import ModelSpec
from batchd.replica.models.base import BatchModel, ModelLoadError
from batchd.replica.models.executor import ModelExecutor


def load_model(
    spec: ModelSpec,
    *,
    mirror_dir: Path | None,
    pvc_root: Path,
    calls: Mapping[str, str] | None = None,
    composer: str = "",
) -> BatchModel:
    """Load the model `spec` names. Blocking: the app calls it in a thread during start-up.

    `calls` is where each alias of `model.calls` is reached (alias -> base URL); `composer` the
    name of the deployment that calls them, which its calls say.
    """
    executor = ModelExecutor()
    try:
        if spec.handler is not None:
            from batchd.replica.models.custom import load_custom_handler

            return load_custom_handler(spec, executor, calls, composer)
        if calls:
            raise ModelLoadError(f"--call/BATCHD_CALLS: model.task={spec.task!r} calls no other deployment")
        from batchd.replica.models.pipelines import load_pipeline
        from batchd.replica.models.sources import resolve_source

        assert spec.source is not None
        location = resolve_source(spec.source, mirror_dir=mirror_dir, pvc_root=pvc_root)
        if spec.task == "text-generation":  # it serves the generate routes too
            from batchd.replica.generation.loader import load_text_generation

            return load_text_generation(spec, location, executor)
        return load_pipeline(spec, location, executor)
    except BaseException:
        executor.close()
        raise
