"""Inputs and outputs that are too large to travel inline live in S3.

Keys: ``inputs/<tenant>/<job_id>.json`` and ``outputs/<tenant>/<job_id>.json`` (the CDK app's
lifecycle rules expire both prefixes). References are ``s3://bucket/key`` URIs.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from asyncinfer.aws import clients
from asyncinfer.core.errors import InvalidInput, TransientError
from asyncinfer.core.settings_needs import PayloadConfig

#: Lifetime of presigned GET URLs for outputs, seconds (spec: "valid 1 h").
OUTPUT_URL_SECONDS = 3600

#: Deepest nesting of objects and arrays a job's input may have (the input object is level 1).
#: One limit for every parser on the way: Python's ``json`` gives up near its recursion limit
#: (~1000), and the worker parses its SQS message with pydantic-core, whose JSON parser stops
#: at 200 levels of the whole message (the input sits one level down in it).
MAX_JSON_DEPTH = 64


def json_problem(data: Any, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``data`` (parsed JSON) cannot travel to a worker unchanged, or ``None``: nested more
    than ``max_depth`` levels, or a number that is not finite (``1e400`` parses to infinity,
    which JSON cannot carry: it would arrive as ``null``). Iterative: no recursion limit."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > max_depth:
                return f"nested more than {max_depth} levels deep"
            children = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in children if isinstance(v, dict | list | float))
        elif isinstance(value, float) and not math.isfinite(value):
            return "a number is out of range (JSON cannot carry infinity)"
    return None


def loads_bounded(body: bytes, where: str) -> Any:
    """Parse a job input read from storage with the limits the API applies at submit;
    ``where`` names it in errors (``"input at s3://..."``).

    Raises:
        InvalidInput: not JSON (UTF-8), nested too deeply, or a number out of range.
    """
    try:
        data = json.loads(body)
    except RecursionError:
        raise InvalidInput(f"{where} is nested too deeply") from None
    except ValueError:
        raise InvalidInput(f"{where} is not JSON") from None
    problem = json_problem(data)
    if problem is not None:
        raise InvalidInput(f"{where} is {problem}")
    return data


def dumps(data: Any) -> bytes:
    """Compact UTF-8 JSON, as stored and as measured against inline limits. Characters UTF-8
    cannot carry (unpaired surrogates) are written as ``\\uXXXX`` escapes."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


class PayloadStore:
    """Reads and writes job payloads in the bucket of ``settings``."""

    def __init__(self, settings: PayloadConfig) -> None:
        self.settings = settings
        self.s3 = clients.client("s3", settings)

    def _uri(self, key: str) -> str:
        return f"s3://{self.settings.bucket}/{key}"

    def input_uri(self, tenant: str, job_id: str) -> str:
        """Where :meth:`put_input` stores ``job_id``'s input."""
        return self._uri(f"inputs/{tenant}/{job_id}.json")

    def put_input(self, tenant: str, job_id: str, body: bytes) -> str:
        """Store a job's input JSON; returns its ``s3://`` URI (:meth:`input_uri`)."""
        key = f"inputs/{tenant}/{job_id}.json"
        self.s3.put_object(
            Bucket=self.settings.bucket, Key=key, Body=body, ContentType="application/json"
        )
        return self._uri(key)

    def put_output(self, tenant: str, job_id: str, body: bytes) -> str:
        """Store a job's output JSON; returns its ``s3://`` URI."""
        key = f"outputs/{tenant}/{job_id}.json"
        self.s3.put_object(
            Bucket=self.settings.bucket, Key=key, Body=body, ContentType="application/json"
        )
        return self._uri(key)

    def read_json(self, uri: str, *, max_bytes: int | None = None) -> Any:
        """Read and parse the JSON at ``uri``, never more than ``max_bytes`` (default: the
        ``max_input_bytes`` setting): a HEAD compares the object's ContentLength with the cap
        before anything is read, and the read of that very object (``IfMatch`` its ETag) stops
        after the cap.

        Raises:
            InvalidInput: missing or unreadable object (one message for every such case, so
                that it does not tell whether another bucket or key exists), larger than the
                cap, or not JSON within :func:`loads_bounded`'s limits (permanent).
            TransientError: any other S3 failure (retryable).
        """
        cap = self.settings.max_input_bytes if max_bytes is None else max_bytes
        try:
            bucket, key = split_uri(uri)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        try:
            head = self.s3.head_object(Bucket=bucket, Key=key)
            if int(head.get("ContentLength") or 0) > cap:
                raise InvalidInput(f"input at {uri} is larger than {cap} bytes")
            body = self.s3.get_object(Bucket=bucket, Key=key, IfMatch=head["ETag"])["Body"]
            data = body.read(cap + 1)
            body.close()
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            if code in UNREADABLE:
                raise InvalidInput(unreadable_message(uri)) from None
            raise TransientError(f"cannot read input {uri}: {code}") from exc
        if len(data) > cap:
            raise InvalidInput(f"input at {uri} is larger than {cap} bytes")
        return loads_bounded(data, f"input at {uri}")

    def presign_get(self, uri: str, expires_in: int = OUTPUT_URL_SECONDS) -> str:
        """A presigned GET URL for ``uri``, valid ``expires_in`` seconds."""
        bucket, key = split_uri(uri)
        url: str = self.s3.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_in
        )
        return url


#: S3 error codes of an object that is not there or not ours to read (a HEAD answers 403/404
#: without a code of its own).
UNREADABLE = frozenset({"NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "403", "NotFound"})


def unreadable_message(uri: str) -> str:
    """The one message for an input that is missing, in a missing bucket or not readable: it
    does not say which (S3 itself answers 403 for both to callers without ListBucket)."""
    return f"cannot read input {uri}: no such object, or not readable by this service"


#: S3 bucket names (S3 user guide, "Bucket naming rules"): 3-63 lowercase letters, digits, dots
#: and hyphens, beginning and ending with a letter or digit.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``; ``ValueError`` for anything else (a bucket name
    S3 would refuse, a port or credentials, no key)."""
    parsed = urlparse(uri)
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    if parsed.scheme != "s3" or not _BUCKET_RE.match(bucket) or not key.strip("/"):
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    if parsed.query or parsed.fragment or len(key.encode()) > 1024:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    return bucket, key
