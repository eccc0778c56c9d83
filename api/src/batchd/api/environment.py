"""Process settings read once at start-up from `BATCHD_*` variables, with errors that name the variable.

The operator and the replica each declare their settings as a subclass; pydantic-settings reads
and converts the environment, and a bad value stops the process at start-up with the variable,
the problem and the value, instead of surfacing later as a puzzling failure.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "BATCHD_"


class SettingsError(ValueError):
    """An environment variable holds a value the process cannot run with."""


class EnvironmentSettings(BaseSettings):
    """Base for settings read from `BATCHD_<FIELD>` variables; frozen once read."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, frozen=True, extra="ignore", populate_by_name=True)

    @classmethod
    def from_env(cls, **overrides: Any) -> Self:
        """Settings from the environment; explicit overrides (command-line flags) win, None is no override."""
        try:
            return cls(**{name: value for name, value in overrides.items() if value is not None})
        except ValidationError as error:
            raise SettingsError("\n".join(_describe(cls, problem) for problem in error.errors())) from None


def variable_of(settings: type[BaseSettings], field: str) -> str:
    """The environment variable a field is read from."""
    alias = settings.model_fields[field].validation_alias
    return alias if isinstance(alias, str) else f"{PREFIX}{field.upper()}"


def _describe(settings: type[BaseSettings], problem: Any) -> str:
    field = str(problem["loc"][0]) if problem["loc"] else ""
    where = variable_of(settings, field) if field in settings.model_fields else field or "(settings)"
    message = str(problem["msg"]).removeprefix("Value error, ")
    return f"{where}: {message} (got {problem['input']!r})"
