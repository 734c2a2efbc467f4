"""Each component works with just its part of the settings (issue 14: "each component receives
the part it uses"), against moto in-process. A part is a frozen model with only its fields, so
a component that read anything else would fail here with ``AttributeError``; the first tests
check that the parts leave out what their components have no use for."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import asyncinfer.functions.sweeper as sweeper
from asyncinfer.aws import clients
from asyncinfer.core import envvars as ev
from asyncinfer.core.settings import Settings
from asyncinfer.core.settings_parts import (
    ApiSettings,
    BridgeSettings,
    CompletionSettings,
    DlqSettings,
    ModelSettings,
    OpenAISettings,
    ScalingSettings,
    SettingsPart,
    SweeperSettings,
    WebhookSettings,
    WorkerSettings,
)
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.dlq import DeadLetterHandler
from asyncinfer.functions.sagemaker_bridge import Bridge, inference_id
from asyncinfer.functions.sagemaker_completion import Completion
from asyncinfer.functions.webhook_dispatcher import WebhookDispatcher
from asyncinfer.jobs.events import event_for
from asyncinfer.jobs.inputs import new_upload
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.resources import Resources
from asyncinfer.openai_api.batch_store import BatchStore
from asyncinfer.openai_api.batches import BatchRequest, BatchService
from asyncinfer.openai_api.expansion import Expander
from asyncinfer.openai_api.finalize import count_event
from asyncinfer.scaling.wake import UNMANAGED, wake_on_submit
from asyncinfer.webhooks.secrets import SecretStore
from asyncinfer.webhooks.sender import WebhookSender
from asyncinfer.worker.runner import Worker
from tests.unit.batch_helpers import chat_line, echo_ok, finish, line_jobs, upload

TENANT = "tenant-a"


def fields(part: type[SettingsPart]) -> set[str]:
    return set(part.model_fields)


def submit(api: ApiSettings, **req: Any) -> str:
    job, created = JobService(api).submit(
        TENANT, JobRequest(model="echo", **{"input": {"text": "hi"}, **req})
    )
    assert created
    return str(job["id"])


def take_message(api: ApiSettings) -> dict[str, Any]:
    sqs = clients.client("sqs", api)
    msgs = sqs.receive_message(QueueUrl=api.queue_url("echo"), MaxNumberOfMessages=10)
    assert len(msgs["Messages"]) == 1
    return dict(msgs["Messages"][0])


# ---------------------------------------------------------------------------- what a part holds


def test_the_parts_leave_out_what_their_component_has_no_use_for() -> None:
    webhook_only = {"webhook_queue_url", "webhook_dlq_url", "webhook_retry_base_seconds"}
    secrets = {"webhook_secrets_key"}
    batches = {"batch_queue_url", "batch_events_queue_url", "batch_chunk_lines"}
    assert not fields(WorkerSettings) & (webhook_only | secrets | batches | {"input_locations"})
    assert not fields(WebhookSettings) & {"bucket", "topic_arn", "queue_urls", "models", "compute"}
    assert not fields(SweeperSettings) & (webhook_only | secrets | batches | {"models"})
    assert not fields(DlqSettings) & (webhook_only | secrets | batches | {"queue_urls"})
    assert not fields(CompletionSettings) & (secrets | {"queue_urls", "sagemaker_endpoints"})
    assert not fields(BridgeSettings) & (webhook_only | secrets | {"queue_urls", "ecs_cluster"})
    # (Every part with the job store holds the visibility timeout: a hand-back's requeue deadline.)
    assert not fields(ApiSettings) & (webhook_only | batches | {"heartbeat_interval"})
    assert not fields(ScalingSettings) & ({"table_name", "bucket", "topic_arn"} | secrets)
    assert not fields(OpenAISettings) & (webhook_only | secrets)


def test_only_the_api_and_the_dispatcher_read_the_webhook_secrets_key() -> None:
    """Issue 14, behaviour 8: tenants' webhook secrets are the API's and the dispatcher's. (The
    OpenAI part carries it only inside its ``api`` part: the expander submits through the job
    service, which never opens the secrets.)"""
    readers = [
        p.__name__
        for p in (
            ApiSettings,
            WorkerSettings,
            WebhookSettings,
            SweeperSettings,
            ScalingSettings,
            DlqSettings,
            BridgeSettings,
            CompletionSettings,
        )
        if ev.WEBHOOK_SECRETS_KEY in p.env_names()
    ]
    assert readers == ["ApiSettings", "WebhookSettings"]
    assert "webhook_secrets_key" not in fields(OpenAISettings)


def test_a_nested_part_is_the_settings_part_and_its_variables_count() -> None:
    s = Settings.from_env({ev.ECS_CLUSTER: "c", ev.BATCH_CHUNK: "7", ev.TABLE: "t"})
    assert s.api.scaling == s.scaling and s.api.scaling.ecs_cluster == "c"
    assert s.openai.api == s.api and s.openai.batch_chunk_lines == 7
    assert ev.ECS_CLUSTER in ApiSettings.env_names()
    assert {ev.BATCH_CHUNK, ev.WEBHOOK_SECRETS_KEY} <= set(OpenAISettings.env_names())
    # The queue lookups of the whole settings and of a part are one rule.
    q = Settings(queue_urls={"echo": "n", "echo#high": "h"})
    for part in (q.api, q.worker, q.sweeper, q.scaling):
        assert part.queue_url("echo", "high") == q.queue_url("echo", "high") == "h"
        assert part.queue_url("echo", "low") == "n"
        assert (
            part.priority_queues("echo")
            == q.priority_queues("echo")
            == {"high": "h", "normal": "n"}
        )


# ---------------------------------------------------------------------------- each component


def test_the_api_works_with_its_part(settings: Settings) -> None:
    api = settings.api
    svc = JobService(api)
    job_id = submit(api)
    assert svc.get(TENANT, job_id)["status"] == "queued"
    assert svc.cancel(TENANT, job_id)["status"] == "cancelled"
    assert "echo" in [m["id"] for m in svc.deployed_models()]
    assert SecretStore(api).get(TENANT).secret.startswith("whsec_")
    form = new_upload(api, clients.client("s3", api), TENANT)
    assert form["max_bytes"] == api.max_input_bytes
    assert wake_on_submit(api.scaling, "echo") == UNMANAGED  # no ECS service or endpoint here


def test_a_worker_runs_a_job_with_its_part(settings: Settings) -> None:
    job_id = submit(settings.api)
    worker = Worker(settings.worker, "echo", max_wait_seconds=0)
    worker.intake.receive_wait_seconds = 1
    worker.run(max_jobs=1)
    rec = JobStore(settings.worker).get(job_id)
    assert rec is not None and rec["status"] == "succeeded"


def test_the_model_handlers_work_with_just_the_model_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handlers read the part they are given (``settings=``), never the environment: the
    environment says one thing, the part another, and the part wins."""
    from asyncinfer.models.kinds.causal_lm import CausalLMHandler
    from asyncinfer.models.registry import MODELS
    from asyncinfer.models.weights import default_cache_root

    monkeypatch.setenv(ev.ECHO_BATCHING, "1")
    monkeypatch.setenv(ev.TOKEN_BUDGET, "111")
    monkeypatch.setenv(ev.MODEL_CACHE, str(tmp_path / "env-cache"))
    part = ModelSettings(
        models_file=None,
        model_cache_dir=tmp_path / "cache",
        weights_cache_dir=None,
        token_budget=4321,
        echo_batching=False,
        engine_url="http://127.0.0.1:1",
    )
    echo = MODELS["echo"].load_handler(settings=part)
    assert echo.batching is False and echo.capacity(8) == 1
    assert echo.cache_dir == tmp_path / "cache"
    assert (
        MODELS["echo"]
        .load_handler(settings=part.model_copy(update={"echo_batching": True}))
        .batching
    )
    lm = CausalLMHandler(spec=SimpleNamespace(id="lm", entry=None), settings=part)
    assert lm.budget() == 4321  # no entry, no CUDA model: the part's budget, not the env's 111
    assert default_cache_root(part) == tmp_path / "cache" / "weights"
    # The worker hands its handler the worker's part.
    s = Settings.from_env({ev.ECHO_BATCHING: "0", ev.TOKEN_BUDGET: "99"})
    assert s.worker.model_settings == s.model_settings
    assert (s.model_settings.echo_batching, s.model_settings.token_budget) == (False, 99)
    assert ev.ECHO_BATCHING in WorkerSettings.env_names()
    assert ev.ENGINE_URL in ModelSettings.env_names()


def test_a_worker_loads_its_handler_with_its_model_part(settings: Settings) -> None:
    part = settings.worker.model_copy(
        update={
            "model_settings": settings.model_settings.model_copy(update={"echo_batching": False})
        }
    )
    worker = Worker(part, "echo", max_wait_seconds=0)
    worker.load()
    assert worker.handler is not None and worker.handler.settings == part.model_settings
    assert worker.handler.batching is False


def test_the_sweeper_works_with_its_part(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = settings.sweeper
    due = submit(settings.api, ttl_seconds=10)
    lost = submit(settings.api, ttl_seconds=7200)
    store = JobStore(part)
    # Started, its job.started left in the outbox (a worker that died before publishing).
    store.transition(lost, from_status="queued", to_status="running", increment_attempts=True)
    real = time.time
    monkeypatch.setattr(sweeper.time, "time", lambda: real() + 3600)
    assert sweeper.republish_pending(part) >= 1
    assert sweeper.expire_due(part) == [due]
    assert [r["job_id"] for r in sweeper.take_back_lapsed(part)] == [lost]
    assert store.get(lost)["status"] == "queued"  # type: ignore[index]


def test_the_dlq_handler_works_with_its_part(settings: Settings) -> None:
    job_id = submit(settings.api)
    msg = take_message(settings.api)
    rec = DeadLetterHandler(settings.dlq).handle(msg["Body"], 3, msg["MessageId"])
    assert rec is not None and rec["job_id"] == job_id and rec["status"] == "failed"


def test_the_webhook_dispatcher_works_with_its_part(settings: Settings) -> None:
    job_id = submit(settings.api, webhook={"url": "https://93.184.216.34/hook"})
    store = JobStore(settings.api)
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)
    rec = store.transition(
        job_id,
        from_status="running",
        to_status="succeeded",
        set_fields={"output": json.dumps({"ok": True}), "completed_at": "2026-01-01T00:00:00.000Z"},
    )
    sent: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200)

    sender = WebhookSender(transport=httpx.MockTransport(receiver))
    d = WebhookDispatcher(settings.webhooks, sender=sender)
    assert d.handle(json.dumps(event_for(rec))) == "delivered"
    assert len(sent) == 1 and sent[0].headers["webhook-id"]


class Runtime:
    """``sagemaker-runtime`` stand-in: takes every InvokeEndpointAsync."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def invoke_endpoint_async(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        return {"InferenceId": kw["InferenceId"], "OutputLocation": "s3://b/o"}


def test_the_sagemaker_bridge_and_completion_work_with_their_parts(
    settings: Settings, resources: Resources
) -> None:
    job_id = submit(settings.api)
    msg = take_message(settings.api)
    runtime = Runtime()
    bridge = Bridge(settings=settings.bridge, endpoints={"echo": "ep-echo"}, runtime=runtime)
    assert bridge.submit(msg["Body"], message_id=msg["MessageId"]) is True
    assert runtime.calls[0]["InferenceId"] == inference_id(job_id, 1)
    rec = JobStore(settings.bridge).get(job_id)
    assert rec is not None and rec["status"] == "running"

    key = f"outputs/{job_id}.out"
    s3 = clients.client("s3", settings.completion)
    s3.put_object(Bucket=resources.bucket, Key=key, Body=json.dumps({"text": "hi"}).encode())
    note = {
        "inferenceId": inference_id(job_id, 1),
        "invocationStatus": "Completed",
        "responseParameters": {"outputLocation": f"s3://{resources.bucket}/{key}"},
    }
    out = Completion(settings=settings.completion).handle_sns_event(
        {"Records": [{"Sns": {"Message": json.dumps(note)}}]}
    )
    assert out == {"jobs": {job_id: "succeeded"}}


def test_the_openai_batch_functions_work_with_their_part(settings: Settings) -> None:
    part = settings.openai
    fid = upload(part, TENANT, [chat_line("a"), chat_line("b")])
    batch = BatchService(part).create(
        TENANT, BatchRequest(input_file_id=fid, endpoint="/v1/chat/completions")
    )
    Expander(part).handle({"op": "expand", "batch_id": batch["id"]}, time.monotonic() + 60)
    jobs = line_jobs(part, TENANT)
    assert len(jobs) == 2
    for rec in jobs:
        ended = finish(part, rec, echo_ok)
        assert ended is not None
        assert count_event(part, event_for(ended), TENANT)
    record = BatchStore(part).get(batch["id"])
    assert record is not None and record["status"] == "completed"


# ---------------------------------------------------------------------------- entry points


def test_each_entry_point_builds_its_components_part(
    resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncinfer.functions import dlq, webhook_dispatcher
    from asyncinfer.functions.api import app as api_app
    from asyncinfer.local.lambda_runtime import LocalContext
    from asyncinfer.openai_api import expansion, routes_batches
    from asyncinfer.worker import __main__ as worker_main
    from tests.conftest import reset_caches

    reset_caches()
    webhook_dispatcher._dispatcher.cache_clear()
    try:
        assert type(api_app.service().settings) is ApiSettings
        assert type(routes_batches.service().settings) is OpenAISettings
        assert type(expansion._expander().settings) is OpenAISettings
        assert type(dlq._handler().settings) is DlqSettings
        assert type(webhook_dispatcher._dispatcher().settings) is WebhookSettings
        assert type(Bridge.from_env(runtime=Runtime()).settings) is BridgeSettings
        assert type(Completion.from_env().settings) is CompletionSettings
    finally:
        webhook_dispatcher._dispatcher.cache_clear()
        reset_caches()

    seen: list[type] = []
    for name, nothing in (("expire_due", []), ("take_back_lapsed", []), ("republish_pending", 0)):
        monkeypatch.setattr(sweeper, name, lambda s, _r=nothing: seen.append(type(s)) or _r)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "asyncinfer")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    sweeper.handler({}, LocalContext("sweeper"))
    assert seen == [SweeperSettings] * 3

    class Stop(Exception):
        pass

    def fake_worker(settings: Any, model: str, **kw: Any) -> Any:
        seen.append(type(settings))
        raise Stop

    monkeypatch.setattr(worker_main, "Worker", fake_worker)
    monkeypatch.setattr(worker_main.logs, "setup", lambda *a, **k: None)
    with pytest.raises(Stop):
        worker_main.main(["--model", "echo"])
    assert seen[-1] is WorkerSettings


def test_a_custom_handler_with_its_own_init_of_spec_and_cache_dir_still_loads(
    tmp_path: Path,
) -> None:
    """A deployer's ``python`` handler whose ``__init__`` takes only ``spec`` and ``cache_dir``
    (as before the settings part) gets the part's cache folder instead of ``settings``."""
    (tmp_path / "oldstyle.py").write_text(
        "from asyncinfer.models.base import ModelHandler\n"
        "class Old(ModelHandler):\n"
        "    def __init__(self, *, spec, cache_dir=None):\n"
        "        super().__init__(spec=spec, cache_dir=cache_dir)\n"
        "    def load(self):\n"
        "        pass\n"
        "    def predict(self, items):\n"
        "        return [{} for _ in items]\n"
    )
    (tmp_path / "models.yaml").write_text(
        "models:\n  - id: old\n    kind: python\n    handler: oldstyle:Old\n"
        "    input_schema: schema.json\n"
    )
    (tmp_path / "schema.json").write_text('{"type": "object"}')
    from asyncinfer.core.settings import Settings
    from asyncinfer.models.registry import Registry

    registry = Registry()
    registry.use(tmp_path / "models.yaml")
    part = Settings.from_env().model_settings.model_copy(update={"model_cache_dir": tmp_path})
    handler = registry["old"].load_handler(settings=part)
    assert handler.cache_dir == tmp_path
