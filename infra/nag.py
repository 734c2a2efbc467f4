"""cdk-nag (v3) AwsSolutions acknowledgements, each with its one-line reason.

cdk-nag v3 uses CDK's ``Validations.of(scope).acknowledge(Acknowledgment(id=..., reason=...))``;
the rules are in cdk-nag's RULES.md ("AwsSolutions"). Rules with several findings (IAM4, IAM5)
are acknowledged finding by finding (``RuleId[FindingId]``), so a new wildcard or managed policy
is reported, not silently accepted. Nothing acknowledged concerns data exposure or encryption.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Acknowledgment, CfnElement, Names, Stack, Validations
from constructs import IConstruct

from infra.components import bucket_access

#: rule id -> why this design accepts it (whole rules).
RULES: dict[str, str] = {
    "AwsSolutions-L1": (
        "Runtime pinned to python3.12 to match the published Powertools layer build "
        "(AWSLambdaPowertoolsPythonV3-python312); raise both together."
    ),
    "AwsSolutions-APIG2": (
        "The API Lambda validates every body with the model's pydantic schema and answers the "
        "contract's 422 error shape, which API Gateway request validation cannot produce."
    ),
    "AwsSolutions-APIG3": (
        "WAF can be switched off (lambda_body_guard=false, waf_max_body_kb=0) as it costs money "
        "at zero traffic; API keys, usage-plan throttling and quotas limit abuse."
    ),
    "AwsSolutions-APIG4": (
        "Authorization is by API key and usage plan as the HTTP contract specifies (tenant = API "
        "key id); /v1/health is public by contract."
    ),
    "AwsSolutions-COG4": "The contract authenticates with API keys (x-api-key), not Cognito.",
    "AwsSolutions-AS3": (
        "The GPU group is scaled by the ECS capacity provider and shown on the dashboard; "
        "per-event ASG notifications would only add noise."
    ),
    "AwsSolutions-ECS2": "Container environment holds only resource names and tuning numbers.",
    "AwsSolutions-ECS4": (
        "Container Insights is the container_insights setting, off by default as it bills per "
        "metric at zero traffic; the dashboard shows backlog, running tasks and job outcomes."
    ),
}

#: AWS managed policies attached on purpose (IAM4 findings).
MANAGED_POLICIES: dict[str, str] = {
    "service-role/AWSLambdaBasicExecutionRole": "Lambda's minimal policy for its own logs.",
    "service-role/AmazonAPIGatewayPushToCloudWatchLogs": "API Gateway's policy for its logs.",
    "service-role/AmazonEC2ContainerServiceforEC2Role": "AWS's policy for ECS container instances.",
    "AmazonSSMManagedInstanceCore": "Session Manager access (instance_ssm_access, off by default).",
}

#: Wildcard actions from CDK grant methods and AWS managed defaults (IAM5 findings).
WILDCARD_ACTIONS: dict[str, str] = {
    "s3:Abort*": "CDK grantReadWrite/grantPut action group, scoped to our bucket.",
    "s3:DeleteObject*": "CDK grantReadWrite/grantDelete action group, scoped to our bucket.",
    "s3:GetBucket*": "CDK grantRead action group, scoped to our bucket.",
    "s3:GetObject*": "CDK grantRead action group, scoped to our bucket.",
    "s3:List*": "CDK grantRead action group, scoped to our bucket.",
    "kms:GenerateDataKey*": "CDK grantPublish on the topics' own KMS key.",
    "ecs:Submit*": "CDK's container instance policy, scoped to this cluster.",
}


def _cfn(element: IConstruct) -> IConstruct:
    """The CloudFormation resource of a construct (itself if it is one)."""
    child = element.node.default_child if not isinstance(element, CfnElement) else element
    assert child is not None
    return child


def _lid(stack: Stack, element: IConstruct) -> str:
    """The logical id of a construct's CloudFormation resource, as cdk-nag prints it."""
    child = element.node.default_child if not isinstance(element, CfnElement) else element
    return str(stack.resolve(stack.get_logical_id(child)))  # type: ignore[arg-type]


def add_suppressions(
    stack: Stack,
    *,
    table: IConstruct,
    bucket: IConstruct,
    cluster: IConstruct | None = None,
    asg: IConstruct | None = None,
    asgs: Sequence[IConstruct] = (),
    weight_prefixes: Sequence[tuple[str, str]] = (),
) -> None:
    """Acknowledge, on ``stack``, the findings this design accepts.

    Args:
        table / bucket / cluster / asg / asgs: the constructs whose ARNs appear in wildcard
            resources.
        weight_prefixes: ``(bucket, prefix)`` of the catalogue's ``s3://`` sources (read grants
            on ``bucket/prefix*``, infra.model_compute).
    """
    acks: dict[str, str] = dict(RULES)
    for policy, reason in MANAGED_POLICIES.items():
        acks[f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]"] = reason
    for action, reason in WILDCARD_ACTIONS.items():
        acks[f"AwsSolutions-IAM5[Action::{action}]"] = reason
    t, b = _lid(stack, table), _lid(stack, bucket)
    resources = {
        "*": (
            "X-Ray, ECR auth token, metrics and DescribeAutoScalingGroups take no resource ARN "
            "(AWS service authorization reference)."
        ),
        f"<{t}.Arn>/index/*": "CDK table grants include the table's own indexes (tenant-index).",
        f"<{b}.Arn>/*": "Objects of our data bucket (CDK bucket grants).",
        f"<{b}.Arn>/inputs/*": "Objects under our bucket's inputs/ prefix only.",
        f"<{b}.Arn>/outputs/*": "Objects under our bucket's outputs/ prefix only.",
        f"<{b}.Arn>/uploads/*": "Objects under our bucket's uploads/ prefix (POST /v1/uploads).",
        f"<{b}.Arn>/{bucket_access.FILES}": "Objects under our bucket's OpenAI Files prefix only.",
        f"<{b}.Arn>/{bucket_access.CHUNKS}": (
            "Objects under our bucket's OpenAI batch chunks prefix only."
        ),
        "arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:"
        "/aws/sagemaker/Endpoints/*": "SageMaker endpoints' own log groups (SageMaker docs).",
    }
    prefix = getattr(stack, "prefix", "")
    arn = "arn:<AWS::Partition>:{}:<AWS::Region>:<AWS::AccountId>:"
    resources[f"{arn.format('sqs')}{prefix}jobs-*"] = (
        "Every model's job queues by the naming rule (asyncinfer.core.naming), one statement at "
        "any catalogue size; no other queue matches."
    )
    resources[f"{arn.format('sqs')}{prefix}dlq-*"] = (
        "Every model's dead-letter queue by the naming rule; no other queue matches."
    )
    if cluster is not None:
        c = _lid(stack, cluster)
        group = f"{arn.format('autoscaling')}autoScalingGroup:*:autoScalingGroupName/"
        for one in dict.fromkeys([*([asg] if asg is not None else []), *asgs]):
            resources[f"{group}<{_lid(stack, one)}>"] = (
                "A capacity group by name (its ARN holds a generated id): released at stack "
                "deletion."
            )
        resources[f"{arn.format('ecs')}service/<{c}>/{prefix}*"] = (
            "The worker services of this cluster by the naming rule (wake on submit, backlog)."
        )
        resources[f"arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:task/<{c}>/*"] = (
            "Task scale-in protection on tasks of this cluster only (task ids are not known)."
        )
    for wbucket, wprefix in weight_prefixes:
        resources[f"arn:<AWS::Partition>:s3:::{wbucket}/{wprefix}*"] = (
            "A catalogue entry's s3:// weights: read on exactly its source prefix (models.yaml)."
        )
    # In nested stacks (a large catalogue, infra.components.model_scopes) the same resources
    # appear through CDK's parameters: <lid.Arn> as <referenceto<unique id>Arn>, <lid> as
    # <referenceto<unique id>Ref>.
    ids = {_lid(stack, c): Names.unique_id(_cfn(c)) for c in (table, bucket, cluster) if c}
    for res, reason in list(resources.items()):
        nested = res
        for lid, uid in ids.items():
            nested = nested.replace(f"<{lid}.Arn>", f"<referenceto{uid}Arn>")
            nested = nested.replace(f"<{lid}>", f"<referenceto{uid}Ref>")
        resources.setdefault(nested, reason)
    for res, reason in resources.items():
        acks[f"AwsSolutions-IAM5[Resource::{res}]"] = reason
    Validations.of(stack).acknowledge(
        *(Acknowledgment(id=rule, reason=reason) for rule, reason in acks.items())
    )
