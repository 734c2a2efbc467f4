"""The tenant's OpenAI files (spec openai.md, "Files"), stored in the service's bucket.

Layout (the seam between the Files routes and batch expansion/finalization):

* object ``openai/files/<tenant>/<file_id>``: the bytes, as uploaded or as written by
  finalization;
* object metadata ``filename`` (percent-encoded: S3 metadata is US-ASCII), ``purpose``
  (``batch``, or ``batch_output`` for output and error files) and ``created-at`` (epoch
  seconds, a string).

``file_id`` is ``file-`` + a ULID (:func:`new_file_id`). A file of another tenant is not found.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict
from urllib.parse import quote, unquote

from asyncinfer.core.errors import InvalidRequest, NotFound, PayloadTooLarge
from asyncinfer.core.ids import new_job_id

PREFIX = "openai/files"
#: Objects of one page of :meth:`FileStore.list` read at once (one HEAD each, for the metadata).
HEAD_CONCURRENCY = 16
#: Most bytes of the percent-encoded ``filename`` metadata: S3 takes at most 2 KB of user-defined
#: metadata per object (S3 User Guide, "Working with object metadata"), and 255 characters of
#: 4-byte UTF-8 encode to 3,060.
MAX_FILENAME_META_BYTES = 1024


class FileObject(TypedDict):
    """OpenAI's File object (its API reference, "The file object")."""

    id: str
    object: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str


def new_file_id() -> str:
    """``file-`` + a ULID (sorts by creation time)."""
    return "file-" + new_job_id().removeprefix("job_")


def file_key(tenant: str, file_id: str) -> str:
    """The S3 key of one tenant's file."""
    return f"{PREFIX}/{tenant}/{file_id}"


class FileDeleted(TypedDict):
    """OpenAI's answer to a file deletion (its API reference, "Delete file")."""

    id: str
    object: str
    deleted: bool


class FileStore:
    """Files of tenants in one bucket, through a boto3 S3 client.

    Args:
        s3: a boto3 S3 client.
        bucket: the service's bucket (``Settings.bucket``).
    """

    def __init__(self, s3: Any, bucket: str) -> None:
        self.s3 = s3
        self.bucket = bucket

    def create(self, tenant: str, data: bytes, *, filename: str, purpose: str) -> FileObject:
        """Store ``data`` (bytes) as a new file of ``tenant``; returns its File object."""
        filename = clip_filename(filename)
        file_id = new_file_id()
        created = int(time.time())
        self.s3.put_object(
            Bucket=self.bucket,
            Key=file_key(tenant, file_id),
            Body=data,
            Metadata={"filename": quote(filename), "purpose": purpose, "created-at": str(created)},
        )
        return _object(file_id, len(data), created, filename, purpose)

    def get(self, tenant: str, file_id: str) -> FileObject:
        """The File object of ``file_id``. Raises :class:`~asyncinfer.core.errors.NotFound` where
        ``tenant`` has no such file."""
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=file_key(tenant, file_id))
        except self.s3.exceptions.ClientError as err:
            if _status(err) not in _ABSENT:
                raise
            raise NotFound(f"No such file: {file_id}") from err
        meta = head.get("Metadata", {})
        return _object(
            file_id,
            int(head["ContentLength"]),
            int(meta.get("created-at", "0")),
            unquote(meta.get("filename", file_id)),
            meta.get("purpose", "batch"),
        )

    def read(self, tenant: str, file_id: str, *, max_bytes: int | None = None) -> bytes:
        """The bytes of ``file_id``. Raises :class:`~asyncinfer.core.errors.NotFound` where
        ``tenant`` has no such file; :class:`ValueError` where it is larger than ``max_bytes``."""
        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=file_key(tenant, file_id))
        except self.s3.exceptions.ClientError as err:
            if _status(err) not in _ABSENT:
                raise
            raise NotFound(f"No such file: {file_id}") from err
        if max_bytes is not None and int(obj["ContentLength"]) > max_bytes:
            raise ValueError(f"file {file_id} is larger than {max_bytes} bytes")
        data: bytes = obj["Body"].read()
        return data

    def create_from_object(
        self, tenant: str, source_key: str, *, filename: str, purpose: str, max_bytes: int
    ) -> FileObject:
        """A new file of ``tenant`` copied, inside the bucket, from the object ``source_key``
        (an upload of ``POST /v1/uploads``; S3 CopyObject, one request up to 5 GB).

        Raises:
            InvalidRequest: (field ``input_url``) no such object, or it is empty.
            PayloadTooLarge: (field ``input_url``) it is larger than ``max_bytes``.
        """
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=source_key)
        except self.s3.exceptions.ClientError as err:
            if _status(err) not in _ABSENT:
                raise
            raise InvalidRequest(
                "nothing was uploaded to input_url",
                [{"field": "input_url", "message": "PUT the file to upload_url first"}],
            ) from None
        size = int(head["ContentLength"])
        if size > max_bytes:
            raise PayloadTooLarge(
                f"the upload is {size} bytes; at most {max_bytes}",
                [{"field": "input_url", "message": f"at most {max_bytes} bytes"}],
            )
        if size == 0:
            raise InvalidRequest(
                "the upload is empty", [{"field": "input_url", "message": "empty file"}]
            )
        filename = clip_filename(filename)
        file_id = new_file_id()
        created = int(time.time())
        self.s3.copy_object(
            Bucket=self.bucket,
            Key=file_key(tenant, file_id),
            CopySource={"Bucket": self.bucket, "Key": source_key},
            MetadataDirective="REPLACE",
            Metadata={"filename": quote(filename), "purpose": purpose, "created-at": str(created)},
        )
        return _object(file_id, size, created, filename, purpose)

    def list(
        self,
        tenant: str,
        *,
        limit: int,
        after: str | None = None,
        order: str = "desc",
        purpose: str | None = None,
    ) -> tuple[list[FileObject], bool]:
        """One page of ``tenant``'s files: ``(files, has_more)``.

        ``order`` ``desc`` (newest first, OpenAI's default) or ``asc``; ``after`` a file id: the
        page starts after it in that order (the id need not exist any more); ``purpose`` keeps
        only files of that purpose. Ids are ULIDs, so the key order is the creation order; the
        tenant's keys are listed (1,000 per S3 call) and each file on the page is read with one
        HEAD (:data:`HEAD_CONCURRENCY` at once) for its metadata.
        """
        ids = sorted(self._ids(tenant), reverse=order != "asc")
        if after is not None:
            ids = [i for i in ids if (i < after if order != "asc" else i > after)]
        page: list[FileObject] = []
        pos = 0
        with ThreadPoolExecutor(max_workers=HEAD_CONCURRENCY) as pool:
            while pos < len(ids) and len(page) < limit:
                batch = ids[pos : pos + max(limit - len(page), 1)]
                pos += len(batch)
                for found in pool.map(lambda i: self._maybe(tenant, i), batch):
                    if found is not None and (purpose is None or found["purpose"] == purpose):
                        page.append(found)
        return page, pos < len(ids)

    def delete(self, tenant: str, file_id: str) -> FileDeleted:
        """Delete ``file_id``; OpenAI's ``{"id", "object": "file", "deleted": true}``. Raises
        :class:`~asyncinfer.core.errors.NotFound` where ``tenant`` has no such file."""
        self.get(tenant, file_id)
        self.s3.delete_object(Bucket=self.bucket, Key=file_key(tenant, file_id))
        return FileDeleted(id=file_id, object="file", deleted=True)

    def presigned_url(self, tenant: str, file_id: str, *, expires: int, filename: str) -> str:
        """A presigned GET of the file's bytes, valid ``expires`` seconds, whose response names
        ``filename`` as an attachment (S3 ``response-content-disposition``)."""
        url: str = self.s3.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": file_key(tenant, file_id),
                "ResponseContentDisposition": f'attachment; filename="{_quoted(filename)}"',
                "ResponseContentType": "application/octet-stream",
            },
            ExpiresIn=expires,
        )
        return url

    def _ids(self, tenant: str) -> Iterator[str]:
        prefix = file_key(tenant, "")
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                name = item["Key"][len(prefix) :]
                if name.startswith("file-") and "/" not in name:
                    yield name

    def _maybe(self, tenant: str, file_id: str) -> FileObject | None:
        try:
            return self.get(tenant, file_id)
        except NotFound:  # deleted between the listing and the HEAD
            return None


#: S3 statuses of a missing object: 404, or 403 for a caller without ``s3:ListBucket`` (S3 API
#: Reference, HeadObject/GetObject, "Permissions").
_ABSENT = (403, 404)


def _status(err: Exception) -> int:
    """The HTTP status of a botocore ``ClientError`` (0 when it has none)."""
    meta = getattr(err, "response", {}).get("ResponseMetadata", {})
    code = getattr(err, "response", {}).get("Error", {}).get("Code")
    return 404 if code in ("NoSuchKey", "404", "NotFound") else int(meta.get("HTTPStatusCode", 0))


def clip_filename(filename: str) -> str:
    """The longest prefix of ``filename`` whose percent-encoding (the stored metadata) is at
    most :data:`MAX_FILENAME_META_BYTES` bytes."""
    size = 0
    for i, ch in enumerate(filename):
        size += len(quote(ch))  # quote() encodes character by character
        if size > MAX_FILENAME_META_BYTES:
            return filename[:i]
    return filename


def _quoted(filename: str) -> str:
    """``filename`` safe inside a quoted header parameter (no quotes, backslashes, controls)."""
    return "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename
    )


def _object(file_id: str, size: int, created: int, filename: str, purpose: str) -> FileObject:
    return FileObject(
        id=file_id,
        object="file",
        bytes=size,
        created_at=created,
        filename=filename,
        purpose=purpose,
        status="processed",
    )
