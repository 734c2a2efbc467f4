"""A Python Lambda function of this project: code assembled from the repository (no Docker),
Powertools from its published layer, X-Ray tracing, a log group with retention."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.lambda_code import stage_lambda_code

#: The Lambda runtime; the Powertools layer is built per Python version (``python312``).
RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.ARM_64
#: Account that publishes the Powertools for AWS Lambda (Python) v3 layers (Powertools docs,
#: "Lambda Layer": arn:aws:lambda:{region}:017000801446:layer:AWSLambdaPowertoolsPythonV3-...).
POWERTOOLS_ACCOUNT = "017000801446"
METRICS_NAMESPACE = "asyncinfer"


def powertools_layer_arn(version: int) -> str:
    """ARN of the published Powertools v3 layer for python3.12/arm64 in the stack's region."""
    return (
        f"arn:{Aws.PARTITION}:lambda:{Aws.REGION}:{POWERTOOLS_ACCOUNT}:layer:"
        f"AWSLambdaPowertoolsPythonV3-python312-arm64:{version}"
    )


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
            **environment,
        }
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler="app.handler",
            code=lambda_.Code.from_asset(stage_lambda_code(code, vendored=vendored)),
            environment=env,
            timeout=timeout,
            memory_size=memory_mib,
            layers=[layer],
            tracing=lambda_.Tracing.ACTIVE,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            description=description or f"asyncinfer {service}",
        )
