"""An outside fuzzer finds nothing (issue 17): schemathesis runs every check in every phase
(examples, coverage, fuzzing, stateful along the document's links) on every ``/v1`` operation of
the local stack's OpenAPI document, with a fixed seed and a bounded number of examples, and any
failure fails the test. See :mod:`tests.contract.fuzz` for the few rules the run is told about."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncinfer.local.stack import free_port
from tests.contract.fuzz import fuzz, prepare
from tests.e2e.conftest import local_stack

pytestmark = pytest.mark.e2e

SEED = 20261201
MAX_EXAMPLES = 25


@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    with local_stack(tmp_path / "state", "--models", "echo") as stack:
        fixtures = prepare(stack.api, stack.key, free_port())
        problems = fuzz(stack.api, stack.key, fixtures, seed=SEED, max_examples=MAX_EXAMPLES)
    assert not problems, f"{len(problems)} problems:\n\n" + "\n\n".join(problems)
