"""The HTTP server of ``asyncinfer serve-openai``: one model handler's ``serve`` loop in a thread
of its own, fed by the HTTP requests (:class:`~.requests.RequestSource`), one thread per
connection (:class:`~.routes.Routes` answers them), and the ``/metrics`` page."""

from __future__ import annotations

import logging
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from asyncinfer.models.base import ModelHandler
from asyncinfer.models.openai_server.requests import RequestSource
from asyncinfer.models.openai_server.routes import Routes

log = logging.getLogger("asyncinfer.serve_openai")


class EngineServer(ThreadingHTTPServer):
    """The HTTP server of one model: its handler runs in a thread of its own.

    Args:
        address: ``(host, port)``; port 0 picks a free one (see ``server_address``).
        handler: a built model handler (``load`` is called by :meth:`start_engine`).
        model: the model name served (``/v1/models``, requests' ``model``).
        max_batch_size: most requests running at once.
        embeddings: an ``embeddings`` entry: ``POST /v1/embeddings`` is served (and the
            completions routes are not).
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: ModelHandler,
        model: str,
        max_batch_size: int,
        *,
        embeddings: bool = False,
    ) -> None:
        super().__init__(address, Routes)
        self.handler = handler
        self.model = model
        self.max_batch_size = max_batch_size
        self.embeddings = embeddings
        self.source = RequestSource()
        self.ready = threading.Event()
        self.created = int(time.time())
        self._engine: threading.Thread | None = None

    def start_engine(self) -> None:
        """Load the weights and run the handler's ``serve`` loop, in a thread; ``/health`` says
        200 once loaded."""

        def run() -> None:
            t0 = time.monotonic()
            self.handler.load()
            self.ready.set()
            log.info("model %s loaded in %.1fs; ready", self.model, time.monotonic() - t0)
            self.handler.serve(self.source, self.max_batch_size)

        self._engine = threading.Thread(target=run, name="engine", daemon=True)
        self._engine.start()

    def stop(self) -> None:
        """Refuse new requests, let the handler's loop end, stop serving."""
        self.source.stop()
        threading.Thread(target=self.shutdown, daemon=True).start()

    def metrics(self) -> str:
        """The ``/metrics`` page (Prometheus text format 0.0.4): vLLM's two scheduler gauges,
        our request counters and, once the generation engine is loaded, its decoding counts
        (:data:`asyncinfer.models.engine.runner.COUNTS`)."""
        label = f'{{model_name="{self.model}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", "Requests running", self.source.running),
            ("vllm:num_requests_waiting", "gauge", "Requests waiting", self.source.waiting),
            (
                "asyncinfer_engine_running_peak",
                "gauge",
                "Most requests running at once since start",
                self.source.peak_running,
            ),
            ("asyncinfer_engine_requests_total", "counter", "Requests", self.source.total),
            (
                "asyncinfer_engine_streams_closed_total",
                "counter",
                "Requests whose client closed the connection before the end",
                self.source.closed,
            ),
        ]
        # Read, not imported: importing the runner imports torch (an embeddings entry has none).
        counts = getattr(sys.modules.get("asyncinfer.models.engine.runner"), "COUNTS", None)
        if counts is not None:
            rows += [
                (
                    "asyncinfer_engine_decode_steps_total",
                    "counter",
                    "Decoding steps (one forward pass for every running request)",
                    counts.steps,
                ),
                (
                    "asyncinfer_engine_decode_rows_total",
                    "counter",
                    "Requests decoded, summed over the steps (/ steps: the mean batch size)",
                    counts.rows,
                ),
                ("asyncinfer_engine_prefills_total", "counter", "Prefills", counts.prefills),
            ]
        out = []
        for name, kind, text, value in rows:
            out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return "\n".join(out) + "\n"
