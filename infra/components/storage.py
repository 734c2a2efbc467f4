"""The job table and the data bucket."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_s3 as s3
from constructs import Construct

from asyncinfer.core import topology

#: Table design of :mod:`asyncinfer.jobs.store`: the topology's (:mod:`asyncinfer.core.topology`),
#: which the local stack creates too.
PARTITION_KEY = topology.JOB_TABLE.partition.name
TENANT_INDEX = topology.TENANT_INDEX
QUEUED_INDEX = topology.QUEUED_INDEX
RUNNING_INDEX = topology.RUNNING_INDEX
TTL_ATTRIBUTE = topology.JOB_TABLE.ttl_attribute
_TYPES = {"S": dynamodb.AttributeType.STRING, "N": dynamodb.AttributeType.NUMBER}
_PROJECTIONS = {"ALL": dynamodb.ProjectionType.ALL, "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY}


def _attribute(key: topology.Key) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=key.name, type=_TYPES[key.type])


#: Key prefixes of the bucket (:mod:`asyncinfer` writes inputs and outputs under these).
EXPIRING_PREFIXES = ("inputs/", "outputs/", "uploads/")


class JobTable(Construct):
    """The DynamoDB table of job records: on-demand, TTL on ``ttl``, point-in-time recovery,
    AWS-owned-key encryption, GSI ``tenant-index`` (``tenant`` S / ``job_id`` S, projection ALL),
    and the sparse GSI ``queued-expiry-index`` (``queued_mark`` S / ``expires_epoch`` N, keys
    only) that the expiry sweeper queries, and the sparse GSI ``running-lease-index``
    (``running_mark`` S / ``lease_expires_epoch`` N, keys only) where the sweeper finds running
    jobs whose lease lapsed (:mod:`asyncinfer.jobs.store`, :mod:`asyncinfer.jobs.leases`), and
    the sparse GSI ``outbox-index`` (``outbox_mark`` S / ``outbox_since`` N, keys only) where it
    finds job events still pending (:mod:`asyncinfer.jobs.outbox`).

    Args:
        removal_policy: RETAIN keeps the records when the stack is deleted.
    """

    def __init__(self, scope: Construct, id: str, *, removal_policy: RemovalPolicy) -> None:
        super().__init__(scope, id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=_attribute(topology.JOB_TABLE.partition),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=TTL_ATTRIBUTE,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            deletion_protection=removal_policy == RemovalPolicy.RETAIN,
            removal_policy=removal_policy,
        )
        for index in topology.JOB_TABLE.indexes:
            self.table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_attribute(index.partition),
                sort_key=_attribute(index.sort) if index.sort else None,
                projection_type=_PROJECTIONS[index.projection],
            )


class DataBucket(Construct):
    """The S3 bucket of large inputs and outputs: SSE-S3, block public access, TLS-only policy,
    objects owned by the bucket owner, server access logs to a second bucket, and expiry of
    ``inputs/``, ``outputs/`` and ``uploads/`` after ``expiry_days`` (plus cleanup of incomplete
    multipart uploads after one day).

    Args:
        expiry_days: days after creation that objects under the expiring prefixes are deleted.
        removal_policy: RETAIN keeps the buckets when the stack is deleted.
        auto_delete_objects: empty the buckets when the stack is deleted (CDK's auto-delete
            custom resource), so that deleting a stack that does not retain its data succeeds:
            CloudFormation cannot delete a bucket that holds objects.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        expiry_days: int,
        removal_policy: RemovalPolicy,
        auto_delete_objects: bool = False,
    ) -> None:
        super().__init__(scope, id)
        common = {
            "auto_delete_objects": auto_delete_objects,
            "encryption": s3.BucketEncryption.S3_MANAGED,
            "block_public_access": s3.BlockPublicAccess.BLOCK_ALL,
            "enforce_ssl": True,
            "object_ownership": s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            "removal_policy": removal_policy,
        }
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            lifecycle_rules=[s3.LifecycleRule(id="expire-logs", expiration=Duration.days(90))],
            **common,  # type: ignore[arg-type]
        )
        rules = [
            s3.LifecycleRule(
                id=f"expire-{p.rstrip('/')}", prefix=p, expiration=Duration.days(expiry_days)
            )
            for p in EXPIRING_PREFIXES
        ]
        rules.append(
            s3.LifecycleRule(
                id="abort-multipart", abort_incomplete_multipart_upload_after=Duration.days(1)
            )
        )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data/",
            lifecycle_rules=rules,
            **common,  # type: ignore[arg-type]
        )
