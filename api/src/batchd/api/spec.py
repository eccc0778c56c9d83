"""The `BatchedDeployment` spec: one typed definition shared by the CRD, the operator and the replica.

Our own fields use the seeds' (Ray Serve's) snake_case vocabulary, because users asked for
`num_replicas` by that name. Embedded Kubernetes types (`resources`, `nodeSelector`, ...)
keep Kubernetes' own camelCase names and schemas; they are passed through untouched.

This module must import without torch: the operator image does not carry it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GROUP = "serving.batchd.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "BatchedDeployment"
PLURAL = "batcheddeployments"
SINGULAR = "batcheddeployment"
SHORT_NAMES = ["bd"]
# The bound on batching.max_concurrent_batches: replicas size their model thread pools by it, so
# that live retuning can raise the concurrency without a restart.
MAX_CONCURRENT_BATCHES = 64
# On the manifest the operator writes for replicas: the generation of the `spec.batching` in it.
BATCHING_GENERATION_ANNOTATION = f"{GROUP}/batching-generation"

# The transformers pipeline tasks a replica knows how to batch, encode and answer.
PipelineTask = Literal[
    "feature-extraction",
    "text-classification",
    "text-generation",
    "fill-mask",
]

# `module:Attribute` or `module:Class.method`, as in uvicorn's and Ray Serve's import paths.
HANDLER_PATTERN = r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)?$"
SOURCE_SCHEMES = ("hf://", "file://", "pvc://")
# A DNS-1123 label: model names appear in URLs and Prometheus labels.
MODEL_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"

# The Open Inference Protocol (V2) tensor datatypes.
Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]
TENSOR_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"

# Anything embedded from Kubernetes: kept as given, validated by the API server's own types.
KubeObject = dict[str, Any]


class _Strict(BaseModel):
    # Unknown fields are refused: a typo such as `max_batchsize` must not pass silently.
    # Attribute docstrings are the fields' descriptions (in the CRD too).
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, use_attribute_docstrings=True
    )


class TensorSpec(_Strict):
    """One input or output of the model, as the Open Inference Protocol's model metadata states it."""

    name: Annotated[str, Field(pattern=TENSOR_NAME_PATTERN, max_length=63)]
    """The tensor's name in V2 requests and answers."""

    datatype: Datatype
    """Its V2 datatype: what a client such as tritonclient sends (or reads) for it."""

    shape: tuple[Annotated[int, Field(ge=-1)], ...] = (-1,)
    """Its shape; the first dimension is the batch (-1), each row of it one batch item."""


class ModelSpec(_Strict):
    """What to serve: a transformers pipeline (`task` + `source`) or a custom batch `handler`."""

    name: Annotated[str | None, Field(pattern=MODEL_NAME_PATTERN, max_length=63)] = Field(
        default=None,
        description="Name in the inference URLs (/v1/models/NAME:predict); defaults to the resource's name.",
    )
    task: PipelineTask | None = Field(
        default=None, description="A transformers pipeline task. Exactly one of task or handler."
    )
    source: Annotated[str | None, Field(min_length=1, max_length=1024)] = Field(
        default=None,
        description="Where the weights are: hf://org/name, pvc://claim/path or file:///path.",
    )
    handler: Annotated[str | None, Field(pattern=HANDLER_PATTERN, max_length=253)] = Field(
        default=None,
        description="A batch handler by import path, module:Class or module:Class.method. "
        "It takes a list of items and returns a list of results of the same length.",
    )
    init_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the handler's constructor."
    )
    call_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for every pipeline call (e.g. max_new_tokens for text-generation).",
    )
    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto", description="auto picks cuda when a GPU is visible, else cpu."
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        default="auto", description="auto is float16 on cuda and float32 on cpu."
    )
    inputs: tuple[TensorSpec, ...] | None = Field(
        default=None,
        description="The V2 inputs the model takes, when the handler's annotation cannot say: "
        "items are checked and converted to these datatypes, and the model metadata states them.",
    )
    outputs: tuple[TensorSpec, ...] | None = Field(
        default=None, description="The V2 outputs the model returns, for the model metadata and V2 answers."
    )

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, source: str | None) -> str | None:
        if source is not None and not source.startswith(SOURCE_SCHEMES):
            raise ValueError(f"must start with one of {', '.join(SOURCE_SCHEMES)}, got {source!r}")
        return source

    @model_validator(mode="after")
    def _task_xor_handler(self) -> Self:
        if (self.task is None) == (self.handler is None):
            raise ValueError(
                f"exactly one of model.task or model.handler must be set, "
                f"got task={self.task!r} and handler={self.handler!r}"
            )
        if self.task is not None and self.source is None:
            raise ValueError(f"model.source is required with model.task={self.task!r}")
        return self


class BatchingSpec(_Strict):
    """How requests are gathered into batches: the knobs of Ray Serve's `@serve.batch`, plus bounds."""

    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = 32
    """The largest batch the model is ever called with."""

    batch_wait_timeout_s: Annotated[float, Field(ge=0, le=60)] = 0.01
    """How long a batch waits to fill after its first item arrived, in seconds.
    0 is opportunistic batching: take what is queued and go."""

    max_concurrent_batches: Annotated[int, Field(ge=1, le=MAX_CONCURRENT_BATCHES)] = 1
    """Batches that may run on the model at the same time."""

    max_queued_requests: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    """Items that may wait for a batch. Past it the replica answers 503 with Retry-After,
    so that an overload sheds load instead of growing latency without bound."""

    request_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 30
    """A request still unanswered this long after it was accepted gets 504."""

    isolate_failures: bool = True
    """When a batch raises, run it again in halves (and those in halves) to find the items that
    fail alone: only they fail, their batch-mates get their answers. k bad items in a batch of
    n cost about 2k log2(n/k) extra model calls. Turn it off for a handler with side effects
    that must not run twice, or one that fails whole batches at once."""


class AutoscalingSpec(_Strict):
    """Replicas from the replicas' own load: Ray Serve's autoscaling_config, decided by the operator.

    Load is the batch items a replica holds: waiting in its queue or inside the model. The
    operator reads it from every ready replica, asks for enough replicas that each holds about
    `target_ongoing_items`, and changes the count only when the ask has held for the delay.
    """

    min_replicas: Annotated[int, Field(ge=1, le=10_000)] = 1
    """The fewest replicas, however idle (at least 1: an idle replica is what notices new load)."""

    max_replicas: Annotated[int, Field(ge=1, le=10_000)]
    """The most replicas, however loaded."""

    target_ongoing_items: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    """Items each replica should hold (queued plus in the model). Default: one full batch per
    concurrent batch slot (max_batch_size x max_concurrent_batches), where a replica still has
    headroom; twice that is a replica at its limit."""

    upscale_delay_s: Annotated[float, Field(ge=0, le=3600)] = 10
    """How long more replicas must have been wanted before they are added (HPA's scale-up
    stabilization window): a burst shorter than this adds nothing."""

    downscale_delay_s: Annotated[float, Field(ge=0, le=86_400)] = 300
    """How long fewer replicas must have been enough before any is removed: load that comes
    back within this never finds the replicas gone."""

    @model_validator(mode="after")
    def _min_at_most_max(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) must not exceed "
                f"autoscaling.max_replicas ({self.max_replicas})"
            )
        return self


class BatchedDeploymentSpec(_Strict):
    """The `spec` of a BatchedDeployment."""

    num_replicas: int = Field(
        default=1,
        ge=0,
        le=10_000,
        description="Replica pods (the scale subresource). With autoscaling, only the count to start with.",
    )
    model: ModelSpec
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="Scale on the replicas' own load between min_replicas and max_replicas."
    )
    image: Annotated[str | None, Field(min_length=1, max_length=1024)] = Field(
        default=None, description="Replica image; defaults to the operator's configured image."
    )
    resources: KubeObject = Field(
        default_factory=dict, description="Container resources, e.g. {limits: {nvidia.com/gpu: 1}}."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: list[KubeObject] = Field(default_factory=list)
    affinity: KubeObject = Field(default_factory=dict)
    env: list[KubeObject] = Field(default_factory=list)
    volumes: list[KubeObject] = Field(default_factory=list)
    volume_mounts: list[KubeObject] = Field(default_factory=list, alias="volumeMounts")


class ObjectMeta(BaseModel):
    """The part of `metadata` that batchd reads; the rest is kept but ignored."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class BatchedDeployment(BaseModel):
    """A whole manifest, as a user would `kubectl apply` it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    api_version: Literal["serving.batchd.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["BatchedDeployment"]
    metadata: ObjectMeta
    spec: BatchedDeploymentSpec

    @property
    def model_name(self) -> str:
        """The name in inference URLs and metric labels."""
        return self.spec.model.name or self.metadata.name

    @property
    def batching_generation(self) -> int:
        """Which `spec.batching` this manifest carries: the resource's generation when it last
        changed, as the operator writes it into the replicas' manifest (0 for a local file)."""
        return int(self.metadata.annotations.get(BATCHING_GENERATION_ANNOTATION, "0"))

    @property
    def target_ongoing_items(self) -> int | None:
        """The autoscaler's target per replica, with its default filled in; None without autoscaling."""
        autoscaling = self.spec.autoscaling
        if autoscaling is None:
            return None
        batching = self.spec.batching
        return autoscaling.target_ongoing_items or batching.max_batch_size * batching.max_concurrent_batches
