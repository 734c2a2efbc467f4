"""The tenant's OpenAI files (spec openai.md, "Files"), stored in the service's bucket.

Layout (the seam between the Files routes and batch expansion/finalization):

* object ``openai/files/<tenant>/<file_id>``: the bytes, as uploaded or as written by
  finalization;
* object metadata ``filename``, ``purpose`` (``batch``, or ``batch_output`` for output and error
  files) and ``created-at`` (epoch seconds, a string).

``file_id`` is ``file-`` + a ULID (:func:`new_file_id`). A file of another tenant is not found.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

from asyncinfer.core.errors import NotFound
from asyncinfer.core.ids import new_job_id

PREFIX = "openai/files"


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
        file_id = new_file_id()
        created = int(time.time())
        self.s3.put_object(
            Bucket=self.bucket,
            Key=file_key(tenant, file_id),
            Body=data,
            Metadata={"filename": filename, "purpose": purpose, "created-at": str(created)},
        )
        return _object(file_id, len(data), created, filename, purpose)

    def get(self, tenant: str, file_id: str) -> FileObject:
        """The File object of ``file_id``. Raises :class:`~asyncinfer.core.errors.NotFound` where
        ``tenant`` has no such file."""
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=file_key(tenant, file_id))
        except self.s3.exceptions.ClientError as err:
            raise NotFound(f"No such file: {file_id}") from err
        meta = head.get("Metadata", {})
        return _object(
            file_id,
            int(head["ContentLength"]),
            int(meta.get("created-at", "0")),
            meta.get("filename", file_id),
            meta.get("purpose", "batch"),
        )

    def read(self, tenant: str, file_id: str, *, max_bytes: int | None = None) -> bytes:
        """The bytes of ``file_id``. Raises :class:`~asyncinfer.core.errors.NotFound` where
        ``tenant`` has no such file; :class:`ValueError` where it is larger than ``max_bytes``."""
        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=file_key(tenant, file_id))
        except self.s3.exceptions.ClientError as err:
            raise NotFound(f"No such file: {file_id}") from err
        if max_bytes is not None and int(obj["ContentLength"]) > max_bytes:
            raise ValueError(f"file {file_id} is larger than {max_bytes} bytes")
        data: bytes = obj["Body"].read()
        return data


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
