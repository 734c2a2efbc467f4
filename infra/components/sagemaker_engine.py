"""``compute.backend: sagemaker`` for an ``openai-server`` entry with ``engine.image`` (issue 16):
the async endpoint's container is the engine itself, configured the way SageMaker's LMI and TGI
users configure it, not our worker image.

* **Image**: ``aws:djl-lmi`` (LMI: DJL Serving with vLLM / lmi-dist), ``aws:huggingface-llm``
  (TGI) or ``aws:huggingface-tei`` (TEI, embeddings) with ``engine.version``, resolved at synth
  by the ``sagemaker`` SDK (:mod:`infra.sagemaker_images`: ``image_uris.retrieve``, offline):
  the stack's region's URI when the stack names one, else a ``CfnMapping`` of every region the
  SDK lists, looked up with ``AWS::Region``; or an image URI in Amazon ECR (an AWS container
  by its URI, or the entry's own image, which must serve SageMaker's container contract: ``GET
  /ping`` and ``POST /invocations`` on 8080, taking the bodies of
  :mod:`asyncinfer.models.openai_server.invocations`). SageMaker pulls from ECR only.
* **Environment** (:func:`engine_environment`): the entry's ``args`` as the container reads its
  settings. LMI (djl-serving, "Container and Model Configurations": ``option.<key>`` is the
  variable ``OPTION_<KEY>``): ``--max-model-len 8192`` -> ``OPTION_MAX_MODEL_LEN=8192``,
  ``OPTION_TENSOR_PARALLEL_DEGREE`` from ``tensor_parallel``, ``HF_MODEL_ID`` the model (for an
  ``s3://`` source ``/opt/ml/model``, where SageMaker puts it), ``OPTION_TASK=text-embedding``
  for ``api: embeddings``. TGI (its launcher reads each flag from the variable of its name):
  ``--max-total-tokens 4096`` -> ``MAX_TOTAL_TOKENS=4096``, ``SM_NUM_GPUS`` from
  ``tensor_parallel``, ``HF_MODEL_ID``, ``MESSAGES_API_ENABLED=true`` (chat schema on
  ``/invocations``). TEI likewise (``HF_MODEL_ID``). An arg ``NAME=value`` is set as it is
  (any container; the only form an own image takes, since SageMaker runs its ``serve``).
* **Model data**: an ``s3://`` source is the model's ``ModelDataSource`` (uncompressed
  ``S3Prefix``), which SageMaker copies to ``/opt/ml/model`` before the container starts; the
  execution role reads exactly that prefix.
* **Instance**: ``ml.`` + ``compute.instance_type``; the GPUs are the instance's, used by the
  engine as ``tensor_parallel`` says. Model download and container start may take up to
  :data:`STARTUP_TIMEOUT_SECONDS` each (SageMaker's most), so a large model's load is not taken
  for a failure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aws_cdk import Aws, CfnMapping, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from asyncinfer.core import envvars as ev
from asyncinfer.models.catalogue import AWS_IMAGE_PREFIX, Engine
from infra import sagemaker_images as images
from infra.components.ecr_images import ECR_IMAGE, PULL_ACTIONS, repository_arn
from infra.model_compute import ModelCompute

LMI, TGI, TEI, OWN = "lmi", "tgi", "tei", "own"
#: The container family of each ``aws:NAME`` (:data:`asyncinfer.models.catalogue.AWS_IMAGES`).
AWS_FAMILIES = {"djl-lmi": LMI, "huggingface-llm": TGI, "huggingface-tei": TEI}
#: Where SageMaker puts the model data in the container.
MODEL_DIR = "/opt/ml/model"
#: SageMaker's largest ModelDataDownloadTimeoutInSeconds and
#: ContainerStartupHealthCheckTimeoutInSeconds (ProductionVariant, 60..3600).
STARTUP_TIMEOUT_SECONDS = 3600
#: Flags that name the model or the tensor-parallel degree: set from the entry instead.
MODEL_FLAGS = ("--model", "--model-id", "--model-path")
TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp", "--tp-size", "--num-shard")
_ENV_ARG = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$", re.DOTALL)


def family_of(image: str) -> str:
    """``lmi``, ``tgi``, ``tei`` or ``own`` for an ``engine.image`` (``aws:NAME``, or an AWS
    container by its repository name: ``djl-inference``, ``huggingface-pytorch-tgi-inference``,
    ``tei`` / ``tei-cpu``)."""
    if image.startswith(AWS_IMAGE_PREFIX):
        return AWS_FAMILIES[image[len(AWS_IMAGE_PREFIX) :]]
    repo = image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]
    if repo.startswith("djl-inference"):
        return LMI
    if "tgi-inference" in repo or repo.startswith("text-generation-inference"):
        return TGI
    if repo in ("tei", "tei-cpu") or repo.startswith("text-embeddings-inference"):
        return TEI
    return OWN


def parse_args(args: list[str]) -> tuple[dict[str, str], list[tuple[str, str]], list[str]]:
    """``(NAME=value assignments, [(--flag, value)], positional args)`` of ``engine.args``; a
    flag without a value is ``"true"``."""
    env: dict[str, str] = {}
    flags: list[tuple[str, str]] = []
    loose: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        m = _ENV_ARG.match(a)
        if m:
            env[m.group(1)] = m.group(2)
        elif a.startswith("-"):
            name, eq, value = a.partition("=")
            if not eq:
                nxt = args[i + 1] if i + 1 < len(args) else None
                if nxt is not None and not nxt.startswith("-") and not _ENV_ARG.match(nxt):
                    value, i = nxt, i + 1
                else:
                    value = "true"
            flags.append((name, value))
        else:
            loose.append(a)
        i += 1
    return env, flags, loose


def _var(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_").upper()


def engine_environment(model: str, compute: ModelCompute) -> dict[str, str]:
    """The endpoint container's environment for an engine entry (see the module docstring)."""
    engine = compute.engine
    assert engine is not None and engine.image
    family = family_of(engine.image)
    assigned, flags, _ = parse_args(engine.args)
    given = dict(flags)
    model_id = (
        MODEL_DIR
        if compute.weight_prefixes
        else next((given[f] for f in MODEL_FLAGS if f in given), engine.model)
    )
    tp = str(engine.tensor_parallel)
    env: dict[str, str] = {ev.ENGINE_MODEL_ID: model}
    if family == OWN:
        if compute.weight_prefixes:
            env[ev.ENGINE_WEIGHTS_DIR] = MODEL_DIR
        return {**env, **assigned}
    env["HF_MODEL_ID"] = model_id
    rest = [(f, v) for f, v in flags if f not in MODEL_FLAGS and f not in TP_FLAGS]
    if family == LMI:
        env["OPTION_TENSOR_PARALLEL_DEGREE"] = tp
        if engine.api == "embeddings":
            env["OPTION_TASK"] = "text-embedding"
        env.update({f"OPTION_{_var(f)}": v for f, v in rest})
    else:
        if family == TGI:
            env["SM_NUM_GPUS"] = tp
            env["MESSAGES_API_ENABLED"] = "true"
        env.update({_var(f): v for f, v in rest})
    return {**env, **assigned}


def engine_problems(model: str, compute: ModelCompute) -> list[str]:
    """What stops an engine entry from deploying on ``compute.backend`` (each naming the model):
    an ``aws:`` image on ECS (those containers serve SageMaker's contract), and on SageMaker an
    ``aws:`` image the ``sagemaker`` SDK cannot resolve (not installed, or an
    ``engine.version`` it does not know: :func:`infra.sagemaker_images.image_problems`), an
    image outside ECR, or args its container cannot take."""
    engine = compute.engine
    if engine is None or not engine.image:
        return []
    out: list[str] = []
    aws = engine.image.startswith(AWS_IMAGE_PREFIX)
    if compute.backend == "ecs":
        if aws:
            out.append(
                f"{model}: engine.image {engine.image} is one of AWS's SageMaker containers; "
                "use compute.backend: sagemaker, or an OpenAI-compatible server image on ECS"
            )
        return out
    _, flags, loose = parse_args(engine.args)
    if engine.aws_image is not None:
        out.extend(images.image_problems(model, engine.aws_image, engine.version))
    if not aws and not ECR_IMAGE.match(engine.image):
        out.append(
            f"{model}: an openai-server engine.image on SageMaker must be in Amazon ECR (an "
            f"endpoint pulls from ECR only), not {engine.image!r}: push it there, use an "
            "aws:NAME container (aws:djl-lmi, aws:huggingface-llm), or compute.backend: ecs"
        )
    if loose:
        out.append(f"{model}: engine.args {loose[0]!r} is neither --flag nor NAME=value")
    if family_of(engine.image) == OWN and flags:
        out.append(
            f"{model}: engine.args {flags[0][0]!r}: SageMaker starts the image's own `serve`, "
            "with no command line; give its settings as NAME=value environment args"
        )
    return out


def sagemaker_engines(computes: Mapping[str, ModelCompute]) -> dict[str, str]:
    """``{model: engine.api}`` of the models whose endpoint runs their engine image
    (``ASYNCINFER_SAGEMAKER_ENGINES``)."""
    return {
        m: c.engine.api
        for m, c in computes.items()
        if c.backend == "sagemaker" and c.engine is not None and c.engine.image
    }


def aws_image_uris(name: str, version: str) -> dict[str, str]:
    """``{region: image URI}`` of AWS container ``name`` at ``version``, from the ``sagemaker``
    SDK (:func:`infra.sagemaker_images.region_uris`).

    Raises:
        ImageError: no SDK, or a version it does not know (naming the known ones).
    """
    return images.region_uris(name, version)


def engine_image(scope: Construct, engine: Engine) -> tuple[str, str]:
    """``(image URI, its ECR repository ARN)`` of an engine entry in ``scope``'s stack: an
    ``aws:NAME`` through a ``CfnMapping`` of every region (or that region's URI when the stack's
    region is known at synth)."""
    assert engine.image
    name = engine.aws_image
    if name is None:
        return engine.image, repository_arn(engine.image)
    version = engine.version or ""
    stack = Stack.of(scope)
    if not Token.is_unresolved(stack.region):
        uri = images.region_uri(name, version, stack.region)
        return uri, repository_arn(uri)
    mid = "EngineImage" + re.sub(r"[^A-Za-z0-9]", "", f"{name}{version}".title())
    mapping = stack.node.try_find_child(mid)
    if not isinstance(mapping, CfnMapping):
        uris = aws_image_uris(name, version)
        mapping = CfnMapping(
            stack,
            mid,
            mapping={r: {"uri": u, "repository": repository_arn(u)} for r, u in uris.items()},
        )
    return mapping.find_in_map(Aws.REGION, "uri"), mapping.find_in_map(Aws.REGION, "repository")


def engine_container(
    scope: Construct, model: str, compute: ModelCompute, role: iam.IRole
) -> sagemaker.CfnModel.ContainerDefinitionProperty:
    """The SageMaker model's primary container of an engine entry, and ``role``'s right to pull
    its image (``ecr:BatchGetImage`` and ``ecr:GetDownloadUrlForLayer`` on its repository)."""
    engine = compute.engine
    assert engine is not None
    image, repository = engine_image(scope, engine)
    iam.Grant.add_to_principal(
        grantee=role,
        actions=[
            *PULL_ACTIONS,
        ],
        resource_arns=[repository],
    )
    data = None
    if compute.weight_prefixes:
        bucket, prefix = compute.weight_prefixes[0]
        data = sagemaker.CfnModel.ModelDataSourceProperty(
            s3_data_source=sagemaker.CfnModel.S3DataSourceProperty(
                s3_uri=f"s3://{bucket}/{prefix}",
                s3_data_type="S3Prefix",
                compression_type="None",
            )
        )
    return sagemaker.CfnModel.ContainerDefinitionProperty(
        image=image,
        environment=engine_environment(model, compute),
        model_data_source=data,
    )
