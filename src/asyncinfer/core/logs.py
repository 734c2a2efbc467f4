"""Logging setup of long-running processes (worker, local stack): one line per record, quiet
third-party loggers, no progress bars, no model hub access."""

from __future__ import annotations

import logging
import os
import sys


def setup(name: str, level: int = logging.INFO) -> None:
    """Log ``<time> <name> <LEVEL> <message>`` lines to stderr."""
    logging.basicConfig(
        level=level, format=f"%(asctime)s {name} %(levelname)s %(message)s", stream=sys.stderr
    )
    for noisy in ("botocore", "boto3", "urllib3", "httpx", "httpcore", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Models come from installed wheels and the local cache; never from a hub at run time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
