"""The ``asyncinfer`` command: ``local`` (the local stack), ``worker`` (one worker process),
``prepare`` (convert model checkpoints once), ``serve-openai`` (a ``causal-lm`` or
``embeddings`` entry behind an OpenAI-compatible server,
:mod:`asyncinfer.models.openai_server.serve`), ``preflight`` (check an AWS account before a
first ``cdk deploy``, :mod:`asyncinfer.aws.preflight`), and the client commands (``submit``,
``get``, ``wait``, ``cancel``, ``ls``, ``batch``, ``models``,
``webhook-secret``, ``verify-webhook``; see :mod:`asyncinfer.client._cli` for their output and
exit codes)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _local(args: argparse.Namespace) -> int:
    from asyncinfer.core.errors import CatalogueError
    from asyncinfer.local.stack import LocalOptions, run_local
    from asyncinfer.models.registry import MODELS, use_catalogue

    models_file = Path(args.models_file).resolve() if args.models_file else None
    try:
        catalogue = use_catalogue(models_file) if models_file else MODELS.catalogue
    except CatalogueError as exc:
        print(f"asyncinfer local: {exc}", file=sys.stderr)
        return 2
    assert catalogue is not None
    models = (
        [m.strip() for m in args.models.split(",") if m.strip()] if args.models else catalogue.ids
    )
    return run_local(
        LocalOptions(
            port=args.port,
            models_file=models_file,
            models=models,
            max_workers=args.max_workers,
            state_dir=Path(args.state_dir),
            extra_keys=args.extra_key or [],
            visibility_timeout=args.visibility_timeout,
            max_receive_count=args.max_receive_count,
            min_workers=args.min_workers,
            idle_seconds=args.idle_seconds,
            backlog_per_worker=args.backlog_per_worker,
            warm_workers=not args.cold_workers,
        )
    )


def _worker(args: argparse.Namespace) -> int:
    from asyncinfer.worker.__main__ import main as worker_main

    argv = ["--model", args.model]
    if args.max_batch_size:
        argv += ["--max-batch-size", str(args.max_batch_size)]
    return worker_main(argv)


def _prepare(args: argparse.Namespace) -> int:
    from asyncinfer.core import logs
    from asyncinfer.core.settings import get_settings
    from asyncinfer.models.checkpoint import ensure_checkpoint

    logs.setup("prepare")
    path = ensure_checkpoint(get_settings().model_cache_dir)
    print(f"smollm2-135m-instruct checkpoint: {path}")
    return 0


def _serve_openai(args: argparse.Namespace) -> int:
    from asyncinfer.core import logs
    from asyncinfer.core.errors import CatalogueError
    from asyncinfer.core.settings import get_settings
    from asyncinfer.models.openai_server.serve import serve_openai
    from asyncinfer.models.registry import MODELS, use_catalogue

    logs.setup(f"serve-openai[{args.model}]")
    try:
        if args.models_file:
            use_catalogue(Path(args.models_file).resolve())
        else:
            MODELS.catalogue  # noqa: B018 - load (and validate) it now
    except CatalogueError as exc:
        print(f"asyncinfer serve-openai: {exc}", file=sys.stderr)
        return 2
    return serve_openai(
        args.model,
        host=args.host,
        port=args.port,
        max_batch_size=args.max_batch_size,
        settings=get_settings().model_settings,
    )


def _preflight(args: argparse.Namespace) -> int:
    from asyncinfer.aws.preflight import main as preflight_main

    return preflight_main(args.context or [], region=args.region)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    p = argparse.ArgumentParser(prog="asyncinfer", description="Asynchronous model inference")
    sub = p.add_subparsers(dest="command", required=True)

    lp = sub.add_parser("local", help="run the whole service on this machine")
    lp.add_argument("--port", type=int, default=8000, help="API port on 127.0.0.1 (8000)")
    lp.add_argument(
        "--models-file",
        default=None,
        metavar="PATH",
        help="the model catalogue, models.yaml (default: the project's; docs/models.md)",
    )
    lp.add_argument(
        "--models", default="", help="comma list of model ids of the catalogue (default: all)"
    )
    lp.add_argument(
        "--max-workers", type=int, default=1, help="most worker processes per model (1)"
    )
    lp.add_argument(
        "--min-workers", type=int, default=0, help="fewest worker processes per model (0)"
    )
    lp.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        help="seconds without jobs before workers scale in to --min-workers (60)",
    )
    lp.add_argument(
        "--backlog-per-worker",
        type=float,
        default=1.0,
        help="target backlog per worker the autoscaler scales out on (1)",
    )
    lp.add_argument(
        "--cold-workers",
        action="store_true",
        help="start each worker as a new Python process (as ECS does) instead of forking it "
        "from the warm fork server",
    )
    lp.add_argument("--state-dir", default=".asyncinfer", help="where local.json goes")
    lp.add_argument("--extra-key", action="append", metavar="NAME", help="another API key")
    lp.add_argument("--visibility-timeout", type=int, default=30, help="seconds (30)")
    lp.add_argument("--max-receive-count", type=int, default=3, help="SQS maxReceiveCount (3)")
    lp.set_defaults(func=_local)

    wp = sub.add_parser("worker", help="run one worker process for a model")
    wp.add_argument("--model", required=True, help="a model id of ASYNCINFER_MODELS_FILE")
    wp.add_argument("--max-batch-size", type=int, default=None)
    wp.set_defaults(func=_worker)

    pp = sub.add_parser("prepare", help="convert the SmolLM2 GGUF file to a cached checkpoint")
    pp.set_defaults(func=_prepare)

    op = sub.add_parser(
        "serve-openai",
        help="serve a causal-lm or embeddings model of the catalogue through an "
        "OpenAI-compatible API",
    )
    op.add_argument("--model", required=True, help="a causal-lm or embeddings model id")
    op.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    op.add_argument("--port", type=int, default=8000, help="port (8000)")
    op.add_argument(
        "--models-file", default=None, metavar="PATH", help="the model catalogue, models.yaml"
    )
    op.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="most requests running at once (default: the entry's max_batch_size)",
    )
    op.set_defaults(func=_serve_openai)

    fp = sub.add_parser(
        "preflight",
        help="check the account before a first cdk deploy (quotas, roles, bootstrap, Docker)",
    )
    fp.add_argument(
        "-c",
        dest="context",
        action="append",
        metavar="KEY=VALUE",
        help="a CDK context setting, as given to cdk deploy (run from the checkout)",
    )
    fp.add_argument("--region", default=None, help="region (default: the AWS configuration's)")
    fp.set_defaults(func=_preflight)

    from asyncinfer.client._cli import add_commands

    add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``asyncinfer`` command."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
