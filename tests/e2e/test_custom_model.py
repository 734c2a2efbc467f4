"""End to end: a custom ``python``-kind model from a catalogue passed with ``--models-file``
(``tests/custom_model/``: a handler module and a JSON Schema beside the catalogue)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e

CATALOGUE = Path(__file__).resolve().parents[1] / "custom_model" / "models.yaml"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackProcess]:
    with local_stack(
        tmp_path_factory.mktemp("state"),
        *("--models-file", str(CATALOGUE), "--models", "wordcount"),
    ) as s:
        yield s


def test_models_lists_the_catalogue_entry(stack: LocalStackProcess) -> None:
    with stack.client() as c:
        models = c.get("/v1/models").json()["models"]
    assert [m["id"] for m in models] == ["wordcount"]
    (wc,) = models
    assert wc["kind"] == "python" and wc["task"] == "custom" and wc["max_batch_size"] == 4
    assert wc["input_schema"]["required"] == ["text"]
    assert set(stack.local["queues"]) == {"wordcount", "wordcount#high", "wordcount#low"}


def test_custom_handler_runs_jobs_to_success(stack: LocalStackProcess) -> None:
    with stack.client() as c:
        ids = []
        for i in range(3):
            inp = {"text": f"the cat and the hat {i}", "top": 1}
            r = c.post("/v1/jobs", json={"model": "wordcount", "input": inp})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
    for job_id in ids:
        job = stack.wait_status(job_id, {"succeeded", "failed"}, timeout=180)
        assert job["status"] == "succeeded", job
        assert job["output"]["words"] == 4  # "the" is a stop word of the model's source folder
        assert job["output"]["top"] == [["cat", 1]]


def test_input_breaking_the_schema_is_422_naming_fields(stack: LocalStackProcess) -> None:
    with stack.client() as c:
        r = c.post("/v1/jobs", json={"model": "wordcount", "input": {"top": 99, "x": 1}})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_request"
        assert {d["field"] for d in err["details"]} == {"input.text", "input.top", "input.x"}
        # A model of the default catalogue that --models-file replaced is unknown here.
        r = c.post("/v1/jobs", json={"model": "smollm2-135m-instruct", "input": {"prompt": "x"}})
        assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "model"
