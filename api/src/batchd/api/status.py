"""The `status` of a BatchedDeployment: one typed definition, as the spec has one.

The operator writes it (one writer, section by section: `batchd.operator.status_writer`), the CRD's
status schema is generated from it (`batchd.api.crd`), and the router reads its rollout. Each
top-level field is a section that one write replaces whole, so that nothing an older write put
there survives a newer one.

Reading is lenient (`read_status`): a section an older or newer operator wrote in another shape is
dropped, not fatal, and the section is written again whole at the next write.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from batchd.api.spec import ModelSpec

logger = logging.getLogger(__name__)


def _whole_seconds_utc(moment: datetime.datetime | None) -> datetime.datetime | None:
    """Kubernetes' own timestamps (metav1.Time) are UTC to the second."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.astimezone(datetime.UTC).replace(microsecond=0)


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


# A moment, or none (absent; an empty string, as earlier versions wrote "none", reads as none).
Timestamp = Annotated[
    datetime.datetime | None, BeforeValidator(_empty_is_none), AfterValidator(_whole_seconds_utc)
]


class _Status(BaseModel):
    # Written only by the operator; read back leniently (fields another version wrote are ignored).
    model_config = ConfigDict(
        extra="ignore", frozen=True, populate_by_name=True, use_attribute_docstrings=True
    )


ConditionType = Literal["Ready", "Progressing", "Degraded", "RolledBack", "AccessReady"]


class Condition(_Status):
    """One condition, as the Kubernetes API conventions (metav1.Condition) have it."""

    type: ConditionType
    """Ready, Progressing, Degraded, RolledBack or AccessReady."""

    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""

    reason: str = ""
    """One CamelCase word a program can match."""

    message: str = ""
    """What a human needs to know."""

    observed_generation: int = Field(default=0, ge=0, alias="observedGeneration")
    """The metadata.generation the condition describes."""

    last_transition_time: Timestamp = Field(default=None, alias="lastTransitionTime")
    """When `status` last changed."""

    @property
    def holds(self) -> bool:
        return self.status == "True"


class AutoscalingStatus(_Status):
    """What the autoscaler last saw and did (with spec.autoscaling only)."""

    load: int = 0
    """Items the ready replicas hold, queued or in the model, summed."""

    held_requests: int = 0
    """Requests the routers hold for the deployment while it has no ready replica."""

    ready_replicas: int = 0
    """Replicas it read."""

    target_ongoing_items: int = 0
    """Items each replica should hold."""

    recommended_replicas: int = 0
    """What the load alone asks for, before bounds and delays."""

    last_scale_time: Timestamp = None
    """When it last changed the count."""

    last_scale_reason: str = ""
    """Why it last changed the count."""


class BatchingStatus(_Status):
    """Live retuning: which spec.batching the replicas run."""

    revision: int
    """The batching revision of spec.batching (a hash of it): what the replicas report running."""

    ready_replicas_applied: int = 0
    """Ready replicas that report running this revision."""

    applied: bool = False
    """True once every ready replica runs this revision."""


RolloutPhase = Literal["", "Progressing", "Paused", "Promoting", "Promoted", "RolledBack", "Aborted"]


class CanaryReplicas(_Status):
    """The canary revision's Deployment, as its controller reports it."""

    replicas: int = 0
    """Pods it asks for: its share of the deployment's count."""

    ready_replicas: int = 0
    """Of them, Ready."""

    failure: str = ""
    """Its own failure condition, when it has one (ReplicaFailure, ProgressDeadlineExceeded)."""


class RolloutStatus(_Status):
    """Where a canary rollout stands (spec.rollout.strategy: canary), and what each revision runs;
    the router reads canary_percent."""

    phase: RolloutPhase = ""
    """Progressing, Paused, Promoting, Promoted, RolledBack or Aborted; empty when no canary
    rollout was ever made."""

    reason: str = ""
    """Why a rollout ended as it did: AnalysisFailed or ProgressDeadlineExceeded when RolledBack."""

    canary_revision: str = ""
    """The revision being rolled out."""

    step: int = Field(default=0, ge=0)
    """The step being taken, from 0."""

    canary_percent: int = Field(default=0, ge=0, le=100)
    """The canary's share of the requests now, in percent: its step's once it has the Ready
    replicas to carry it, else the share it carried before."""

    step_entered_at: Timestamp = None
    """When the step was entered (its replicas asked for): its progress deadline counts from here."""

    step_started_at: Timestamp = None
    """When the step's share began to be carried: its hold counts from here."""

    message: str = ""
    """What the rollout did last, with the figures."""

    stable_model: ModelSpec | None = None
    """spec.model of the stable revision."""

    stable_image: str | None = None
    """spec.image of the stable revision (absent: the operator's default)."""

    canary_model: ModelSpec | None = None
    """spec.model of the revision being rolled out."""

    canary_image: str | None = None
    """spec.image of the revision being rolled out (absent: the operator's default)."""

    canary: CanaryReplicas | None = None
    """The canary's replicas, while it has a Deployment."""


class BatchedDeploymentStatus(_Status):
    """Written by the operator, in step with the child Deployment's own status."""

    replicas: int = 0
    """Pods the Deployment has."""

    ready_replicas: int = 0
    """Pods ready to serve."""

    observed_generation: int = 0
    """The metadata.generation this status describes."""

    selector: str = ""
    """Label selector of the pods (scale subresource)."""

    url: str = ""
    """In-cluster base URL clients call: the router's when it runs (the model name in the path
    picks this deployment), else the deployment's own Service."""

    model: str = ""
    """What is served: the source or the handler."""

    revision: str = ""
    """The stable revision: a hash of spec.model and the replica image (during a canary rollout,
    those of the revision before it); the pods that serve it carry it as their
    serving.batchd.dev/revision label."""

    desired_replicas: int | None = None
    """Replicas asked of the Deployment: num_replicas, or the autoscaler's count."""

    conditions: list[Condition] = []
    """Ready, Progressing, Degraded, AccessReady (who may call, and the API keys Secrets it reads)
    and, with a canary rollout, RolledBack."""

    autoscaling: AutoscalingStatus | None = None
    """What the autoscaler last saw and did (with spec.autoscaling only)."""

    batching: BatchingStatus | None = None
    """Live retuning: which spec.batching the replicas run."""

    rollout: RolloutStatus | None = None
    """Where a canary rollout stands, and what the stable revision runs."""

    def condition(self, type_: ConditionType) -> Condition | None:
        return next((condition for condition in self.conditions if condition.type == type_), None)


SECTIONS = tuple(BatchedDeploymentStatus.model_fields)
NO_STATUS = BatchedDeploymentStatus()


def dump_section(value: Any) -> Any:
    """A section as the API server stores it (JSON, Kubernetes' field names, nothing for None)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(value, list):
        return [dump_section(item) for item in value]
    return value


def read_status(raw: Any) -> BatchedDeploymentStatus:
    """The status as stored, read leniently: a section that does not validate is left out (and
    logged), so that one odd section never stops the rest from being read."""
    if not isinstance(raw, Mapping):
        return NO_STATUS
    try:
        return BatchedDeploymentStatus.model_validate(raw)
    except ValidationError:
        pass
    kept: dict[str, Any] = {}
    for name in SECTIONS:
        if name not in raw:
            continue
        try:
            BatchedDeploymentStatus.model_validate({name: raw[name]})
        except ValidationError as error:
            logger.warning("status.%s is left out: it does not read as this version's: %s", name, error)
        else:
            kept[name] = raw[name]
    return BatchedDeploymentStatus.model_validate(kept)
