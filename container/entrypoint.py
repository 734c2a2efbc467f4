"""Entry point of the worker image.

``worker [--model ID]``: the ECS worker (the model defaults to the only id in
``ASYNCINFER_MODELS``). ``serve``: SageMaker's serving contract on port 8080 (SageMaker starts
the container with the argument ``serve``).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """Dispatch to the worker or the SageMaker server; returns the exit code."""
    command, rest = (argv[0], argv[1:]) if argv else ("worker", [])
    if command == "worker":
        from asyncinfer.worker.__main__ import main as worker_main

        if "--model" not in rest:
            from asyncinfer.core import envvars
            from asyncinfer.core.errors import ConfigError
            from asyncinfer.core.settings import get_settings

            try:
                models = get_settings().models
            except ConfigError as exc:
                print(f"worker: {exc}", file=sys.stderr)
                return 2
            if len(models) != 1:
                print(f"worker: pass --model ID or set {envvars.MODELS} to one id", file=sys.stderr)
                return 2
            rest = ["--model", models[0], *rest]
        return worker_main(rest)
    if command == "serve":
        from asyncinfer.worker.sagemaker_server import serve

        serve()
        return 0
    print(f"unknown command {command!r}: use 'worker' or 'serve'", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
