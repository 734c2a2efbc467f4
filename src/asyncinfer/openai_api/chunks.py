"""A validated batch's requests in S3, in chunks the expander reads one at a time.

Object ``openai/batches/<tenant>/<batch_id>/chunk-<k>.json``: a JSON list of ``[line number,
custom_id, model, job input]``, the requests ``k * chunk_lines`` .. of the file in order
(``chunk_lines`` is kept on the batch record, so a change of the setting never shifts a running
batch). Written once, after validation; read by expansion and, for the lines a batch ended before
it ran, by finalization.
"""

from __future__ import annotations

import json
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core.settings_parts import OpenAISettings
from asyncinfer.openai_api.validation import Line

PREFIX = "openai/batches"


def chunk_key(tenant: str, batch_id: str, k: int) -> str:
    """The S3 key of chunk ``k`` of a batch."""
    return f"{PREFIX}/{tenant}/{batch_id}/chunk-{k}.json"


def write_chunks(
    settings: OpenAISettings, tenant: str, batch_id: str, lines: list[Line], size: int
) -> int:
    """Store ``lines`` in chunks of ``size``; returns the number of chunks."""
    s3 = clients.client("s3", settings)
    count = 0
    for k, start in enumerate(range(0, len(lines), size)):
        part = [[ln.number, ln.custom_id, ln.model, ln.input] for ln in lines[start : start + size]]
        s3.put_object(
            Bucket=settings.bucket,
            Key=chunk_key(tenant, batch_id, k),
            Body=json.dumps(part, separators=(",", ":"), ensure_ascii=False).encode(),
            ContentType="application/json",
        )
        count += 1
    return count


def read_chunk(settings: OpenAISettings, record: dict[str, Any], k: int) -> list[list[Any]]:
    """Chunk ``k`` of the batch ``record``: ``[[line number, custom_id, model, input], ...]``."""
    s3 = clients.client("s3", settings)
    obj = s3.get_object(Bucket=settings.bucket, Key=chunk_key(record["owner"], record["job_id"], k))
    data: list[list[Any]] = json.loads(obj["Body"].read())
    return data
