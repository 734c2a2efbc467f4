"""``asyncinfer serve-openai --model ID``: a ``causal-lm`` (or ``embeddings``) entry of the
catalogue behind an OpenAI-compatible HTTP server, so that our own engine can run as the sidecar
of an ``openai-server`` entry, and so that the ``openai-server`` path is tested against a real
model.

Endpoints (as vLLM's OpenAI server has them):

* ``POST /v1/chat/completions`` and ``POST /v1/completions``: streaming (server-sent events,
  ``data: {chunk}`` lines, ``data: [DONE]`` last; ``usage`` in the last chunk when
  ``stream_options.include_usage``) or not; ``usage`` and ``finish_reason`` as OpenAI's;
* ``POST /v1/embeddings`` instead, for an ``embeddings`` entry (``input`` a string or a list of
  strings; ``data`` of ``{"index", "embedding"}`` as OpenAI answers);
* ``GET /v1/models``: the one model served (its catalogue id);
* ``GET /health``: 200 once the weights are loaded, 503 before;
* ``GET /metrics``: Prometheus text: ``vllm:num_requests_running`` and
  ``vllm:num_requests_waiting`` (vLLM's names), and our counters.

Jobs run through the handler's public ``serve`` loop (:class:`.requests.RequestSource`, a
:class:`~asyncinfer.models.base.WorkSource`), at most ``max_batch_size`` at once; the rest wait
(``num_requests_waiting``). Streaming granularity is the handler's progress interval (about a
second for :mod:`asyncinfer.models.smollm2`). A client that closes its connection cancels its
request at once (logged as ``stream closed``).

Modules: :mod:`.server` (the server, its engine thread, ``/metrics``), :mod:`.routes` (the
endpoints), :mod:`.streaming` (waiting for a job, server-sent events), :mod:`.requests` (the
handler's work source). This one starts it (the CLI's ``serve-openai``).
"""

from __future__ import annotations

import logging
import signal

from asyncinfer.core.settings_parts import ModelSettings
from asyncinfer.models.openai_server.server import EngineServer
from asyncinfer.models.openai_server.streaming import POLL_SECONDS

__all__ = ["POLL_SECONDS", "EngineServer", "serve_openai"]

log = logging.getLogger("asyncinfer.serve_openai")


def serve_openai(
    model_id: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int | None = None,
    settings: ModelSettings | None = None,
) -> int:
    """Serve catalogue entry ``model_id`` (``causal-lm``: the completions routes; ``embeddings``:
    ``/v1/embeddings``) until SIGTERM or SIGINT; returns 0, or 2 when the entry is missing or of
    another kind. ``settings``: the model layer's part (the CLI passes the settings'; without
    it the handler's built-in defaults)."""
    from asyncinfer.models.registry import MODELS

    if model_id not in MODELS:
        log.error("model %r is not in the catalogue; known: %s", model_id, ", ".join(MODELS))
        return 2
    spec = MODELS[model_id]
    if spec.kind not in ("causal-lm", "embeddings"):
        log.error(
            "model %r is of kind %s; serve-openai serves causal-lm entries (and embeddings "
            "entries, on /v1/embeddings)",
            model_id,
            spec.kind,
        )
        return 2
    handler = spec.load_handler(settings=settings)
    server = EngineServer(
        (host, port),
        handler,
        model_id,
        max_batch_size or spec.max_batch_size,
        embeddings=spec.kind == "embeddings",
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    log.info("serve-openai: model %s on http://%s:%d/v1", model_id, *server.server_address[:2])
    server.start_engine()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    log.info("serve-openai stopped")
    return 0
