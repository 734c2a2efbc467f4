"""AWS limits and allowed values the deployment settings are checked against
(:mod:`infra.config_rules`), each with the AWS document it comes from."""

from __future__ import annotations

#: AWS WAF rate-based rule limits, requests per 5-minute window per IP (RateBasedStatement).
WAF_RATE_MIN, WAF_RATE_MAX = 10, 2_000_000_000

#: ECS task stopTimeout maximum, seconds (ECS task definition parameters, "stopTimeout").
ECS_MAX_STOP_TIMEOUT = 120
#: SQS visibility timeout range, seconds (SQS API reference, SetQueueAttributes).
SQS_MAX_VISIBILITY = 43_200
#: SQS maxReceiveCount range (SQS developer guide, "dead-letter queues").
SQS_MAX_RECEIVE_COUNT = 1000
#: Lambda guidance: a source queue's visibility timeout should be at least six times the function
#: timeout (Lambda developer guide, "Using Lambda with Amazon SQS").
SQS_LAMBDA_VISIBILITY_FACTOR = 6
#: SQS event source ScalingConfig MaximumConcurrency range is 2..1000 (Lambda API reference).
SQS_MAX_CONCURRENCY = 1000
#: SageMaker async MaxConcurrentInvocationsPerInstance range (API reference,
#: AsyncInferenceClientConfig: 1..1000).
SAGEMAKER_MAX_CONCURRENCY = 1000
#: Instance families with NVIDIA GPUs that the ECS GPU-optimised AMI (x86_64) supports.
GPU_FAMILIES = ("g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e")
#: API Gateway quota periods (UsagePlan QuotaSettings.Period).
QUOTA_PERIODS = ("DAY", "WEEK", "MONTH")
#: CloudWatch Logs retention values, days (PutRetentionPolicy).
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)
