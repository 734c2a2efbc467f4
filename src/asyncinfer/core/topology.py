"""The service's topology as plain data: the job table (keys, indexes, TTL), the queues and
their attributes, and the functions with their triggers, timeouts and settings.

Both builders read it, so AWS and the local stack cannot drift apart: the CDK app
(``infra/components/storage.py``, ``messaging.py``, ``webhooks.py``, ``batches.py``,
``infra/stack.py``) and the local stack (:mod:`asyncinfer.local.resources`,
:mod:`asyncinfer.webhooks.queues`, :mod:`asyncinfer.openai_api.queues`,
:mod:`asyncinfer.local.stack`, :mod:`asyncinfer.local.event_source`).
``tests/infra/test_topology_parity.py`` compares the CDK template with what the local stack
creates on the emulator.

Sources of the rules: SQS developer guide (visibility timeout 0..43200 s, retention up to 14
days, WaitTimeSeconds 0..20, "Amazon SQS fair queues": the tenant as ``MessageGroupId`` on a
standard queue, no queue attribute); Lambda developer guide, "Using Lambda with Amazon SQS" (a
source queue's visibility timeout at least six times the function's timeout).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from asyncinfer.core import envvars as ev

DAY = 24 * 3600

# ------------------------------------------------------------------ the job table


@dataclass(frozen=True)
class Key:
    """A key attribute: its name and DynamoDB type (``S`` string, ``N`` number)."""

    name: str
    type: Literal["S", "N"]


@dataclass(frozen=True)
class Index:
    """A global secondary index: partition key, optional sort key, projection."""

    name: str
    partition: Key
    sort: Key | None
    projection: Literal["ALL", "KEYS_ONLY"]


@dataclass(frozen=True)
class Table:
    """A DynamoDB table (on demand): partition key, GSIs and the TTL attribute (epoch seconds)."""

    suffix: str
    partition: Key
    indexes: tuple[Index, ...]
    ttl_attribute: str

    def attribute_definitions(self) -> list[Key]:
        """Every key attribute of the table and its indexes, once each, in first-use order."""
        out: list[Key] = []
        keys = [self.partition]
        for index in self.indexes:
            keys += [index.partition] + ([index.sort] if index.sort else [])
        for key in keys:
            if key not in out:
                out.append(key)
        return out


TENANT_INDEX = "tenant-index"
QUEUED_INDEX = "queued-expiry-index"
RUNNING_INDEX = "running-lease-index"
OUTBOX_INDEX = "outbox-index"
JOB_ID = Key("job_id", "S")

#: The job records (:mod:`asyncinfer.jobs.store`): ``tenant-index`` lists a tenant's jobs; the
#: sparse ``queued-expiry-index`` (queued jobs by TTL end) and ``running-lease-index`` (running
#: jobs by lease end) are what the sweeper queries, keys only, and so is the sparse
#: ``outbox-index`` (records with pending events, by when the oldest became pending).
JOB_TABLE = Table(
    suffix="jobs",
    partition=JOB_ID,
    indexes=(
        Index(TENANT_INDEX, Key("tenant", "S"), JOB_ID, "ALL"),
        Index(QUEUED_INDEX, Key("queued_mark", "S"), Key("expires_epoch", "N"), "KEYS_ONLY"),
        Index(
            RUNNING_INDEX, Key("running_mark", "S"), Key("lease_expires_epoch", "N"), "KEYS_ONLY"
        ),
        # Records with events not yet published (the events outbox, asyncinfer.jobs.outbox).
        Index(OUTBOX_INDEX, Key("outbox_mark", "S"), Key("outbox_since", "N"), "KEYS_ONLY"),
    ),
    ttl_attribute="ttl",
)

# ------------------------------------------------------------------ functions


@dataclass(frozen=True)
class SqsTrigger:
    """An SQS event source mapping: ``queue`` names a :class:`Queue` of :data:`QUEUES`.
    ``max_concurrency_is_reserved``: the mapping's maximum concurrency is the function's
    reserved concurrency (so the source never invokes it into throttling)."""

    queue: str
    batch_size: int = 10
    max_batching_window_seconds: int = 0
    report_batch_item_failures: bool = True
    max_concurrency_is_reserved: bool = False


@dataclass(frozen=True)
class Schedule:
    """An EventBridge schedule: every ``rate_minutes``, no retries (the next run retries)."""

    rate_minutes: int = 1
    retry_attempts: int = 0


@dataclass(frozen=True)
class Function:
    """A Lambda function (code in ``lambdas/<code>``, ``app.handler``).

    ``service``: its Powertools service name (logs, traces, metrics). ``timeout_seconds``: the
    default; ``timeout_setting`` names the deployment setting
    (``infra.config``) that overrides it. ``reserved_setting``: the setting of its reserved
    concurrency (issue 14, behaviour 7). ``part``: the settings part it reads
    (:mod:`asyncinfer.core.settings_parts`); ``needs``: the variables the CDK app must set.
    """

    code: str
    service: str
    timeout_seconds: int
    triggers: tuple[SqsTrigger | Schedule, ...] = ()
    timeout_setting: str | None = None
    reserved_setting: str | None = None
    part: str | None = None
    needs: tuple[str, ...] = ()
    compute: Literal["any", "ecs", "sagemaker"] = "any"

    def sqs_trigger(self) -> SqsTrigger:
        """The function's one SQS trigger (``LookupError`` if it has none or several)."""
        found = [t for t in self.triggers if isinstance(t, SqsTrigger)]
        if len(found) != 1:
            raise LookupError(f"function {self.code!r} has {len(found)} SQS triggers")
        return found[0]

    def schedule(self) -> Schedule | None:
        """The function's schedule, if it runs on one."""
        return next((t for t in self.triggers if isinstance(t, Schedule)), None)


_STORE = (ev.TABLE, ev.BUCKET, ev.TOPIC_ARN)
_QUEUES = (ev.RESOURCE_PREFIX, ev.QUEUE_URL_BASE, ev.MODELS)

#: The webhook dispatcher's timeout: one attempt (10 s) plus its bookkeeping, with room for slow
#: AWS calls (:mod:`asyncinfer.webhooks.batch`).
WEBHOOK_DISPATCHER_TIMEOUT_SECONDS = 30
#: The DLQ handler's default timeout (``dlq_handler_timeout``).
DLQ_HANDLER_TIMEOUT_SECONDS = 30
#: The OpenAI batch expander's timeout (:mod:`asyncinfer.openai_api.expansion`: one invocation
#: expands chunks for all but the last ``RESERVE_SECONDS`` of it).
BATCH_EXPANDER_TIMEOUT_SECONDS = 300
#: The OpenAI batch line counter and finalizer's timeout, Lambda's maximum
#: (:mod:`asyncinfer.openai_api.finalize`: finalization reads every line's job).
BATCH_COUNTER_TIMEOUT_SECONDS = 900

FUNCTIONS: dict[str, Function] = {
    f.code: f
    for f in (
        # API Gateway's integration timeout is 29 s; ``?wait=`` holds at most 20 s.
        Function("api", "api", 29, part="api", needs=(*_STORE, *_QUEUES, ev.WEBHOOK_SECRETS_KEY)),
        Function(
            "dlq",
            "dlq",
            DLQ_HANDLER_TIMEOUT_SECONDS,
            (SqsTrigger("jobs-dlq"),),
            timeout_setting="dlq_handler_timeout",
            reserved_setting="dlq_reserved_concurrency",
            part="dlq",
            needs=(*_STORE, *_QUEUES),
        ),
        Function(
            "sweeper",
            "sweeper",
            60,
            (Schedule(),),
            reserved_setting="sweeper_reserved_concurrency",
            part="sweeper",
            needs=(*_STORE, *_QUEUES),
        ),
        Function(
            "webhooks",
            "asyncinfer-webhooks",
            WEBHOOK_DISPATCHER_TIMEOUT_SECONDS,
            (SqsTrigger("webhooks", max_concurrency_is_reserved=True),),
            reserved_setting="webhooks_reserved_concurrency",
            part="webhooks",
            needs=(ev.TABLE, ev.WEBHOOK_QUEUE_URL, ev.WEBHOOK_DLQ_URL, ev.WEBHOOK_SECRETS_KEY),
        ),
        Function(
            "backlog_metric",
            "backlog-metric",
            30,
            (Schedule(),),
            part="scaling",
            needs=(*_QUEUES, ev.COMPUTE, ev.ECS_CLUSTER),
            compute="ecs",
        ),
        Function("ecs_teardown", "ecs-teardown", 120, compute="ecs"),
        # API Gateway's REQUEST authorizer of /v1 and /openai (asyncinfer.openai_api.authorizer).
        Function("authorizer", "authorizer", 10),
        Function(
            "sagemaker_bridge",
            "sagemaker-bridge",
            20,
            (SqsTrigger("jobs"),),
            timeout_setting="bridge_timeout",
            reserved_setting="bridge_reserved_concurrency",
            part="bridge",
            needs=(*_STORE, *_QUEUES, ev.COMPUTE),
            compute="sagemaker",
        ),
        Function(
            "sagemaker_completion",
            "sagemaker-completion",
            60,
            reserved_setting="completion_reserved_concurrency",
            part="completion",
            needs=_STORE,
            compute="sagemaker",
        ),
        # OpenAI batches (spec openai.md, "Batches"): one operation (expand, end, check) per
        # invocation; it submits jobs, so it needs the job queues too.
        Function(
            "openai_batches",
            "asyncinfer-openai-batches",
            BATCH_EXPANDER_TIMEOUT_SECONDS,
            (SqsTrigger("batches", batch_size=1),),
            part="openai",
            needs=(*_STORE, *_QUEUES, ev.BATCH_QUEUE_URL, ev.BATCH_EVENTS_QUEUE_URL),
        ),
        # Counts the terminal job events of batch lines; finalizes a batch whose lines are done.
        Function(
            "openai_batch_counter",
            "asyncinfer-openai-batch-counter",
            BATCH_COUNTER_TIMEOUT_SECONDS,
            (SqsTrigger("batch-events"),),
            part="openai",
            needs=(*_STORE, ev.BATCH_QUEUE_URL, ev.BATCH_EVENTS_QUEUE_URL),
        ),
    )
}

# ------------------------------------------------------------------ queues


@dataclass(frozen=True)
class Queue:
    """An SQS standard queue (SSE with SQS-owned keys).

    ``visibility_timeout_seconds`` / ``max_receive_count`` ``None``: the deployment's setting
    (``ASYNCINFER_VISIBILITY_TIMEOUT`` / ``ASYNCINFER_MAX_RECEIVE_COUNT``). ``dead_letter``: the
    name of its dead-letter queue. ``fair``: messages carry the tenant as ``MessageGroupId``
    (SQS fair queues; :mod:`asyncinfer.jobs.messages`), which needs no queue attribute.
    ``subscribed_to_events``: subscribed to the events topic with raw message delivery;
    ``event_types``: the subscription's filter on the ``event_type`` message attribute (empty:
    every event); ``webhook_events``: only events of jobs and batches that have a webhook (the
    filter on :data:`WEBHOOK_ATTRIBUTE`). ``local_visibility_timeout_seconds``: the one
    documented difference of the local stack (see :data:`BATCH_LOCAL_VISIBILITY_SECONDS`);
    ``None``: the same as in AWS.
    """

    name: str
    retention_seconds: int
    visibility_timeout_seconds: int | None
    receive_wait_seconds: int = 0
    dead_letter: str | None = None
    max_receive_count: int | None = None
    fair: bool = False
    per_model: bool = False
    subscribed_to_events: bool = False
    event_types: tuple[str, ...] = ()
    webhook_events: bool = False
    local_visibility_timeout_seconds: int | None = None

    def attributes(
        self,
        *,
        visibility_timeout: int | None = None,
        max_receive_count: int | None = None,
        dlq_arn: str | None = None,
        local: bool = False,
    ) -> dict[str, str]:
        """The ``CreateQueue`` attributes (strings, as SQS takes them); ``visibility_timeout`` and
        ``max_receive_count`` fill the values this queue leaves to the deployment, ``dlq_arn``
        is the ARN of :attr:`dead_letter` (required when it is set). ``local``: the local
        stack's attributes (:attr:`local_visibility_timeout_seconds` where set). Raises
        ``ValueError`` when a value the queue leaves open is not given."""
        visibility = self.visibility_timeout_seconds
        if local and self.local_visibility_timeout_seconds is not None:
            visibility = self.local_visibility_timeout_seconds
        if visibility is None:
            visibility = visibility_timeout
        if visibility is None:
            raise ValueError(f"queue {self.name!r} needs the deployment's visibility timeout")
        attrs = {
            "VisibilityTimeout": str(visibility),
            "MessageRetentionPeriod": str(self.retention_seconds),
            "ReceiveMessageWaitTimeSeconds": str(self.receive_wait_seconds),
            "SqsManagedSseEnabled": "true",
        }
        if self.dead_letter:
            count = self.max_receive_count or max_receive_count
            if dlq_arn is None or count is None:
                raise ValueError(f"queue {self.name!r} needs its DLQ's ARN and maxReceiveCount")
            attrs["RedrivePolicy"] = json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": count}
            )
        return attrs

    def subscription_attributes(self) -> dict[str, str]:
        """The SNS ``Subscribe`` attributes of a queue :attr:`subscribed_to_events`: raw
        delivery, and the filter policy (:meth:`filter_policy`) when it has one (SNS developer
        guide, "Amazon SNS message filtering")."""
        attrs = {"RawMessageDelivery": "true"}
        policy = self.filter_policy()
        if policy:
            attrs["FilterPolicy"] = json.dumps(policy)
        return attrs

    def filter_policy(self) -> dict[str, list[str]]:
        """The subscription's filter policy, attribute -> allowed values (empty: every event):
        ``event_type`` in :attr:`event_types`, and :data:`WEBHOOK_ATTRIBUTE` ``"true"`` for
        :attr:`webhook_events`."""
        policy: dict[str, list[str]] = {}
        if self.event_types:
            policy[EVENT_TYPE_ATTRIBUTE] = list(self.event_types)
        if self.webhook_events:
            policy[WEBHOOK_ATTRIBUTE] = ["true"]
        return policy


#: The message attribute of a job event that subscriptions filter on (asyncinfer.jobs.events).
EVENT_TYPE_ATTRIBUTE = "event_type"
#: The message attribute of an event that says whether its job or batch has a webhook (``"true"``
#: or ``"false"``): the webhook queue takes only the first, so events of jobs without one (a
#: 50,000-line batch's) never queue ahead of other tenants' deliveries (issue 14, item 5).
WEBHOOK_ATTRIBUTE = "has_webhook"
#: Job queue retention: longer than the longest job TTL of the spec (259200 s = 3 days).
JOB_QUEUE_RETENTION_SECONDS = 4 * DAY
#: The SQS maximum, for dead-letter queues: nothing is lost before triage.
DLQ_RETENTION_SECONDS = 14 * DAY
#: Priority classes with a queue of their own (spec: ``priority`` high | normal | low).
PRIORITIES = ("normal", "high", "low")
#: Receives before SQS itself dead-letters a webhook event (a dispatcher that keeps crashing); the
#: dispatcher moves an event to the DLQ itself once its retry window (24 h) is over.
WEBHOOK_MAX_RECEIVE_COUNT = 100
#: Receives of an OpenAI batch operation or batch-line event before SQS dead-letters it.
BATCH_MAX_RECEIVE_COUNT = 5
#: The terminal job events, all the batch-events queue's subscription lets through.
TERMINAL_JOB_EVENTS = ("job.succeeded", "job.failed", "job.cancelled", "job.expired")
#: The batch queues' visibility timeout on the local stack, seconds (AWS: six times the
#: consumer's timeout, 30 and 90 minutes). There a record failed by the expander or the counter
#: (``LinesNotVisible``: a line's event before its line record) comes back only when the
#: timeout ends, which a laptop user or an e2e test cannot wait for. The local stack invokes
#: each queue's handler one batch at a time and deletes or releases the batch before receiving
#: again, with the local Lambda runtime's 30 s timeout (:mod:`asyncinfer.local.lambda_runtime`),
#: so a record is never received twice while an invocation still holds it, and the timeout is
#: only the retry delay. ``tests/infra/test_topology_parity.py`` allows this difference only.
BATCH_LOCAL_VISIBILITY_SECONDS = 60

QUEUES: dict[str, Queue] = {
    q.name: q
    for q in (
        # One per model and priority class; the worker extends visibility by heartbeats.
        Queue(
            "jobs",
            JOB_QUEUE_RETENTION_SECONDS,
            None,
            receive_wait_seconds=20,
            dead_letter="jobs-dlq",
            fair=True,
            per_model=True,
        ),
        # One per model; six times the DLQ handler's timeout (Lambda developer guide).
        Queue(
            "jobs-dlq",
            DLQ_RETENTION_SECONDS,
            6 * DLQ_HANDLER_TIMEOUT_SECONDS,
            per_model=True,
        ),
        # Subscribed to the events topic (raw delivery); six times the dispatcher's timeout. A
        # failed attempt sets the message's own retry delay.
        Queue(
            "webhooks",
            DLQ_RETENTION_SECONDS,
            6 * WEBHOOK_DISPATCHER_TIMEOUT_SECONDS,
            dead_letter="webhooks-dlq",
            max_receive_count=WEBHOOK_MAX_RECEIVE_COUNT,
            subscribed_to_events=True,
            webhook_events=True,
        ),
        Queue("webhooks-dlq", DLQ_RETENTION_SECONDS, 30),
        # OpenAI batch operations (expand, end, check); six times the expander's timeout.
        # Retention: the SQS maximum (a check may wait in the queue for a long batch).
        Queue(
            "batches",
            DLQ_RETENTION_SECONDS,
            6 * BATCH_EXPANDER_TIMEOUT_SECONDS,
            dead_letter="batches-dlq",
            max_receive_count=BATCH_MAX_RECEIVE_COUNT,
            local_visibility_timeout_seconds=BATCH_LOCAL_VISIBILITY_SECONDS,
        ),
        Queue("batches-dlq", DLQ_RETENTION_SECONDS, 30),
        # The terminal job events (raw delivery, filtered), the counter's input; six times its
        # timeout.
        Queue(
            "batch-events",
            DLQ_RETENTION_SECONDS,
            6 * BATCH_COUNTER_TIMEOUT_SECONDS,
            dead_letter="batch-events-dlq",
            max_receive_count=BATCH_MAX_RECEIVE_COUNT,
            subscribed_to_events=True,
            event_types=TERMINAL_JOB_EVENTS,
            local_visibility_timeout_seconds=BATCH_LOCAL_VISIBILITY_SECONDS,
        ),
        Queue("batch-events-dlq", DLQ_RETENTION_SECONDS, 30),
    )
}
