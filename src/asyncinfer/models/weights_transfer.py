"""Parts of the S3 weights download (:mod:`.weights`, issue 13 item 4): the progress line, and
the integrity check of a downloaded file against its S3 ETag.

An S3 ETag is (S3 user guide, "Checking object integrity", and the ``ETag`` entry of the
``Object`` data type in the S3 API reference):

* for an object uploaded in one ``PutObject`` without SSE-KMS or SSE-C: the hex MD5 of its bytes
  (``<32 hex>``);
* for a multipart upload without SSE-KMS or SSE-C: the hex MD5 of the concatenated binary MD5s of
  its parts, then ``-`` and the number of parts (``<32 hex>-<N>``). ``aws s3 cp``/``sync`` and
  boto3's ``upload_file`` upload files above 8 MiB this way, in equal parts but the last, so most
  weight files have such an ETag;
* anything else (SSE-KMS, SSE-C): opaque; only the size is checked.

:func:`expected_check` decides, from the object's ``HeadObject`` answer, which check applies;
:func:`digest_of` computes the same value from the local file.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("asyncinfer.models.weights")

_PLAIN = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART = re.compile(r"^[0-9a-f]{32}-([0-9]+)$")
#: Bytes read from the file at a time while hashing.
READ_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class EtagCheck:
    """How to recompute an object's ETag from its bytes.

    Attributes:
        etag: the ETag to match (without quotes).
        part_bytes: ``None`` for a single-part MD5; else the part size of the multipart upload,
            bytes (every part but the last has it).
        parts: the number of parts the ETag says (1 for a single-part MD5).
    """

    etag: str
    part_bytes: int | None
    parts: int


def _encrypted(head: dict[str, Any]) -> bool:
    return bool(
        head.get("ServerSideEncryption") in ("aws:kms", "aws:kms:dsse")
        or head.get("SSECustomerAlgorithm")
    )


def expected_check(s3: Any, bucket: str, key: str, head: dict[str, Any]) -> EtagCheck | None:
    """The ETag check of one object, or ``None`` when its ETag is not a digest of its bytes
    (SSE-KMS, SSE-C, an unknown form) or a multipart upload's parts were not of equal size.

    For a multipart ETag the part size is read with a ``HeadObject`` of part 1 and one of the
    last part (their ``ContentLength``; S3 API reference, HeadObject ``partNumber``), and the
    check applies only when the parts are of equal size but the last (``(N - 1) x part 1 + last
    part`` is the object's size, and ``ceil(size / part 1)`` is the ETag's part count ``N``):
    an upload in parts of other sizes is checked by its size only, never refused.

    Args:
        s3: a boto3 S3 client.
        bucket, key: the object.
        head: its ``HeadObject`` answer (``ETag``, ``ContentLength``, encryption fields).
    """
    etag = str(head.get("ETag", "")).strip('"')
    if _encrypted(head):
        return None
    if _PLAIN.match(etag):
        return EtagCheck(etag, None, 1)
    m = _MULTIPART.match(etag)
    if not m:
        return None
    parts, size = int(m.group(1)), int(head.get("ContentLength", 0))
    part_bytes = _part_size(s3, bucket, key, 1)
    if parts < 1 or part_bytes <= 0 or -(-size // part_bytes) != parts:
        return None
    if parts > 1:
        last = _part_size(s3, bucket, key, parts)
        if not 0 < last <= part_bytes or (parts - 1) * part_bytes + last != size:
            return None  # parts of unequal sizes: the part size alone cannot rebuild the ETag
    return EtagCheck(etag, part_bytes, parts)


def _part_size(s3: Any, bucket: str, key: str, number: int) -> int:
    """Bytes of part ``number`` of a multipart object (``HeadObject`` with ``PartNumber``)."""
    return int(s3.head_object(Bucket=bucket, Key=key, PartNumber=number).get("ContentLength", 0))


def digest_of(path: Path, check: EtagCheck) -> str:
    """The ETag the file at ``path`` would have, uploaded as ``check`` says: its MD5, or the
    multipart form ``md5(md5(part 1) + ... + md5(part N))-N``."""
    with path.open("rb") as f:
        if check.part_bytes is None:
            h = hashlib.md5(usedforsecurity=False)
            while chunk := f.read(READ_BYTES):
                h.update(chunk)
            return h.hexdigest()
        digests = []
        while True:
            part = hashlib.md5(usedforsecurity=False)
            left = check.part_bytes
            while left > 0 and (chunk := f.read(min(READ_BYTES, left))):
                part.update(chunk)
                left -= len(chunk)
            if left == check.part_bytes:  # nothing read: the file ended
                break
            digests.append(part.digest())
            if left > 0:
                break
    whole = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
    return f"{whole}-{len(digests)}"


class Progress:
    """Bytes downloaded so far, logged at most every ``every`` seconds: ``downloading
    <source>: <done> of <total> MB (<percent>%), <rate> MB/s`` (MB: 10**6 bytes; the rate is the
    mean since the start). Thread-safe: the transfer threads of every file add to one.

    Args:
        where: the source, for the log line.
        total: bytes to download.
        every: least time between two lines, seconds.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        where: str,
        total: int,
        *,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where, self.total, self.done, self.every, self.clock = where, total, 0, every, clock
        self.t0 = self.last = clock()
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        """Count ``n`` more bytes (s3transfer's ``Callback``); log a line if one is due."""
        with self.lock:
            self.done += n
            now = self.clock()
            if now - self.last < self.every:
                return
            self.last = now
            log.info(
                "downloading %s: %.1f of %.1f MB (%.0f%%), %.1f MB/s",
                self.where,
                self.done / 1e6,
                self.total / 1e6,
                100.0 * self.done / max(self.total, 1),
                self.rate() / 1e6,
            )

    def rate(self) -> float:
        """Mean bytes per second since the start."""
        return self.done / max(self.clock() - self.t0, 1e-9)
