"""Process settings read once at start-up from `BATCHD_*` variables, with errors that name the variable.

The operator and the replica each declare their settings as a subclass; pydantic-settings reads
and converts the environment, and a bad value stops the process at start-up with the variable,
the problem and the value, instead of surfacing later as a puzzling failure.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BeforeValidator, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

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


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


# A process's log level; `INFO` reads as `info`.
LogLevel = Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)]


class ClusterClientSettings(EnvironmentSettings):
    """Base for the settings of a process that reads the Kubernetes API (the operator, the router):
    which namespaces it looks at, and where its credentials are outside a cluster."""

    # Namespaces to watch, comma-separated in BATCHD_NAMESPACES; empty = the whole cluster (which
    # then takes a ClusterRole rather than Roles).
    namespaces: Annotated[tuple[str, ...], NoDecode] = ()
    # Where the kubeconfig is when running outside a cluster ("" = in-cluster service account).
    kubeconfig: str = Field(default="", validation_alias="KUBECONFIG", repr=False)

    @field_validator("namespaces", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(namespace.strip() for namespace in value.split(",") if namespace.strip())
        return value


def variable_of(settings: type[BaseSettings], field: str) -> str:
    """The environment variable a field is read from."""
    alias = settings.model_fields[field].validation_alias
    return alias if isinstance(alias, str) else f"{PREFIX}{field.upper()}"


def _describe(settings: type[BaseSettings], problem: Any) -> str:
    field = str(problem["loc"][0]) if problem["loc"] else ""
    where = variable_of(settings, field) if field in settings.model_fields else field or "(settings)"
    message = str(problem["msg"]).removeprefix("Value error, ")
    return f"{where}: {message} (got {problem['input']!r})"
