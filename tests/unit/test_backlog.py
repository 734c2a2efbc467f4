"""The backlog metric Lambda's measurement, against moto's SQS and ECS."""

from __future__ import annotations

import boto3
from moto import mock_aws

from asyncinfer.scaling.backlog import BacklogConfig, measure


@mock_aws
def test_priority_class_queues_add_up_per_model() -> None:
    sqs = boto3.client("sqs", region_name="us-east-1")
    ecs = boto3.client("ecs", region_name="us-east-1")
    urls = {
        key: sqs.create_queue(QueueName=key.replace("#", "-"))["QueueUrl"]
        for key in ("echo", "echo#high", "echo#low")
    }
    for key, n in (("echo", 2), ("echo#high", 1), ("echo#low", 3)):
        for i in range(n):
            sqs.send_message(QueueUrl=urls[key], MessageBody=str(i))
    sqs.receive_message(QueueUrl=urls["echo#low"], MaxNumberOfMessages=1)  # one in flight
    ecs.create_cluster(clusterName="c")
    ecs.register_task_definition(
        family="w", containerDefinitions=[{"name": "w", "image": "x", "memory": 128}]
    )
    ecs.create_service(cluster="c", serviceName="echo-svc", taskDefinition="w", desiredCount=0)
    config = BacklogConfig(
        queue_urls=urls, cluster="c", services={"echo": "echo-svc"}, region="us-east-1"
    )
    points = measure(config, sqs=sqs, ecs=ecs)
    assert set(points) == {"echo"}
    assert points["echo"]["Backlog"] == 6
    assert points["echo"]["BacklogWithoutCapacity"] == 1
    assert points["echo"]["RunningTasks"] == 0
