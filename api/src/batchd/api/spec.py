"""The `BatchedDeployment` spec: one typed definition shared by the CRD, the operator and the replica.

Our own fields use Ray Serve's snake_case vocabulary, because users asked for
`num_replicas` by that name. Embedded Kubernetes types (`resources`, `nodeSelector`, ...)
keep Kubernetes' own camelCase names and schemas; they are passed through untouched.

This module must import without torch: the operator image does not carry it.
"""

from __future__ import annotations

import itertools
import keyword
import re
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from batchd.api.pod import CANARY_SUFFIX, MAX_CANARY_OWNER_NAME

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
# On the manifest the operator writes for replicas: the revision of the `spec.batching` in it (the
# resource's metadata.generation when spec.batching last changed).
BATCHING_REVISION_ANNOTATION = f"{GROUP}/batching-revision"

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

# model.calls: an alias is the keyword the handler's constructor receives the handle by; the
# value names a BatchedDeployment (its Service) in the same namespace.
CALL_ALIAS_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
MAX_CALLS = 16
DeploymentName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]

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
# An OpenAI model name as servers publish them (`org/model`, `model:tag`): printable, no spaces.
SERVED_MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"

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


# Text generation (model.generation): what a request gets when it asks for no length, and the
# model.call_kwargs that token-level scheduling understands (the defaults of per-request parameters).
DEFAULT_MAX_NEW_TOKENS = 32
TOKEN_LEVEL_CALL_KWARGS = ("max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_p", "top_k")


class GenerationSpec(_Strict):
    """Text generation (`task: text-generation`): how sequences share the model, and what one
    request may ask for (`/v2/models/NAME/generate` parameters; beyond a limit: 400)."""

    scheduling: Literal["token", "request"] = "token"
    """`token`: iteration-level batching. A request joins the running sequences at the next
    decoding step and leaves the moment it is done, its tokens stream as they are made; at most
    batching.max_batch_size sequences run and batching.max_queued_requests wait. `request`: the
    batcher's request-level batches through the transformers pipeline, each batch running until
    its longest answer is done (for comparison, and for models the token-level scheduler cannot drive)."""

    max_new_tokens: Annotated[int, Field(ge=1, le=32_768)] = 256
    """The most new tokens one request may ask for. A request that asks for none gets
    model.call_kwargs.max_new_tokens, else 32."""

    max_prompt_tokens: Annotated[int, Field(ge=1, le=1_048_576)] | None = None
    """The longest prompt accepted, in tokens. Default: any prompt that fits the model's context
    together with the new tokens asked for."""

    max_stop_strings: Annotated[int, Field(ge=0, le=64)] = 4
    """How many stop strings (`parameters.stop`) one request may give; each at most 256 characters."""

    chat_template: Annotated[str, Field(min_length=1, max_length=65_536)] | None = None
    """A Jinja chat template for `/v1/chat/completions`, as transformers' `chat_template`. Default:
    the tokenizer's own; a model with neither refuses chat requests (400 naming `messages`)."""

    prefix_cache_bytes: Annotated[int, Field(ge=0, le=2**50)] | None = None
    """Bytes of keys and values kept after a sequence ends (token-level scheduling), in blocks of
    16 tokens, so that a later prompt that begins with the same tokens (a system prompt, the
    earlier turns of a conversation) copies them instead of computing them again; the least
    recently used blocks go first. 0 turns the cache off. Default: sized once the model is loaded
    and warm, to half of what the pod's memory request (resources.requests.memory, else
    resources.limits.memory) leaves after the process's resident memory and the running
    sequences' own cache (max_batch_size sequences of the model's context); 1 GiB when the pod
    names no memory; on a GPU, half of the device memory then free, less the running sequences'."""

    prefix_cache_scope: Literal["caller", "deployment"] = "caller"
    """Who may reuse whose cached prefixes. `caller`: blocks are keyed by the request's tenant as
    well (`access.tenants`, as the router authenticated it), so two tenants that send the same
    prompt never hit each other's blocks (a shared cache answers sooner for a prompt someone else
    sent, which tells them what was sent); the callers of an open deployment are one tenant and
    share one scope. Never a header or field a client writes (`batchd-fairness-id`, OpenAI's
    `user`). `deployment`: every caller of the deployment shares one cache."""


class ModelSpec(_Strict):
    """What to serve: a transformers pipeline (`task` + `source`) or a custom batch `handler`."""

    name: Annotated[str | None, Field(pattern=MODEL_NAME_PATTERN, max_length=63)] = Field(
        default=None,
        description="Name in the inference URLs (/v1/models/NAME:predict); defaults to the resource's name.",
    )
    served_model_name: Annotated[str | None, Field(pattern=SERVED_MODEL_NAME_PATTERN, max_length=253)] = (
        Field(
            default=None,
            description="The name OpenAI clients give as `model` (and GET /v1/models lists), such as "
            "org/model; defaults to model.name. model.name is accepted too.",
        )
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
    calls: dict[str, DeploymentName] = Field(
        default_factory=dict,
        max_length=MAX_CALLS,
        description="Other BatchedDeployments the handler calls (model composition), alias: name, in the "
        "same namespace. The handler's constructor receives one keyword per alias: a handle whose "
        "calls go to that deployment's Service, where they are batched with everybody else's.",
    )
    generation: GenerationSpec | None = Field(
        default=None,
        description="Text generation (task text-generation only): token- or request-level scheduling, "
        "and the limits of what one request may ask for.",
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

    @field_validator("calls")
    @classmethod
    def _aliases_are_keywords(cls, calls: dict[str, str]) -> dict[str, str]:
        # Checked here, not in the CRD: a structural schema cannot constrain a map's keys.
        for alias in calls:
            if not re.fullmatch(CALL_ALIAS_PATTERN, alias) or keyword.iskeyword(alias):
                raise ValueError(
                    f"model.calls: alias {alias!r} must be a Python identifier (the keyword the "
                    "handler's constructor receives the handle by)"
                )
        return calls

    @model_validator(mode="after")
    def _calls_need_a_handler(self) -> Self:
        if self.calls and self.handler is None:
            raise ValueError(
                f"model.calls needs a model.handler to receive the handles; "
                f"model.task={self.task!r} cannot call other deployments"
            )
        clashes = sorted(set(self.calls) & set(self.init_kwargs))
        if clashes:
            raise ValueError(
                f"model.calls and model.init_kwargs both name {', '.join(map(repr, clashes))}: "
                "each alias is a keyword of the handler's constructor"
            )
        return self

    @model_validator(mode="after")
    def _generation_fits_the_task(self) -> Self:
        if self.generation is not None and self.task != "text-generation":
            raise ValueError(
                f"model.generation applies to model.task text-generation only, got task={self.task!r}"
            )
        if self.task == "text-generation" and self.generation_spec.scheduling == "token":
            # Checked here, not in the CRD: CEL cannot see inside call_kwargs' free-form object.
            for key in self.call_kwargs:
                if key not in TOKEN_LEVEL_CALL_KWARGS:
                    raise ValueError(
                        f"model.call_kwargs.{key}: token-level generation takes only "
                        f"{', '.join(TOKEN_LEVEL_CALL_KWARGS)} (the defaults of per-request parameters); "
                        "set model.generation.scheduling: request for other pipeline arguments"
                    )
        return self

    @property
    def generation_spec(self) -> GenerationSpec:
        """`generation` with its defaults filled in."""
        return self.generation or GenerationSpec()


# Ray Serve's names (its deployment's `batching_config`) where batchd's differ, by (parent, field): a
# manifest that uses one is refused, as any unknown field is, with the field to use instead.
RAY_SERVE_NAMES: dict[tuple[str, str], str] = {
    ("spec", "batching_config"): "Ray Serve's batching_config is spec.batching in batchd",
    ("batching", "timeout_s"): "Ray Serve's timeout_s is batch_wait_timeout_s in batchd "
    "(the same window: seconds a batch waits to fill after its first item)",
    ("batching", "stride_s"): "batchd has no stride_s: nothing polls, a batch leaves the moment it is "
    "full or its window closes (Ray Serve's stride_s: 0); remove it",
}


PRIORITY_CLASS_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DEFAULT_PRIORITY_CLASS = "default"
# Sheddable requests (a class of negative priority) are admitted while a queue (a replica's, or the
# router's hold) holds less than this share of its bound: the rest stays for what must be served.
SHEDDABLE_SHARE = 0.5


class PriorityClassSpec(_Strict):
    """A class of requests, named in the batchd-priority header (the OpenAI routes: their
    `metadata.priority`)."""

    name: Annotated[str, Field(pattern=PRIORITY_CLASS_PATTERN, max_length=63)]
    """What requests call the class by (a DNS label): the batchd-priority header's value."""

    priority: Annotated[int, Field(ge=-1000, le=1000)]
    """Higher goes first: a batch takes every queued item of a higher priority before any of a
    lower one, and a full queue makes room for a higher priority by refusing the most recently
    queued item of the lowest priority below it (503 with Retry-After). Classes of one priority
    are equals: they take turns, and none takes another's place. Negative: sheddable, admitted
    only while the queue holds less than half of max_queued_requests, so it is refused first."""

    queue_timeout_s: Annotated[float, Field(gt=0, le=3600)] | None = None
    """Seconds a request of this class may wait in the queue (Triton's timeout per priority
    level): one still queued after it is refused with 503 and Retry-After, so that an interactive
    class fails fast while a batch class waits its turn. Default: none; request_timeout_s still
    bounds the whole request."""


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

    latency_objective_s: Annotated[float, Field(gt=0, le=3600)] | None = None
    """Adaptive batching: the latency (queueing plus model time) most requests should stay under.
    When set, each batch's wait and size are chosen from what the replica measures (the model's
    cost per batch size, the arrival rate) instead of batch_wait_timeout_s: a batch leaves at
    once when the model is idle (what comes meanwhile forms the next one) or when it keeps up with
    the arrivals; beside a running batch (max_concurrent_batches > 1) it waits for company only
    when it would not keep up, and never past the point where its oldest item would miss the
    objective. max_batch_size still bounds it."""

    isolate_failures: bool = True
    """When a batch raises, run it again in halves (and those in halves) to find the items that
    fail alone: only they fail (422, naming the item), their batch-mates get their answers. k
    bad items in a batch of n cost about 2k log2(n/k) extra model calls. Turn it off for a
    handler with side effects that must not run twice, or one that fails whole batches at once."""

    allow_small_batch: bool = True
    """false: send the model only full batches (max_batch_size items), however long that takes,
    except when the replica drains or the oldest waiting item's deadline is near (within a tenth
    of request_timeout_s, or twice the recent batch time if longer): then what is queued goes.
    batch_wait_timeout_s then closes no batch. For models that need, or run best on, full batches."""

    priority_classes: Annotated[list[PriorityClassSpec], Field(max_length=16)] = []
    """The classes a request may name (batchd-priority), each with its priority. Empty: one class,
    `default`, and every request is in it."""

    default_priority_class: Annotated[str, Field(pattern=PRIORITY_CLASS_PATTERN, max_length=63)] = (
        DEFAULT_PRIORITY_CLASS
    )
    """The class of a request that names none; one of priority_classes when they are given."""

    fair_share: bool = True
    """Within a class, the callers (the batchd-fairness-id header; the OpenAI routes: `user`) take
    turns, one item each, so that every caller with work queued gets an equal share of the batch
    slots and a heavy caller cannot starve a light one. false: first come, first served among the
    callers of a tenant within a class; tenants (`access.tenants`) still take turns, so that one
    cannot starve another (an open deployment, one tenant: first come for everyone in a class)."""

    queue_order: Literal["priority", "first_come"] = "priority"
    """priority: a batch takes the higher classes first, and callers take turns (fair_share).
    first_come: one queue in arrival order for every class and caller, where no request takes
    another's place and none is shed early; the classes are still names a request may give, and
    the order is the one from before priority classes, to compare with."""

    @field_validator("priority_classes")
    @classmethod
    def _class_names_unique(cls, classes: list[PriorityClassSpec]) -> list[PriorityClassSpec]:
        names = [priority_class.name for priority_class in classes]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"priority class names must be unique, got {', '.join(map(repr, repeated))} twice"
            )
        return classes

    @model_validator(mode="after")
    def _the_default_class_is_a_class(self) -> Self:
        names = [priority_class.name for priority_class in self.priority_classes] or [DEFAULT_PRIORITY_CLASS]
        if self.default_priority_class not in names:
            raise ValueError(
                f"batching.default_priority_class: {self.default_priority_class!r} is none of the priority "
                f"classes ({', '.join(names)})"
            )
        return self

    @model_validator(mode="after")
    def _a_full_batch_fits_the_queue(self) -> Self:
        if not self.allow_small_batch and self.max_queued_requests < self.max_batch_size:
            raise ValueError(
                f"batching.allow_small_batch=false needs max_queued_requests ({self.max_queued_requests}) "
                f"of at least max_batch_size ({self.max_batch_size}): a full batch could never form"
            )
        return self


class AutoscalingSpec(_Strict):
    """Replicas from the replicas' own load: Ray Serve's autoscaling_config, decided by the operator.

    Load is the batch items a replica holds: waiting in its queue or inside the model. The
    operator reads it from every ready replica, asks for enough replicas that each holds about
    `target_ongoing_items`, and changes the count only when the ask has held for the delay.
    With `min_replicas: 0` and the router installed, an idle deployment goes to zero replicas;
    the router holds requests that arrive meanwhile, and the operator starts a replica for them.
    """

    min_replicas: Annotated[int, Field(ge=0, le=10_000)] = 1
    """The fewest replicas, however idle. 0 lets an idle deployment scale to zero after
    `scale_to_zero_delay_s`; requests that then arrive through the router wait (bounded in count
    and time) while a replica starts, so the first answer takes the model's load time. Requests
    sent to the deployment's own Service bypass the router and fail while it is at zero."""

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

    scale_to_zero_delay_s: Annotated[float, Field(ge=0, le=86_400)] = 300
    """With `min_replicas: 0`: how long the deployment must have been idle (no item on its
    replicas and no request held by any router) before its last replica is removed. A cold start
    costs the model's whole load time (often minutes for weights), so the default matches
    `downscale_delay_s`, as Ray Serve's `downscale_to_zero_delay_s` does by default; Knative's
    shorter 60 s window suits containers that start in seconds."""

    count_sheddable: bool = False
    """Whether items of sheddable priority classes (negative priority) count as load. By default
    they do not: a class marked sheddable is served with the capacity the other classes leave,
    and refused first when there is none, so it never adds replicas of its own (it still keeps
    the deployment from scaling to zero while it is served). True scales for it like any other
    class."""

    @model_validator(mode="after")
    def _min_at_most_max(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) must not exceed "
                f"autoscaling.max_replicas ({self.max_replicas})"
            )
        return self


class CanaryStep(_Strict):
    """One step of a canary rollout: this share of the deployment's requests goes to the new
    revision (through the router), for at least this long."""

    traffic_percent: Annotated[int, Field(ge=1, le=100)]
    """The new revision's share of the requests, in percent."""

    hold_s: Annotated[float, Field(ge=0, le=86_400)] = 60
    """How long the step lasts, at least: it passes once this has elapsed and the analysis has
    judged at least `analysis.min_requests` of the new revision's requests in it."""


class CanaryAnalysis(_Strict):
    """How a canary step is judged, from the figures the replicas of each revision measure (their
    answers by outcome and duration), over the step so far: the new revision against the stable
    one in the same window."""

    min_requests: Annotated[int, Field(ge=1, le=1_000_000)] = 100
    """Requests the new revision must have answered in the step before it can pass."""

    max_error_rate: Annotated[float, Field(ge=0, le=1)] = 0.01
    """The highest share of the new revision's answers that failed (the model raised, on a batch
    or on an item alone, or did not answer in time), beyond the stable revision's share in the
    same window, before it is rolled back."""

    max_p99_ratio: Annotated[float, Field(ge=1, le=100)] = 1.5
    """The highest p99 latency of the new revision, as a multiple of the stable revision's p99
    over the same window, before it is rolled back."""

    interval_s: Annotated[float, Field(ge=1, le=3600)] = 10
    """How often the step is judged."""


class RolloutSpec(_Strict):
    """How a change that alters what the model answers (a new revision: `model`, `image`) reaches
    the replicas. A change to batching or scale is retuned live, with no rollout."""

    strategy: Literal["rolling", "canary"] = "rolling"
    """rolling: the Deployment replaces its pods (maxSurge 1, maxUnavailable 0), nothing judged.
    canary: the new revision runs beside the stable one and takes the steps' shares of the
    requests through the router; a step that fails the analysis sends every request back to the
    stable revision, and the last step passed promotes the new one."""

    steps: Annotated[list[CanaryStep], Field(max_length=20)] = []
    """The canary's steps, their traffic_percent rising. Empty: 10%, then 50%, 60 s each."""

    analysis: CanaryAnalysis = Field(default_factory=CanaryAnalysis)
    """How each canary step is judged."""

    paused: bool = False
    """true: the rollout stays at its step (the analysis still judges it, and still rolls a bad
    revision back); false again: it goes on."""

    abort: bool = False
    """true: every request goes back to the stable revision and the new one is scaled to zero,
    until this is false again (then the rollout starts over from its first step). Honoured in
    every phase, a promotion included: the stable Deployment then rolls back to the stable revision."""

    progress_deadline_s: Annotated[int, Field(ge=30, le=86_400)] = 600
    """How long a step may wait for the new revision's replicas to serve its share (Ready, as many
    as the share needs), in seconds: past it the new revision is rolled back (reason
    ProgressDeadlineExceeded), as a Deployment's progressDeadlineSeconds and Flagger's deadline
    do. A step's share goes to the new revision only once it has the replicas to carry it."""

    @field_validator("steps")
    @classmethod
    def _steps_rise(cls, steps: list[CanaryStep]) -> list[CanaryStep]:
        shares = [step.traffic_percent for step in steps]
        if any(later <= earlier for earlier, later in itertools.pairwise(shares)):
            raise ValueError(f"each step's traffic_percent must be above the one before, got {shares}")
        return steps

    @property
    def canary_steps(self) -> list[CanaryStep]:
        """The steps a canary takes: the given ones, or the defaults."""
        return self.steps or list(DEFAULT_CANARY_STEPS)


DEFAULT_CANARY_STEPS = (CanaryStep(traffic_percent=10), CanaryStep(traffic_percent=50))


# The OTLP/HTTP receiver's base URL: spans go to `<endpoint>/v1/traces`.
TRACING_ENDPOINT_PATTERN = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"


class TracingSpec(_Strict):
    """OpenTelemetry traces of the deployment's replicas, exported over OTLP/HTTP: a span per
    request (with the GenAI attributes where they apply), a span per batch linked to every request
    it carried, and the caller's `traceparent` continued. The operator turns this block into the
    standard `OTEL_*` environment of the replica pods, with the pod's Kubernetes resource
    attributes; without it the replicas trace nothing and load no OpenTelemetry code."""

    endpoint: Annotated[str, Field(pattern=TRACING_ENDPOINT_PATTERN, max_length=1024)]
    """The base URL of an OTLP/HTTP receiver, e.g. `http://jaeger-collector.observability:4318`
    (an OpenTelemetry Collector, Jaeger, Tempo): spans are sent to `<endpoint>/v1/traces`
    (`OTEL_EXPORTER_OTLP_ENDPOINT`)."""

    sampling_ratio: Annotated[float, Field(ge=0, le=1)] = 1.0
    """The share of new traces recorded, from 0 to 1 (`OTEL_TRACES_SAMPLER_ARG` of the
    `parentbased_traceidratio` sampler). A request that arrives with a `traceparent` (through the
    router, or from a traced client) follows its caller's decision instead, so a trace is kept or
    dropped whole."""

    service_name: Annotated[str | None, Field(min_length=1, max_length=253)] = None
    """The `service.name` the spans carry (`OTEL_SERVICE_NAME`). Default: the BatchedDeployment's
    name."""

    capture_prompts: bool = False
    """Whether spans may carry the text of prompts and generated answers
    (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`). Off by default: prompts often hold
    personal data, and a trace backend is read by more people than the model's logs."""


# A tenant's name: a DNS label, as it appears in metric labels and in the stamp the router signs.
TENANT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# The tenant of callers that present no credential (and of every caller of an open deployment).
ANONYMOUS_TENANT = "anonymous"
# The fields of the spec a running replica follows from its manifest (how it batches, who may
# call): the operator leaves them out of the pod's hash, so no pod rolls for them.
LIVE_FIELDS = ("batching", "access")
MAX_TENANTS = 64
# `namespace/name` of a ServiceAccount.
SERVICE_ACCOUNT_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"


PriorityClassName = Annotated[str, Field(pattern=PRIORITY_CLASS_PATTERN, max_length=63)]
SecretName = Annotated[str, Field(pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253)]


class Entitlements(_Strict):
    """What a tenant may do at this deployment: its priority classes, its share of each replica's
    queue, its quotas, and whether its trace decisions are followed."""

    priority_classes: Annotated[list[PriorityClassName], Field(max_length=16)] | None = None
    """The classes of batching.priority_classes this tenant may ask for; a request for another
    is refused with 403, naming the class and these. Default: the deployment's
    default_priority_class only."""

    default_priority_class: Annotated[str, Field(pattern=PRIORITY_CLASS_PATTERN, max_length=63)] | None = None
    """The class of this tenant's requests that name none; one of its priority_classes. Default:
    the deployment's default_priority_class where this tenant may use it, else its first class."""

    queue_share: Annotated[float, Field(gt=0, le=1)] | None = None
    """The most of each replica's queue (batching.max_queued_requests) this tenant's waiting items
    may hold, so that one tenant cannot fill the queue while others wait; past it its requests
    get 503 with Retry-After. Default: an equal share, one over the number of tenants that may
    call (the anonymous one included where it may), at least one item."""

    requests_per_s: Annotated[float, Field(gt=0, le=1_000_000)] | None = None
    """Requests a second this tenant may send, over all of batchd's routers together; past it: 429
    with Retry-After and OpenAI's x-ratelimit headers. Default: no limit."""

    tokens_per_minute: Annotated[int, Field(ge=1, le=10**12)] | None = None
    """Tokens a minute (prompt plus completion, as the replicas count them), over all routers
    together, charged after each answer; past it: 429 with Retry-After. Default: no limit."""

    trust_traces: bool = False
    """Whether the sampled flag of this tenant's `traceparent` is followed. Default false: its trace
    is joined, but whether it is recorded is decided by tracing.sampling_ratio, so that a caller
    cannot make every one of its requests recorded."""


class TenantSpec(Entitlements):
    """A caller of the deployment, known by its credentials, and what it may do."""

    name: Annotated[str, Field(pattern=TENANT_NAME_PATTERN, max_length=63)]
    """The tenant's name (a DNS label): in the stamp replicas trust, the metrics' tenant label, and
    the prefix cache's salt (two tenants never share cached blocks)."""

    api_keys_secret: SecretName | None = None
    """A Secret in the deployment's namespace whose every data value is one API key of this tenant
    (several, so that a key can be rotated: add the new one, move the clients, remove the old).
    Clients send a key as `Authorization: Bearer KEY` (the openai client's api_key) or `x-api-key`.
    A change to the Secret takes effect within seconds, with no restart."""

    service_accounts: Annotated[
        list[Annotated[str, Field(pattern=SERVICE_ACCOUNT_PATTERN, max_length=317)]], Field(max_length=64)
    ] = []
    """ServiceAccounts (`namespace/name`) that are this tenant: a pod's projected token with the
    audience `batchd` is checked by TokenReview, and RBAC must grant its account the verb `invoke`
    on this BatchedDeployment (SubjectAccessReview), as kube-rbac-proxy checks."""


class AccessSpec(_Strict):
    """Who may call the deployment, decided by batchd's router: the tenants and their credentials,
    and whether callers with none may call. With access set, replicas answer inference only to
    requests the router signed. Without it the deployment is open: every caller is one tenant,
    `anonymous`, that may use every class, and they share one prefix cache."""

    tenants: Annotated[list[TenantSpec], Field(max_length=MAX_TENANTS)] = []
    """The tenants, each with its credentials (API keys, ServiceAccounts) and entitlements."""

    anonymous: Entitlements | None = None
    """What callers that present no credential may do, as the tenant `anonymous`. Default: they
    are refused (401 with WWW-Authenticate)."""

    @field_validator("tenants")
    @classmethod
    def _tenant_names_unique(cls, tenants: list[TenantSpec]) -> list[TenantSpec]:
        names = [tenant.name for tenant in tenants]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"tenant names must be unique, got {', '.join(map(repr, repeated))} twice")
        if ANONYMOUS_TENANT in names:
            raise ValueError(
                f"tenant name {ANONYMOUS_TENANT!r} is the callers without a credential: set access.anonymous"
            )
        return tenants

    @field_validator("tenants")
    @classmethod
    def _credentials_in_one_tenant(cls, tenants: list[TenantSpec]) -> list[TenantSpec]:
        seen: dict[str, str] = {}
        for tenant in tenants:
            named = [f"service account {account!r}" for account in tenant.service_accounts]
            if tenant.api_keys_secret:
                named.append(f"API keys Secret {tenant.api_keys_secret!r}")
            for credential in named:
                if credential in seen:
                    raise ValueError(
                        f"{credential} is named by tenants {seen[credential]!r} and "
                        f"{tenant.name!r}: a caller is one tenant"
                    )
                seen[credential] = tenant.name
        return tenants

    @model_validator(mode="after")
    def _someone_may_call(self) -> Self:
        if not self.tenants and self.anonymous is None:
            raise ValueError("access: give tenants, anonymous, or both (nobody could call the deployment)")
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
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="How a new revision (model or image) is rolled out."
    )
    tracing: TracingSpec | None = Field(
        default=None,
        description="OpenTelemetry traces of the replicas, exported over OTLP/HTTP. "
        "Default: no tracing. A change rolls the pods, as a change of env does.",
    )
    access: AccessSpec | None = Field(
        default=None,
        description="Who may call the deployment: tenants known by API keys or ServiceAccount tokens, "
        "their priority classes, queue shares and quotas, decided by batchd's router. Default: open, "
        "every caller one tenant. A change takes effect live, with no restart.",
    )

    @model_validator(mode="after")
    def _tenants_name_classes_there_are(self) -> Self:
        if self.access is None:
            return self
        classes = [c.name for c in self.batching.priority_classes] or [DEFAULT_PRIORITY_CLASS]
        given: list[tuple[str, Entitlements]] = [(tenant.name, tenant) for tenant in self.access.tenants]
        if self.access.anonymous is not None:
            given.append((ANONYMOUS_TENANT, self.access.anonymous))
        for name, entitled in given:
            allowed = entitled.priority_classes
            for asked in allowed or []:
                if asked not in classes:
                    raise ValueError(
                        f"access: tenant {name!r} names priority class {asked!r}, which is none of "
                        f"batching.priority_classes ({', '.join(classes)})"
                    )
            usable = allowed if allowed is not None else [self.batching.default_priority_class]
            default = entitled.default_priority_class
            if default is not None and default not in usable:
                raise ValueError(
                    f"access: tenant {name!r}: default_priority_class {default!r} is none of the classes "
                    f"it may use ({', '.join(usable)})"
                )
        return self


class ObjectMeta(BaseModel):
    """The part of `metadata` that batchd reads; the rest is kept but ignored."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: DeploymentName
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

    @model_validator(mode="after")
    def _canary_children_fit_their_names(self) -> Self:
        if self.spec.rollout.strategy == "canary" and len(self.metadata.name) > MAX_CANARY_OWNER_NAME:
            raise ValueError(
                f"metadata.name: {self.metadata.name!r} has {len(self.metadata.name)} characters; with "
                f"spec.rollout.strategy canary it may have at most {MAX_CANARY_OWNER_NAME}, as the canary's "
                f"Service adds {CANARY_SUFFIX!r} to it and a Service's name has at most 63"
            )
        return self

    @property
    def model_name(self) -> str:
        """The name in inference URLs and metric labels."""
        return self.spec.model.name or self.metadata.name

    @property
    def served_model_name(self) -> str:
        """The name OpenAI clients give as `model`."""
        return self.spec.model.served_model_name or self.model_name

    @property
    def batching_revision(self) -> int:
        """Which `spec.batching` this manifest carries: its hash (`revisions.batching_revision_of`),
        as the operator writes it into the replicas' manifest (0 for a local file)."""
        return int(self.metadata.annotations.get(BATCHING_REVISION_ANNOTATION, "0"))

    @property
    def target_ongoing_items(self) -> int | None:
        """The autoscaler's target per replica, with its default filled in; None without autoscaling."""
        autoscaling = self.spec.autoscaling
        if autoscaling is None:
            return None
        batching = self.spec.batching
        return autoscaling.target_ongoing_items or batching.max_batch_size * batching.max_concurrent_batches
