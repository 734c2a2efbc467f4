"""``python -m asyncinfer.worker --model ID``: run one worker process (the container's ECS
entry point calls the same function)."""

from __future__ import annotations

import argparse
import os
import sys

from asyncinfer import logs
from asyncinfer.settings import get_settings
from asyncinfer.worker.runner import Worker


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run a worker until SIGTERM, return its exit code (0)."""
    parser = argparse.ArgumentParser(prog="asyncinfer worker")
    parser.add_argument("--model", required=True, help="model id to serve")
    parser.add_argument("--max-batch-size", type=int, default=None)
    args = parser.parse_args(argv)
    # The pid tells the workers of one model apart in a shared log (the local stack's).
    logs.setup(f"worker[{args.model}:{os.getpid()}]")
    worker = Worker(get_settings(), args.model, max_batch_size=args.max_batch_size)
    worker.install_signal_handlers()
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
