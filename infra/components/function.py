"""A Python Lambda function of this project: code assembled from the repository (no Docker),
Powertools from its published layer, X-Ray tracing, a log group with retention."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import version as installed_version
from pathlib import Path

from aws_cdk import Aws, CfnMapping, Duration, RemovalPolicy, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from asyncinfer.core import envvars as ev
from infra.lambda_code import catalogue_path_in_asset, stage_lambda_code

#: The Lambda runtime; the Powertools layer is built per Python version (``python312``).
RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.ARM_64
#: Accounts that publish the Powertools for AWS Lambda (Python) v3 layers, per partition
#: (Powertools docs, "Lambda Layer": arn:aws:lambda:{region}:017000801446:layer:...). Used only
#: with a pinned ``powertools_layer_version``; other partitions use the SSM parameter (default).
POWERTOOLS_ACCOUNTS = {"aws": "017000801446"}
POWERTOOLS_LAYER = "AWSLambdaPowertoolsPythonV3-python312-arm64"
METRICS_NAMESPACE = "asyncinfer"


def powertools_version() -> str:
    """The installed ``aws-lambda-powertools`` version: the one the tests run, and the one
    whose layer the functions load by default."""
    return installed_version("aws-lambda-powertools")


def powertools_ssm_parameter(version: str | None = None) -> str:
    """Powertools' public SSM parameter holding the layer ARN of ``version`` for python3.12 on
    arm64 in the stack's region and partition (Powertools docs, "Lambda Layer": SSM parameters
    ``/aws/service/powertools/python/{arch}/{python_version}/{version}``)."""
    return f"/aws/service/powertools/python/arm64/python3.12/{version or powertools_version()}"


def powertools_layer(scope: Construct, pinned_version: int = 0) -> lambda_.ILayerVersion:
    """The Powertools layer of the stack's functions.

    ``pinned_version`` 0 (default): the layer of the installed Powertools version, resolved at
    deploy time from Powertools' public SSM parameter, so tests and Lambdas run the same version
    in every partition and region it is published in. A pinned layer version >= 1: its ARN with
    the publishing account of the stack's partition (a CloudFormation mapping).
    """
    if not pinned_version:
        arn = ssm.StringParameter.value_for_string_parameter(scope, powertools_ssm_parameter())
    else:
        stack = Stack.of(scope)
        accounts = CfnMapping(
            stack,
            "PowertoolsAccounts",
            mapping={p: {"account": a} for p, a in POWERTOOLS_ACCOUNTS.items()},
        )
        account = accounts.find_in_map(Aws.PARTITION, "account")
        arn = (
            f"arn:{Aws.PARTITION}:lambda:{Aws.REGION}:{account}:layer:"
            f"{POWERTOOLS_LAYER}:{pinned_version}"
        )
    return lambda_.LayerVersion.from_layer_version_arn(scope, "Powertools", arn)


class PythonFunction(Construct):
    """A Lambda function from ``lambdas/<code>/app.py`` (handler ``app.handler``).

    Args:
        code: folder name under ``lambdas/``.
        service: Powertools service name (logs, metrics, traces).
        environment: extra environment variables (the ``ASYNCINFER_*`` settings).
        timeout: function timeout.
        memory_mib: memory size, MiB.
        layer: the Powertools layer.
        log_retention: retention of the function's log group.
        removal_policy: of the log group.
        description: function description.
        vendored: packages copied from the current environment into the code asset (those the
            Powertools layer and the runtime lack).
        reserved_concurrency: executions reserved for (and the most allowed to) this function;
            0 or ``None``: none reserved (the account's unreserved pool).
        tracing: X-Ray active tracing (each trace is billed beyond the free tier).
        models_file: the model catalogue, staged into the code asset with its input schemas
            (:func:`infra.lambda_code.stage_catalogue`); ``ASYNCINFER_MODELS_FILE`` points at it.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: str,
        service: str,
        environment: Mapping[str, str],
        timeout: Duration,
        layer: lambda_.ILayerVersion,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
        memory_mib: int = 256,
        description: str = "",
        vendored: tuple[str, ...] = ("ulid",),
        reserved_concurrency: int | None = None,
        tracing: bool = True,
        models_file: Path | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.log_group = logs.LogGroup(
            self, "Logs", retention=log_retention, removal_policy=removal_policy
        )
        env = {
            "POWERTOOLS_SERVICE_NAME": service,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
            "POWERTOOLS_LOG_LEVEL": "INFO",
            "POWERTOOLS_LOGGER_LOG_EVENT": "false",
            "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
            **({} if tracing else {"POWERTOOLS_TRACE_DISABLED": "true"}),
            **environment,
        }
        if models_file is not None:
            env[ev.MODELS_FILE] = f"/var/task/{catalogue_path_in_asset(models_file)}"
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler="app.handler",
            code=lambda_.Code.from_asset(
                stage_lambda_code(code, vendored=vendored, models_file=models_file)
            ),
            environment=env,
            timeout=timeout,
            memory_size=memory_mib,
            layers=[layer],
            tracing=lambda_.Tracing.ACTIVE if tracing else lambda_.Tracing.DISABLED,
            reserved_concurrent_executions=reserved_concurrency or None,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            description=description or f"asyncinfer {service}",
        )
