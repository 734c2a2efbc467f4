"""CDK: ``openai-server`` entries with ``engine.image`` on SageMaker (issue 16): the async
endpoint's model is the engine's container (AWS's LMI / TGI / TEI by ``aws:NAME``, resolved at
synth by the sagemaker SDK: per region, or the stack's region's; or the entry's own ECR image),
its environment the entry's args as that container reads them with the tensor-parallel degree,
the model data the entry's S3 source, the instance type the entry's; the bridge and completion
know which models are engine entries."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from asyncinfer.models.catalogue import parse_catalogue
from infra.components import sagemaker_engine as se
from tests.infra.conftest import Synth, synth


@pytest.fixture(scope="module")
def sm(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("openai-engine-sagemaker", tmp_path_factory.mktemp("cdk-openai-engine-sm"))


@pytest.fixture(scope="module")
def sm_eu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same catalogue's template in a stack that names its account and region (eu-west-1;
    ``CDK_DEFAULT_ACCOUNT`` / ``CDK_DEFAULT_REGION``, as ``cdk synth`` with credentials sets)."""
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from infra.app import build_app, feature_flags
    from tests.infra.conftest import DOCKERFILE, VARIANTS

    context = {
        **feature_flags(),
        "worker_dockerfile": DOCKERFILE,
        **VARIANTS["openai-engine-sagemaker"],
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CDK_DEFAULT_ACCOUNT", "111122223333")
        mp.setenv("CDK_DEFAULT_REGION", "eu-west-1")
        app = cdk.App(context=context, outdir=str(tmp_path_factory.mktemp("cdk-engine-sm-eu")))
        _, stack = build_app(app)
        template: dict[str, Any] = Template.from_stack(stack).to_json()
    return template


def retrieve(name: str, region: str, version: str) -> str:
    """The sagemaker SDK's own answer (what the template must hold)."""
    from sagemaker.core import image_uris

    return str(image_uris.retrieve(name, region=region, version=version))


def model_of(s: Synth, model: str) -> dict[str, Any]:
    """The ``AWS::SageMaker::Model`` properties of ``model``'s endpoint."""
    for m in s.props("AWS::SageMaker::Model"):
        if m["PrimaryContainer"]["Environment"].get("ASYNCINFER_MODEL_ID") == model:
            return m
    raise AssertionError(f"no SageMaker model for {model}")


def mapped(s: Synth, value: Any, region: str = "us-east-1") -> Any:
    """A ``Fn::FindInMap`` value as it resolves in ``region``."""
    name, _, key = value["Fn::FindInMap"]
    assert _ == {"Ref": "AWS::Region"}
    return s.template["Mappings"][name][region][key]


def test_the_lmi_endpoint_runs_the_lmi_image_of_the_region(sm: Synth) -> None:
    c = model_of(sm, "llama-8b")["PrimaryContainer"]
    uri = mapped(sm, c["Image"])
    assert uri.startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:")
    assert "0.31.0" in uri
    assert mapped(sm, c["Image"], "eu-west-1").split(".")[3] == "eu-west-1"


def test_the_region_mapping_is_the_sdks_answer_for_every_region(sm: Synth) -> None:
    for model, name, version in (
        ("llama-8b", "djl-lmi", "0.31.0"),
        ("llama-70b", "huggingface-llm", "3.0.1"),
        ("bge-small", "huggingface-tei", "1.4.0"),
    ):
        image = model_of(sm, model)["PrimaryContainer"]["Image"]
        table = sm.template["Mappings"][image["Fn::FindInMap"][0]]
        assert {"us-east-1", "eu-west-1", "cn-north-1"} <= set(table)
        for region, row in table.items():
            assert row["uri"] == retrieve(name, region, version), (model, region)


def test_a_stack_that_names_its_region_gets_that_regions_uri(sm_eu: dict[str, Any]) -> None:
    models = {
        m["Properties"]["PrimaryContainer"]["Environment"]["ASYNCINFER_MODEL_ID"]: m["Properties"]
        for m in sm_eu["Resources"].values()
        if m["Type"] == "AWS::SageMaker::Model"
    }
    lmi = retrieve("djl-lmi", "eu-west-1", "0.31.0")
    assert models["llama-8b"]["PrimaryContainer"]["Image"] == lmi
    tgi = retrieve("huggingface-llm", "eu-west-1", "3.0.1")
    assert models["llama-70b"]["PrimaryContainer"]["Image"] == tgi
    tables = sm_eu.get("Mappings", {}).values()
    assert not any("uri" in row for t in tables for row in t.values())  # no region table
    policies = json.dumps(
        [r["Properties"] for r in sm_eu["Resources"].values() if r["Type"] == "AWS::IAM::Policy"]
    )
    account = lmi.split(".")[0]
    assert f"arn:aws:ecr:eu-west-1:{account}:repository/djl-inference" in policies


def test_the_entry_args_are_the_lmi_environment_with_the_tensor_parallel_degree(sm: Synth) -> None:
    env = model_of(sm, "llama-8b")["PrimaryContainer"]["Environment"]
    assert env["OPTION_TENSOR_PARALLEL_DEGREE"] == "1"
    assert env["OPTION_MAX_MODEL_LEN"] == "8192"
    assert env["OPTION_MAX_ROLLING_BATCH_SIZE"] == "32"
    assert env["OPTION_ENFORCE_EAGER"] == "true"  # a flag without a value
    assert env["HF_MODEL_ID"] == "/opt/ml/model"  # where SageMaker puts the S3 source
    assert "ASYNCINFER_TABLE" not in env  # not our worker's settings


def test_the_model_data_is_the_entrys_s3_source(sm: Synth) -> None:
    c = model_of(sm, "llama-8b")["PrimaryContainer"]
    assert c["ModelDataSource"]["S3DataSource"] == {
        "S3Uri": "s3://acme-weights/llama-3.1-8b-instruct/",
        "S3DataType": "S3Prefix",
        "CompressionType": "None",
    }
    assert "ModelDataSource" not in model_of(sm, "llama-70b")["PrimaryContainer"]


def test_the_tgi_endpoint_shards_over_the_gpus_and_serves_the_chat_schema(sm: Synth) -> None:
    c = model_of(sm, "llama-70b")["PrimaryContainer"]
    assert "huggingface-pytorch-tgi-inference" in mapped(sm, c["Image"])
    env = c["Environment"]
    assert env["SM_NUM_GPUS"] == "8"
    assert env["MESSAGES_API_ENABLED"] == "true"
    assert env["HF_MODEL_ID"] == "meta-llama/Llama-3.1-70B-Instruct"
    assert env["MAX_TOTAL_TOKENS"] == "8192"
    assert env["HF_TOKEN_SECRET"] == "hf"  # NAME=value as it is


def test_the_instance_type_and_a_long_start_are_the_variants(sm: Synth) -> None:
    types = {
        json.dumps(c["ProductionVariants"][0]["ModelName"]): c["ProductionVariants"][0]
        for c in sm.props("AWS::SageMaker::EndpointConfig")
    }
    variants = list(types.values())
    assert {v["InstanceType"] for v in variants} == {
        "ml.g6e.xlarge",
        "ml.p4d.24xlarge",
        "ml.g6.xlarge",
    }
    for v in variants:
        assert v["ContainerStartupHealthCheckTimeoutInSeconds"] == 3600
        assert v["ModelDataDownloadTimeoutInSeconds"] == 3600


def test_tei_embeddings_and_an_own_ecr_image(sm: Synth) -> None:
    tei = model_of(sm, "bge-small")["PrimaryContainer"]
    assert mapped(sm, tei["Image"]).split("/")[1].startswith("tei")
    assert tei["Environment"]["HF_MODEL_ID"] == "/opt/ml/model"
    own = model_of(sm, "own-engine")["PrimaryContainer"]
    assert own["Image"] == "123456789012.dkr.ecr.eu-west-1.amazonaws.com/my-engine:1.2"
    assert own["Environment"] == {"ASYNCINFER_MODEL_ID": "own-engine", "MAX_MODEL_LEN": "4096"}


def test_the_bridge_and_completion_know_the_engine_entries(sm: Synth) -> None:
    fns = sm.props("AWS::Lambda::Function")
    for name in ("sagemaker-bridge", "sagemaker-completion"):
        (fn,) = [
            f
            for f in fns
            if f.get("Environment", {}).get("Variables", {}).get("POWERTOOLS_SERVICE_NAME") == name
        ]
        engines = json.loads(fn["Environment"]["Variables"]["ASYNCINFER_SAGEMAKER_ENGINES"])
        assert engines == {
            "llama-8b": "chat",
            "llama-70b": "chat",
            "bge-small": "embeddings",
            "own-engine": "chat",
        }


def test_the_execution_role_may_pull_the_engine_image(sm: Synth) -> None:
    text = json.dumps(sm.props("AWS::IAM::Policy"))
    assert "ecr:BatchGetImage" in text
    own = "arn:aws:ecr:eu-west-1:123456789012:repository/my-engine"
    assert own in text  # the own image's repository
    name = model_of(sm, "llama-8b")["PrimaryContainer"]["Image"]["Fn::FindInMap"][0]
    lmi = {"Fn::FindInMap": [name, {"Ref": "AWS::Region"}, "repository"]}
    assert json.dumps(lmi) in text  # the LMI repository of the stack's region
    assert mapped(sm, lmi).endswith(":repository/djl-inference")


# ---------------------------------------------------------------------------- the rules


def computes(entry: dict[str, Any], backend: str | None = None) -> Any:
    from infra.model_compute import resolve

    cat = parse_catalogue({"models": [entry]})
    values = {"compute": "ecs", "instance_type": "g5.xlarge", "gpu": True, "min_workers": 0}
    values |= {"max_workers": 1, "backlog_per_worker": 5.0}
    explicit = {"compute"} if backend else set()
    if backend:
        values["compute"] = backend
    return resolve(cat, [entry["id"]], values, explicit)


def problems_of(entry: dict[str, Any], backend: str | None = None) -> list[str]:
    from infra.config import GPU_FAMILIES
    from infra.model_compute import problems

    return problems(computes(entry, backend), GPU_FAMILIES)


LMI = {
    "id": "m",
    "kind": "openai-server",
    "engine": {"image": "aws:djl-lmi", "version": "0.31.0", "model": "x"},
    "compute": {"backend": "sagemaker", "instance_type": "g6e.xlarge"},
}


def test_an_aws_container_is_for_sagemaker_only() -> None:
    assert problems_of(LMI) == []
    (p,) = problems_of(LMI, backend="ecs")
    assert p.startswith("m: engine.image aws:djl-lmi") and "sagemaker" in p


def test_an_own_image_on_sagemaker_is_in_ecr_and_takes_environment_args() -> None:
    own = {**LMI, "engine": {"image": "vllm/vllm-openai:v0.8.5", "model": "x", "args": ["--x"]}}
    found = problems_of(own)
    assert any("must be in Amazon ECR" in p for p in found)
    assert any("NAME=value" in p for p in found)


def test_an_unknown_version_names_the_container_and_version() -> None:
    with pytest.raises(RuntimeError, match=r"aws:djl-lmi version 0\.0\.1.*0\.31\.0"):
        se.aws_image_uris("djl-lmi", "0.0.1")


def test_the_catalogue_checks_aws_names_and_versions() -> None:
    from asyncinfer.core.errors import CatalogueError

    bad = [
        {**LMI, "id": "a", "engine": {"image": "aws:nope", "version": "1", "model": "x"}},
        {**LMI, "id": "b", "engine": {"image": "aws:djl-lmi", "model": "x"}},
        {**LMI, "id": "c", "engine": {"image": "repo/x:1", "version": "1", "model": "x"}},
        {**LMI, "id": "d", "engine": {"image": "repo/x:1", "model": "x", "api": "vectors"}},
    ]
    with pytest.raises(CatalogueError) as err:
        parse_catalogue({"models": bad})
    text = str(err.value)
    assert "models[0].engine.image: unknown AWS container 'nope'" in text
    assert "models[1].engine.version: required with image aws:djl-lmi" in text
    assert "models[2].engine.version: only with an image aws:NAME" in text
    assert "models[3].engine.api" in text


def test_lmi_args_become_options_and_tgi_args_their_variables() -> None:
    assert se.parse_args(["--a", "1", "--b", "--c=3", "X_Y=z", "pos"]) == (
        {"X_Y": "z"},
        [("--a", "1"), ("--b", "true"), ("--c", "3")],
        ["pos"],
    )
    assert (
        se.family_of("763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.31.0-lmi")
        == se.LMI
    )
    assert se.family_of("aws:huggingface-llm") == se.TGI
    assert se.family_of("123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1") == se.OWN


def test_neither_the_lambdas_nor_the_worker_image_get_the_sdk(sm: Synth) -> None:
    """The SDK resolves images at synth only (the ``cdk`` extra)."""
    assets = [p.parent for p in sm.outdir.glob("asset.*/app.py")]
    assert assets  # the stack's Lambda code assets
    for asset in assets:
        assert not (asset / "sagemaker").exists(), asset
        for py in (asset / "asyncinfer").rglob("*.py"):
            assert not re.search(r"^\s*(from|import) sagemaker\b", py.read_text(), re.M), py
    from tests.infra.conftest import ROOT

    dockerfile = (ROOT / "container" / "Dockerfile").read_text()
    assert "'.[worker]'" in dockerfile and "[cdk]" not in dockerfile
    assert "sagemaker" not in (ROOT / "container" / "constraints.txt").read_text()
