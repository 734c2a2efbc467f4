"""``python -m asyncinfer.worker --model ID``: run one worker process (the container's ECS
entry point calls the same function)."""

from __future__ import annotations

import argparse
import os
import sys

from asyncinfer.core import logs
from asyncinfer.core.errors import CatalogueError, ConfigError
from asyncinfer.core.settings import get_settings
from asyncinfer.models.registry import MODELS
from asyncinfer.worker.runner import Worker


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run a worker until SIGTERM, return its exit code (0; 2 when the model
    catalogue, ``ASYNCINFER_MODELS_FILE``, is invalid or does not hold ``--model``, its handler
    cannot be imported, or it refuses to load here: ``device: cuda`` on a host without CUDA)."""
    parser = argparse.ArgumentParser(prog="asyncinfer worker")
    parser.add_argument("--model", required=True, help="model id to serve")
    parser.add_argument("--max-batch-size", type=int, default=None)
    args = parser.parse_args(argv)
    # The pid tells the workers of one model apart in a shared log (the local stack's).
    logs.setup(f"worker[{args.model}:{os.getpid()}]")
    try:
        known = list(MODELS)
    except CatalogueError as exc:
        print(f"asyncinfer worker: {exc}", file=sys.stderr)
        return 2
    if args.model not in known:
        print(
            f"asyncinfer worker: model {args.model!r} is not in the catalogue "
            f"{MODELS.catalogue.path}; known: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    problem = MODELS[args.model].handler_problem()
    if problem:
        print(f"asyncinfer worker: model {args.model!r}: {problem}", file=sys.stderr)
        return 2
    worker = Worker(get_settings().worker, args.model, max_batch_size=args.max_batch_size)
    worker.install_signal_handlers()
    try:
        return worker.run()
    except ConfigError as exc:  # the handler refused to load: device: cuda on a CPU host, ...
        print(f"asyncinfer worker: model {args.model!r}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
