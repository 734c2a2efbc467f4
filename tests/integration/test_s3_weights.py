"""An ``embeddings`` entry whose weights are on S3 (issue 13 items 3 and 4), end to end on the
moto server: a tiny BERT folder uploaded under a prefix, a catalogue pointing at it, a real worker
that downloads it into its weights cache at start, and a job that succeeds with its vectors;
a second worker on the same cache downloads nothing. Each worker's ``worker ready`` line splits
its time to ready into ``download_seconds`` and ``load_seconds``, and its ``first job`` line
gives the time to the first result."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import boto3
import pytest

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.local.resources import create_resources
from asyncinfer.models import weights
from asyncinfer.models.registry import use_catalogue
from tests.conftest import apply_env
from tests.integration.conftest import Env, WorkerThread
from tests.unit.encoders import catalogue_of, save_tiny_encoder

MODEL = "tiny-s3"


def test_a_worker_downloads_s3_weights_once_and_serves_jobs(
    moto_endpoint: str,
    clean_env: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = tmp_path / "cache"
    apply_env(
        clean_env,
        {
            "AWS_ENDPOINT_URL": moto_endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "ASYNCINFER_WEIGHTS_CACHE": str(cache),
        },
    )
    bucket = f"weights-{time.monotonic_ns()}"
    s3 = clients.client("s3")
    s3.create_bucket(Bucket=bucket)
    folder = save_tiny_encoder(tmp_path / "bert", "bert")
    for p in sorted(folder.iterdir()):
        s3.upload_file(str(p), bucket, f"enc/v1/{p.name}")
    use_catalogue(
        catalogue_of(
            [
                {
                    "id": MODEL,
                    "kind": "embeddings",
                    "source": f"s3://{bucket}/enc/v1/",
                    "device": "cpu",
                    "max_batch_size": 4,
                },
                {"id": "echo", "kind": "echo"},
            ],
            tmp_path,
        )
    )
    try:
        base = Settings(
            weights_cache_dir=cache,  # the worker model part carries it (ASYNCINFER_WEIGHTS_CACHE)
            endpoint_url=moto_endpoint,
            region="us-east-1",
            receive_wait_seconds=1,
            drain_seconds=2,
        )
        res = create_resources(base, [MODEL], prefix=f"s3w{time.monotonic_ns()}")
        env = Env(settings=res.settings(base), resources=res, env=res.env())
        job = env.submit(MODEL, {"texts": ["hello world", "a cat"]})
        with caplog.at_level("INFO"), WorkerThread(env.settings, MODEL):
            rec = env.wait_for(job, {"succeeded", "failed"}, timeout=120)
            first = _wait_for_line(caplog, "first job: ")
        ready = _fields(_line(caplog, "worker ready: "))
        assert float(ready["download_seconds"]) > 0 and float(ready["load_seconds"]) > 0
        assert _fields(first)["job"] == job and float(_fields(first)["first_result_seconds"]) > 0
        assert any(
            r.getMessage().startswith(f"downloaded s3://{bucket}/enc/v1/") for r in caplog.records
        )
        caplog.clear()
        assert rec["status"] == "succeeded", rec
        out = json.loads(rec["output"])
        assert out["dim"] == 32 and len(out["embeddings"]) == 2
        assert all(
            math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5)
            for v in out["embeddings"]
        )
        [downloaded] = [p for p in (cache / "s3" / bucket).iterdir() if p.is_dir()]
        assert (downloaded / weights.MARKER).exists() and (downloaded / "config.json").exists()
        stamp = (downloaded / "model.safetensors").stat().st_mtime_ns
        # A second worker on the same machine reuses the folder as it is.
        job2 = env.submit(MODEL, {"texts": ["again"]})
        with caplog.at_level("INFO"), WorkerThread(env.settings, MODEL):
            assert env.wait_for(job2, {"succeeded", "failed"}, timeout=120)["status"] == (
                "succeeded"
            )
        assert (downloaded / "model.safetensors").stat().st_mtime_ns == stamp
        assert not any(r.getMessage().startswith("downloaded s3://") for r in caplog.records)
    finally:
        use_catalogue(None)


def _line(caplog: pytest.LogCaptureFixture, prefix: str) -> str:
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]
    return line


def _wait_for_line(caplog: pytest.LogCaptureFixture, prefix: str, timeout: float = 30) -> str:
    """The worker logs ``first job`` right after handing the result on: wait for it."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(r.getMessage().startswith(prefix) for r in caplog.records):
            return _line(caplog, prefix)
        time.sleep(0.05)
    raise AssertionError(f"no {prefix!r} line")


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


#: A download in a process of its own, slowed to 0.4 s a GET, one file at a time.
_SLOW_DOWNLOAD = """
import sys, time
from pathlib import Path
import boto3
from asyncinfer.models import weights
weights.FILE_CONCURRENCY = 1
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
s3.meta.events.register("before-call.s3.GetObject", lambda **_: time.sleep(0.4))
weights.s3_folder(sys.argv[2], cache_root=Path(sys.argv[3]), s3=s3)
"""


def test_a_download_killed_midway_is_resumed_by_the_next_start(
    moto_endpoint: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGKILL in the middle (no clean-up runs, the lock dies with the process): the next start
    keeps the files the killed one finished and checked, fetches the rest, and nothing is
    readable as the folder before that."""
    import os
    import signal
    import subprocess
    import sys

    apply_env(
        clean_env,
        {
            "AWS_ENDPOINT_URL": moto_endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        },
    )
    bucket = f"killed-{time.monotonic_ns()}"
    s3 = clients.client("s3")
    s3.create_bucket(Bucket=bucket)
    bodies = {f"f{i}.bin": bytes([i]) * 50_000 for i in range(8)}
    for name, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=f"w/{name}", Body=body)
    source, cache = f"s3://{bucket}/w/", tmp_path / "cache"
    partial = cache / "s3" / bucket / f"{weights.folder_name(bucket, 'w/')}.partial"
    src = Path(__file__).resolve().parents[2] / "src"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_DOWNLOAD, moto_endpoint, source, str(cache)],
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            recorded = _read(partial / weights.PROGRESS)
            if len(recorded) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the download ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    kept = set(_read(partial / weights.PROGRESS))
    assert 2 <= len(kept) < len(bodies)
    target = partial.with_suffix("")
    assert not target.exists()  # the killed download left nothing a reader could take
    fetched: list[str] = []
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")  # its own hook
    s3.meta.events.register(
        "before-call.s3.GetObject",
        lambda params, **_: fetched.append(params["url_path"].rsplit("/", 1)[-1]),
    )
    assert weights.s3_folder(source, cache_root=cache, s3=s3) == target
    assert sorted(fetched) == sorted(set(bodies) - kept)  # finished files were kept
    assert {p.name: p.read_bytes() for p in target.iterdir() if p.suffix == ".bin"} == bodies
    assert not partial.exists()


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
