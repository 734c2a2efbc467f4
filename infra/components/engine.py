"""The engine container of an ``openai-server`` entry with ``engine.image`` (issue 16): a second
container of the worker's ECS task that runs the OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp) on the task's GPUs, which the worker container feeds over the task's bridge network
(``http://engine:8000``, a container link).

* GPUs: the entry's ``compute.gpus``, reserved for the engine container (the worker has none).
* Command: the entry's ``engine.args``, plus vLLM's ``--tensor-parallel-size N`` for
  ``tensor_parallel: N > 1`` unless the args already set a tensor-parallel flag (SGLang's
  ``--tp``, TGI's ``--num-shard``: name it in ``args`` for those engines).
* Shared memory (``linuxParameters.sharedMemorySize``): :func:`shared_memory_mib`; NCCL's
  intra-node transport between tensor-parallel ranks uses ``/dev/shm`` (vLLM's docs, "Using
  Docker": ``--ipc=host`` or ``--shm-size``).
* Health check: ``GET /health`` on port 8000, with the longest start period ECS allows
  (:data:`HEALTH_START_PERIOD_SECONDS`) and :data:`HEALTH_RETRIES` retries, so that loading the
  weights of a large model is not taken for a failure; the worker container starts once the
  engine is ``HEALTHY`` (``dependsOn``), and the worker itself waits for ``/health`` too.
* Weights: for an ``s3://`` source, a ``weights`` container (the AWS CLI image) runs
  ``aws s3 sync`` of that prefix into the instance's one weights cache (:func:`engine_weights_path`:
  ``/var/cache/asyncinfer/engine/<model>``, beside the worker's own downloads under
  ``/var/cache/asyncinfer/s3/``; mounted at ``/weights``; kept across tasks, so a later task
  copies only what changed), and the engine starts after it succeeded;
  ``ASYNCINFER_WEIGHTS_DIR=/weights`` tells the engine's args where (e.g. ``args: [--model,
  /weights, --served-model-name, llama-3.1-8b]``).
* Image pull: an ``engine.image`` in private Amazon ECR gets the task execution role's right to
  pull it (:func:`engine_image`: the pull actions on exactly its repository), as ECS pulls
  with that role (Amazon ECS Developer Guide, "Task execution IAM role"); a public image needs
  none.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs

from asyncinfer.core import envvars as ev
from infra.components.ecr_images import is_ecr_image, repository_arn, split_image
from infra.components.ecs_instances import WEIGHTS_CACHE_PATH
from infra.model_compute import ModelCompute

#: The port the engine serves on inside the task (vLLM's, SGLang's and TGI's images' default
#: or set with ``--port``).
ENGINE_PORT = 8000
#: ECS's largest health check start period, seconds (ECS API reference, "HealthCheck").
HEALTH_START_PERIOD_SECONDS = 300
#: Health checks during and after the start period: with 30 s apart, the engine has the start
#: period plus 10 x 30 s (10 minutes in all) to load its weights.
HEALTH_INTERVAL_SECONDS = 30
HEALTH_RETRIES = 10
#: The AWS CLI image that copies the weights (public ECR, AWS's own).
AWS_CLI_IMAGE = "public.ecr.aws/aws-cli/aws-cli:2.22.35"
#: Tensor-parallel flags of the engines we know; when ``args`` has one, none is added.
TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp", "--tp-size", "--num-shard")
WEIGHTS_DIR = "/weights"
#: The folder of :data:`~infra.components.ecs_instances.WEIGHTS_CACHE_PATH` that holds the
#: engines' synced weights, one subfolder per model (issue 13: one weights cache per instance).
ENGINE_WEIGHTS_FOLDER = "engine"


def engine_weights_path(model: str) -> str:
    """Where on the instance the ``weights`` container syncs ``model``'s ``s3://`` source:
    ``/var/cache/asyncinfer/engine/<model>``, in the instance's weights cache (the worker's own
    downloads are under ``/var/cache/asyncinfer/s3/``, :mod:`asyncinfer.models.weights`)."""
    return f"{WEIGHTS_CACHE_PATH}/{ENGINE_WEIGHTS_FOLDER}/{model}"


def shared_memory_mib(tensor_parallel: int) -> int:
    """``/dev/shm`` of the engine container, MiB: 2 GiB, plus 8 GiB per GPU for a tensor-parallel
    engine (NCCL buffers and the engine's worker processes' shared tensors)."""
    return 2048 if tensor_parallel <= 1 else 2048 + 8192 * tensor_parallel


def engine_command(args: list[str], tensor_parallel: int) -> list[str]:
    """The engine container's command: ``args`` with ``--tensor-parallel-size N`` added for a
    multi-GPU engine whose args set no tensor-parallel flag."""
    has_flag = any(a.split("=", 1)[0] in TP_FLAGS for a in args)
    if tensor_parallel > 1 and not has_flag:
        return [*args, "--tensor-parallel-size", str(tensor_parallel)]
    return list(args)


def engine_image(task_def: ecs.TaskDefinition, model: str, image: str) -> ecs.ContainerImage:
    """The engine's container image: for a private ECR ``image``, CDK's
    ``ContainerImage.from_ecr_repository`` of the imported repository, which grants the task
    execution role the pull actions on exactly that repository (and
    ``ecr:GetAuthorizationToken``, which takes no resource); any other registry by name."""
    if not is_ecr_image(image):
        return ecs.ContainerImage.from_registry(image)
    name, ref = split_image(image)
    repository = ecr.Repository.from_repository_attributes(
        task_def,
        f"{model}-engine-repository",
        repository_arn=repository_arn(image),
        repository_name=name,
    )
    return ecs.ContainerImage.from_ecr_repository(repository, ref)


def add_engine(
    task_def: ecs.Ec2TaskDefinition,
    worker: ecs.ContainerDefinition,
    *,
    model: str,
    compute: ModelCompute,
    memory_reservation_mib: int,
    log_group: logs.ILogGroup,
    environment: Mapping[str, str] | None = None,
) -> ecs.ContainerDefinition:
    """Add the engine (and, for an ``s3://`` source, the weights copy) to ``task_def`` and make
    ``worker`` start after the engine is healthy. Returns the engine container."""
    engine = compute.engine
    assert engine is not None and engine.image
    env = {ev.ENGINE_MODEL_ID: model, **(environment or {})}
    mounts: list[ecs.MountPoint] = []
    prefixes = compute.weight_prefixes
    if prefixes:
        task_def.add_volume(name="weights", host=ecs.Host(source_path=engine_weights_path(model)))
        mounts = [
            ecs.MountPoint(container_path=WEIGHTS_DIR, source_volume="weights", read_only=False)
        ]
        env[ev.ENGINE_WEIGHTS_DIR] = WEIGHTS_DIR
    container = task_def.add_container(
        "engine",
        image=engine_image(task_def, model, engine.image),
        command=engine_command(engine.args, engine.tensor_parallel) or None,
        gpu_count=compute.gpus or None,
        memory_reservation_mib=memory_reservation_mib,
        environment=env,
        linux_parameters=ecs.LinuxParameters(
            task_def,
            f"{model}-engine-linux",
            shared_memory_size=shared_memory_mib(engine.tensor_parallel),
        ),
        health_check=ecs.HealthCheck(
            command=["CMD-SHELL", f"curl -fs http://localhost:{ENGINE_PORT}/health || exit 1"],
            interval=Duration.seconds(HEALTH_INTERVAL_SECONDS),
            timeout=Duration.seconds(10),
            retries=HEALTH_RETRIES,
            start_period=Duration.seconds(HEALTH_START_PERIOD_SECONDS),
        ),
        logging=ecs.LogDrivers.aws_logs(stream_prefix=f"{model}-engine", log_group=log_group),
        essential=True,
    )
    if mounts:
        container.add_mount_points(*mounts)
        bucket, prefix = prefixes[0]
        copy = task_def.add_container(
            "weights",
            image=ecs.ContainerImage.from_registry(AWS_CLI_IMAGE),
            command=["s3", "sync", f"s3://{bucket}/{prefix}", WEIGHTS_DIR, "--only-show-errors"],
            memory_reservation_mib=512,
            essential=False,
            logging=ecs.LogDrivers.aws_logs(stream_prefix=f"{model}-weights", log_group=log_group),
        )
        copy.add_mount_points(*mounts)
        container.add_container_dependencies(
            ecs.ContainerDependency(
                container=copy, condition=ecs.ContainerDependencyCondition.SUCCESS
            )
        )
    worker.add_link(container, "engine")
    worker.add_container_dependencies(
        ecs.ContainerDependency(
            container=container, condition=ecs.ContainerDependencyCondition.HEALTHY
        )
    )
    return container
