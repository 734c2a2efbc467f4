"""Inputs and outputs that are too large to travel inline live in S3.

Keys: ``inputs/<tenant>/<job_id>.json`` and ``outputs/<tenant>/<job_id>.json`` (the CDK app's
lifecycle rules expire both prefixes). References are ``s3://bucket/key`` URIs.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from asyncinfer import clients
from asyncinfer.errors import InvalidInput, TransientError
from asyncinfer.settings import Settings

#: Lifetime of presigned GET URLs for outputs, seconds (spec: "valid 1 h").
OUTPUT_URL_SECONDS = 3600


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

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.s3 = clients.client("s3", settings)

    def _uri(self, key: str) -> str:
        return f"s3://{self.settings.bucket}/{key}"

    def put_input(self, tenant: str, job_id: str, body: bytes) -> str:
        """Store a job's input JSON; returns its ``s3://`` URI."""
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

    def read_json(self, uri: str) -> Any:
        """Read and parse the JSON at ``uri``.

        Raises:
            InvalidInput: missing object, or not JSON (permanent).
            TransientError: any other S3 failure (retryable).
        """
        try:
            bucket, key = split_uri(uri)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        try:
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            if code in ("NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "403"):
                raise InvalidInput(f"cannot read input {uri}: {code}") from None
            raise TransientError(f"cannot read input {uri}: {code}") from exc
        try:
            return json.loads(body)
        except ValueError:
            raise InvalidInput(f"input at {uri} is not JSON") from None

    def presign_get(self, uri: str, expires_in: int = OUTPUT_URL_SECONDS) -> str:
        """A presigned GET URL for ``uri``, valid ``expires_in`` seconds."""
        bucket, key = split_uri(uri)
        url: str = self.s3.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_in
        )
        return url


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
