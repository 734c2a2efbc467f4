"""Properties every deployment has (both compute modes)."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Match

from asyncinfer.core import naming, topology
from asyncinfer.core.settings import Settings
from asyncinfer.models.registry import MODELS

#: The OpenAI batch queues and their dead-letter queues (asyncinfer.core.topology, issue 15).
_BATCH_QUEUES = sum(1 for name in topology.QUEUES if name.startswith("batch"))


def _resolved(env: dict[str, Any]) -> dict[str, str]:
    """The plain-string values of a template environment (tokens left out)."""
    return {k: v for k, v in env.items() if isinstance(v, str)} | {
        "ASYNCINFER_QUEUE_URL_BASE": "https://sqs.us-east-1.amazonaws.com/123456789012/"
    }


def _policy_statements(s: Any, rtype: str) -> list[dict[str, Any]]:
    out = []
    for p in s.props(rtype):
        doc = p.get("PolicyDocument", {})
        out.extend(doc.get("Statement", []))
    return out


def _denies_insecure_transport(statements: list[dict[str, Any]]) -> bool:
    return any(
        st.get("Effect") == "Deny"
        and st.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
        for st in statements
    )


def test_table_matches_the_store_design(any_mode: Any) -> None:
    any_mode.assertions.resource_count_is("AWS::DynamoDB::Table", 1)
    any_mode.assertions.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": "job_id", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
            "TimeToLiveSpecification": {"AttributeName": "ttl", "Enabled": True},
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "SSESpecification": {"SSEEnabled": True},
            "GlobalSecondaryIndexes": [
                {
                    "IndexName": "tenant-index",
                    "KeySchema": [
                        {"AttributeName": "tenant", "KeyType": "HASH"},
                        {"AttributeName": "job_id", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "ALL"},
                },
                {
                    "IndexName": "queued-expiry-index",
                    "KeySchema": [
                        {"AttributeName": "queued_mark", "KeyType": "HASH"},
                        {"AttributeName": "expires_epoch", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
                # issue 14 added this index (see test_running_lease_index_is_sparse_keys_only)
                RUNNING_LEASE_INDEX,
                # issue 14's events outbox (see test_outbox_index_is_sparse_keys_only)
                OUTBOX_INDEX,
            ],
        },
    )


RUNNING_LEASE_INDEX = {
    "IndexName": "running-lease-index",
    "KeySchema": [
        {"AttributeName": "running_mark", "KeyType": "HASH"},
        {"AttributeName": "lease_expires_epoch", "KeyType": "RANGE"},
    ],
    "Projection": {"ProjectionType": "KEYS_ONLY"},
}


OUTBOX_INDEX = {
    "IndexName": "outbox-index",
    "KeySchema": [
        {"AttributeName": "outbox_mark", "KeyType": "HASH"},
        {"AttributeName": "outbox_since", "KeyType": "RANGE"},
    ],
    "Projection": {"ProjectionType": "KEYS_ONLY"},
}


def test_outbox_index_is_sparse_keys_only(any_mode: Any) -> None:
    """The sweeper finds records with events still pending through this GSI (issue 14,
    behaviour 6), keyed as the transitions write it (tests/unit/test_outbox.py)."""
    from asyncinfer.jobs.record import OUTBOX_INDEX as NAME

    (table,) = any_mode.props("AWS::DynamoDB::Table")
    index = next(i for i in table["GlobalSecondaryIndexes"] if i["IndexName"] == NAME)
    assert index == OUTBOX_INDEX
    types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
    assert types["outbox_mark"] == "S" and types["outbox_since"] == "N"


def test_running_lease_index_is_sparse_keys_only(any_mode: Any) -> None:
    """The sweeper finds running jobs whose lease lapsed through this GSI (issue 14), keyed as
    the store keys it (the local stack's table: tests/unit/test_leases.py)."""
    from asyncinfer.jobs.record import RUNNING_INDEX

    (table,) = any_mode.props("AWS::DynamoDB::Table")
    index = next(i for i in table["GlobalSecondaryIndexes"] if i["IndexName"] == RUNNING_INDEX)
    assert index == RUNNING_LEASE_INDEX
    types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
    assert types["running_mark"] == "S" and types["lease_expires_epoch"] == "N"


def test_each_model_has_a_queue_per_priority_class_sharing_one_dlq(any_mode: Any) -> None:
    api_env = next(
        p["Environment"]["Variables"]
        for p in any_mode.props("AWS::Lambda::Function")
        if p.get("Description") == "asyncinfer REST API"
    )
    models = api_env["ASYNCINFER_MODELS"].split(",")
    redriven = [
        p
        for p in any_mode.props("AWS::SQS::Queue")
        if "RedrivePolicy" in p
        and p["RedrivePolicy"]["maxReceiveCount"] != 100
        and naming.JOBS_INFIX in p.get("QueueName", "")  # not the OpenAI batch queues
    ]
    targets = {json.dumps(p["RedrivePolicy"]["deadLetterTargetArn"]) for p in redriven}
    assert len(redriven) == 3 * len(models)
    assert len(targets) == len(models)
    # The queues are named by the rule the code derives their URLs from (asyncinfer.core.naming).
    prefix = api_env["ASYNCINFER_RESOURCE_PREFIX"]
    names = {p["QueueName"] for p in redriven}
    for model in models:
        assert naming.queue_name(prefix, model, "high") in names
        assert naming.queue_name(prefix, model, "low") in names


def test_expiry_sweeper_runs_every_minute(any_mode: Any) -> None:
    rules = any_mode.props("AWS::Events::Rule")
    assert sum(1 for r in rules if r.get("ScheduleExpression") == "rate(1 minute)") >= 1
    fns = [
        p
        for p in any_mode.props("AWS::Lambda::Function")
        if "expiry sweeper" in p.get("Description", "")
    ]
    assert len(fns) == 1


def test_table_and_bucket_are_retained_by_default(any_mode: Any) -> None:
    any_mode.assertions.has_resource("AWS::DynamoDB::Table", {"DeletionPolicy": "Retain"})
    any_mode.assertions.has_resource("AWS::S3::Bucket", {"DeletionPolicy": "Retain"})


def test_data_bucket_is_private_encrypted_and_expires_inputs_and_outputs(any_mode: Any) -> None:
    any_mode.assertions.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [
                    {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
                ]
            },
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "LoggingConfiguration": Match.any_value(),
            "LifecycleConfiguration": {
                "Rules": Match.array_with(
                    [
                        Match.object_like(
                            {"Prefix": "inputs/", "ExpirationInDays": 7, "Status": "Enabled"}
                        ),
                        Match.object_like(
                            {"Prefix": "outputs/", "ExpirationInDays": 7, "Status": "Enabled"}
                        ),
                    ]
                )
            },
        },
    )
    for p in any_mode.props("AWS::S3::Bucket"):
        assert p["PublicAccessBlockConfiguration"]["BlockPublicPolicy"] is True
    assert _denies_insecure_transport(_policy_statements(any_mode, "AWS::S3::BucketPolicy"))
    assert len(any_mode.props("AWS::S3::BucketPolicy")) == len(any_mode.props("AWS::S3::Bucket"))


def _completion_failures(s: Any) -> int:
    """Queues added by issue 14: the SageMaker completion Lambda's on-failure destination."""
    return 1 if s.mode == "sagemaker" else 0


def test_three_priority_queues_and_one_dlq_per_model(any_mode: Any) -> None:
    queues = any_mode.props("AWS::SQS::Queue")
    # + the webhook queue and its DLQ (+ the completion Lambda's failure destination: issue 14)
    # + the OpenAI batch queues and their DLQs (issue 15)
    assert len(queues) == 4 * len(MODELS) + 2 + _completion_failures(any_mode) + _BATCH_QUEUES
    main = [q for q in queues if q.get("RedrivePolicy", {}).get("maxReceiveCount") != 100]
    main = [q for q in main if naming.JOBS_INFIX in q.get("QueueName", "")]
    main = [q for q in main if "RedrivePolicy" in q]
    assert len(main) == 3 * len(MODELS)
    for q in main:
        assert q["RedrivePolicy"]["maxReceiveCount"] == 3
        assert q["VisibilityTimeout"] == 120
        assert q["ReceiveMessageWaitTimeSeconds"] == 20
    for q in queues:
        assert q["SqsManagedSseEnabled"] is True


def test_every_queue_policy_denies_plain_http(any_mode: Any) -> None:
    policies = any_mode.props("AWS::SQS::QueuePolicy")
    assert sum(len(p["Queues"]) for p in policies) == (
        4 * len(MODELS) + 2 + _completion_failures(any_mode) + _BATCH_QUEUES
    )
    for p in policies:
        assert _denies_insecure_transport(p["PolicyDocument"]["Statement"])


def test_topics_are_kms_encrypted_and_tls_only(any_mode: Any) -> None:
    topics = any_mode.props("AWS::SNS::Topic")
    assert topics
    for t in topics:
        assert "KmsMasterKeyId" in t
    any_mode.assertions.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    assert _denies_insecure_transport(_policy_statements(any_mode, "AWS::SNS::TopicPolicy"))
    assert sum(len(p["Topics"]) for p in any_mode.props("AWS::SNS::TopicPolicy")) == len(topics)


def test_health_needs_no_key_and_everything_else_does(any_mode: Any) -> None:
    methods = any_mode.props("AWS::ApiGateway::Method")
    by_method = {m["HttpMethod"]: m for m in methods}
    assert set(by_method) == {"GET", "ANY"}
    assert by_method["GET"]["ApiKeyRequired"] is False
    assert by_method["ANY"]["ApiKeyRequired"] is True
    paths = {r["PathPart"] for r in any_mode.props("AWS::ApiGateway::Resource")}
    assert paths == {"v1", "health", "{proxy+}", "openai"}  # /openai/{proxy+}: issue 15
    for m in methods:
        assert m["Integration"]["Type"] == "AWS_PROXY"


def test_usage_plan_throttles_and_has_a_quota(any_mode: Any) -> None:
    any_mode.assertions.has_resource_properties(
        "AWS::ApiGateway::UsagePlan",
        {
            "Throttle": {"RateLimit": 50, "BurstLimit": 100},
            "Quota": {"Limit": 100000, "Period": "DAY"},
            "ApiStages": Match.any_value(),
        },
    )
    any_mode.assertions.resource_count_is("AWS::ApiGateway::ApiKey", 1)
    any_mode.assertions.resource_count_is("AWS::ApiGateway::UsagePlanKey", 1)


def test_stage_has_access_logs_tracing_and_throttling(any_mode: Any) -> None:
    stage = any_mode.props("AWS::ApiGateway::Stage")[0]
    assert "DestinationArn" in stage["AccessLogSetting"]
    assert "$context.identity.apiKeyId" in stage["AccessLogSetting"]["Format"]
    assert stage["TracingEnabled"] is True
    settings = stage["MethodSettings"][0]
    assert settings["LoggingLevel"] == "ERROR"
    assert settings["ThrottlingRateLimit"] > 0


def test_gateway_errors_use_the_contract_error_shape(any_mode: Any) -> None:
    responses = {r["ResponseType"]: r for r in any_mode.props("AWS::ApiGateway::GatewayResponse")}
    assert responses["THROTTLED"]["StatusCode"] == "429"
    assert responses["QUOTA_EXCEEDED"]["StatusCode"] == "429"
    assert responses["REQUEST_TOO_LARGE"]["StatusCode"] == "413"
    body = responses["REQUEST_TOO_LARGE"]["ResponseTemplates"]["application/json"]
    assert '"code": "payload_too_large"' in body


def test_lambdas_use_powertools_layer_tracing_and_settings(any_mode: Any) -> None:
    fns = [f for f in any_mode.props("AWS::Lambda::Function") if f.get("Handler") == "app.handler"]
    assert len(fns) >= 3
    for f in fns:
        assert f["Runtime"] == "python3.12"
        assert f["TracingConfig"] == {"Mode": "Active"}
        layer = any_mode.stack.resolve(f["Layers"][0]) if f.get("Layers") else None
        # The layer ARN comes from Powertools' SSM parameter of the python312/arm64 build.
        param = any_mode.template["Parameters"][layer["Ref"]]
        assert param["Default"].startswith("/aws/service/powertools/python/arm64/python3.12/")
        env = f["Environment"]["Variables"]
        assert env["POWERTOOLS_SERVICE_NAME"]
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "asyncinfer"
        assert "ASYNCINFER_RESOURCE_PREFIX" in env and "ASYNCINFER_QUEUE_URL_BASE" in env
    api = next(f for f in fns if f["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"] == "api")
    for var in (
        "ASYNCINFER_TABLE",
        "ASYNCINFER_BUCKET",
        "ASYNCINFER_TOPIC_ARN",
        "ASYNCINFER_MODELS",
        "ASYNCINFER_MAX_RECEIVE_COUNT",
        "ASYNCINFER_VISIBILITY_TIMEOUT",
    ):
        assert var in api["Environment"]["Variables"]
    assert api["Timeout"] == 29


def test_dlq_handler_reads_every_dlq_with_partial_batch_failures(any_mode: Any) -> None:
    mappings = any_mode.props("AWS::Lambda::EventSourceMapping")
    dlq_fn = [m for m in mappings if "DlqFn" in str(m["FunctionName"])]
    assert len(dlq_fn) == len(MODELS)
    for m in dlq_fn:
        assert m["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_sqs_triggered_lambdas_fit_their_queue_visibility(any_mode: Any) -> None:
    """Lambda guidance: queue visibility timeout >= 6 x function timeout."""
    t = any_mode.template["Resources"]
    for m in any_mode.props("AWS::Lambda::EventSourceMapping"):
        fn = t[m["FunctionName"]["Ref"]]["Properties"]
        queue = t[m["EventSourceArn"]["Fn::GetAtt"][0]]["Properties"]
        assert queue["VisibilityTimeout"] >= 6 * fn["Timeout"]


def test_alarms_per_model(any_mode: Any) -> None:
    alarms = any_mode.props("AWS::CloudWatch::Alarm")
    descriptions = " ".join(a.get("AlarmDescription", "") for a in alarms)
    for model in MODELS:
        assert f"{model}: messages in the dead-letter queue" in descriptions
        assert f"{model}: a job waited over 900 s" in descriptions
        assert f"{model}: over 10.0% of jobs failed" in descriptions
    oldest = [
        a
        for a in alarms
        if a.get("MetricName") == "ApproximateAgeOfOldestMessage"
        and not a.get("AlarmDescription", "").startswith("OpenAI batches")  # their own alarm
    ]
    assert oldest and all(a["Threshold"] == 900 for a in oldest)
    any_mode.assertions.resource_count_is("AWS::CloudWatch::Dashboard", 1)


def test_lambda_log_groups_have_retention(any_mode: Any) -> None:
    for g in any_mode.props("AWS::Logs::LogGroup"):
        assert g["RetentionInDays"] == 30


def test_outputs(any_mode: Any) -> None:
    assert {"ApiUrl", "ApiKeyId", "EventsTopicArn", "TableName", "BucketName", "QueueUrls"} <= set(
        any_mode.template["Outputs"]
    )


def test_webhook_queue_subscribes_raw_and_feeds_the_dispatcher(any_mode: Any) -> None:
    subs = [s for s in any_mode.props("AWS::SNS::Subscription") if s.get("Protocol") == "sqs"]
    assert any(s.get("RawMessageDelivery") is True for s in subs)
    dispatcher = [
        p
        for p in any_mode.props("AWS::Lambda::Function")
        if "webhook dispatcher" in p.get("Description", "")
    ]
    assert len(dispatcher) == 1
    env = dispatcher[0]["Environment"]["Variables"]
    assert {"ASYNCINFER_WEBHOOK_QUEUE_URL", "ASYNCINFER_WEBHOOK_DLQ_URL"} <= set(env)
    assert "VpcConfig" not in dispatcher[0]
    mappings = [
        m
        for m in any_mode.props("AWS::Lambda::EventSourceMapping")
        if "Dispatcher" in str(m["FunctionName"])
    ]
    assert len(mappings) == 1
    assert mappings[0]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_api_can_wake_a_backend_at_zero(any_mode: Any) -> None:
    api = next(
        p
        for p in any_mode.props("AWS::Lambda::Function")
        if p.get("Description") == "asyncinfer REST API"
    )
    env = api["Environment"]["Variables"]
    statements = json.dumps([p["PolicyDocument"] for p in any_mode.props("AWS::IAM::Policy")])
    # Service and endpoint names follow from the prefix and the compute mode
    # (asyncinfer.core.naming).
    settings = Settings.from_env(_resolved(env))
    if any_mode.mode == "ecs":
        assert {"ASYNCINFER_ECS_CLUSTER", "ASYNCINFER_RESOURCE_PREFIX"} <= set(env)
        assert settings.ecs_services and set(settings.ecs_services) == set(MODELS)
        services = {s["ServiceName"] for s in any_mode.props("AWS::ECS::Service")}
        assert set(settings.ecs_services.values()) == services
        assert "ecs:UpdateService" in statements
    else:
        assert env["ASYNCINFER_COMPUTE"] == "sagemaker"
        endpoints = {e["EndpointName"] for e in any_mode.props("AWS::SageMaker::Endpoint")}
        assert set(settings.sagemaker_endpoints.values()) == endpoints
        assert "sagemaker:UpdateEndpointWeightsAndCapacities" in statements


def test_bodies_over_the_lambda_limit_get_413_from_waf(any_mode: Any) -> None:
    acls = any_mode.props("AWS::WAFv2::WebACL")
    assert len(acls) == 1
    rules = {r["Name"]: r for r in acls[0]["Rules"]}
    rule = rules["content-length-over-lambda-limit"]
    assert rule["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 413
    match = rule["Statement"]["RegexMatchStatement"]
    assert match["FieldToMatch"] == {"SingleHeader": {"Name": "content-length"}}
    body = acls[0]["CustomResponseBodies"]["too_large_for_lambda"]["Content"]
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    assert len(any_mode.props("AWS::WAFv2::WebACLAssociation")) == 1
