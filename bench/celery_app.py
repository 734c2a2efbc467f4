"""The Celery baseline of ``bench/worker_throughput.py``: the seeds' design, one job per task.

A worker runs ``generate`` tasks one at a time (``--pool solo``, prefetch 1, acks late), each a
plain ``model.generate`` call for one job, as the seeds' Celery worker does. The broker and the
result backend are Redis (``BENCH_REDIS_URL``)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("asyncinfer_bench", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_model: dict[str, Any] = {}


def _load() -> dict[str, Any]:
    if not _model:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from asyncinfer.models.checkpoint import ensure_checkpoint

        cache = os.environ.get("ASYNCINFER_MODEL_CACHE") or os.path.expanduser(
            "~/.cache/asyncinfer"
        )
        from pathlib import Path

        folder = ensure_checkpoint(Path(cache), "smollm2-135m-instruct")
        _model["tok"] = AutoTokenizer.from_pretrained(str(folder))
        _model["model"] = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=torch.float32
        ).eval()
    return _model


@app.task(name="generate")
def generate(inp: dict[str, Any]) -> dict[str, Any]:
    """One generation job: chat template, ``generate``, decoded text; returns the wall time it
    ended at and the tokens it generated."""
    import torch

    m = _load()
    tok, model = m["tok"], m["model"]
    ids = tok.apply_chat_template(
        inp["messages"], add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )["input_ids"]
    kwargs: dict[str, Any] = {
        "max_new_tokens": inp.get("max_new_tokens", 128),
        "do_sample": inp.get("temperature", 0) > 0,
        "pad_token_id": tok.eos_token_id,
    }
    if kwargs["do_sample"]:
        kwargs.update(temperature=inp["temperature"], top_p=inp.get("top_p", 1.0), top_k=0)
    with torch.inference_mode():
        if inp.get("seed") is not None:
            torch.manual_seed(inp["seed"])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    generated = out[0, ids.shape[1] :]
    text = tok.decode(generated, skip_special_tokens=True)
    return {"ended": time.time(), "tokens": int(generated.shape[0]), "text": text}
