"""Sizes and media types of the ``/openai/v1`` surface where API Gateway and Lambda cut requests
and responses, shared by the routes, the local gateway and the CDK app (``docs/openai.md``,
"Limits").

* API Gateway REST APIs take request bodies up to 10 MB (API Gateway quotas, "Payload size").
* A body whose ``Content-Type`` is one of the API's binary media types (:data:`BINARY_MEDIA_TYPES`)
  reaches a Lambda proxy integration base64-encoded in the event (API Gateway developer guide,
  "Binary media types for REST APIs"), so that file bytes arrive intact.
* A synchronous Lambda invocation's request and response payloads are at most 6 MB each (Lambda
  quotas, "Invocation payload"). Base64 makes 4 bytes of 3, so a multipart body of
  :data:`MAX_MULTIPART_BYTES` becomes 5,866,668 bytes, leaving room for the event's headers and
  context under 6,000,000.
"""

from __future__ import annotations

#: The RestApi's ``binaryMediaTypes``: multipart uploads in, and the file content the ``openai``
#: SDK asks for with ``Accept: application/binary`` out (a base64 body of the Lambda is decoded
#: to bytes for a client whose ``Accept`` is one of them).
BINARY_MEDIA_TYPES = ("multipart/form-data", "application/binary", "application/octet-stream")
#: Largest multipart body of ``POST /openai/v1/files``, bytes (see the module docstring).
#: Larger files: ``POST /v1/uploads``, PUT the bytes, then ``POST /openai/v1/files`` with
#: ``input_url``.
MAX_MULTIPART_BYTES = 4_400_000
#: Largest JSON body of ``POST /openai/v1/files``, bytes.
MAX_JSON_BYTES = 64 * 1024
#: Files up to this size are served in the response of ``GET /files/{id}/content``; larger
#: ones (and text that JSON escaping would grow past :data:`INLINE_RESPONSE_BYTES`) by a 302 to
#: a presigned S3 GET, which the SDK follows (its HTTP client follows redirects and drops the
#: ``Authorization`` header on another origin). 4,000,000 bytes are 5,333,336 in base64.
INLINE_CONTENT_BYTES = 4_000_000
#: Largest body the API Lambda returns, bytes, leaving room for the response's headers.
INLINE_RESPONSE_BYTES = 5_800_000
#: Lifetime of the presigned GET of such a redirect, seconds.
CONTENT_URL_SECONDS = 300


def is_binary_media(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` header value is one of :data:`BINARY_MEDIA_TYPES`."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media in BINARY_MEDIA_TYPES
