"""``engine.image: aws:NAME`` resolved by the ``sagemaker`` SDK at synth (issue 16,
:mod:`infra.sagemaker_images`): offline (no connection but loopback, no AWS credentials), every
region of the commercial and China partitions the SDK lists, an unknown version or a missing SDK a
config error naming the field, and a catalogue without an ``aws:`` image needs no SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import sagemaker_images as si

ROOT = Path(__file__).resolve().parents[2]

#: Run in a fresh interpreter, so that importing the SDK is guarded too: every name lookup and
#: every connection, datagram or ``create_connection`` to an address other than loopback is
#: recorded (and refused); the answer is printed as JSON.
_GUARDED = r"""
import json, socket, sys, time
from tests.netguard.sitecustomize import allowed, is_loopback
attempts = []
def refuse(what):
    attempts.append(repr(what))
    raise PermissionError(f"socket guard: {what!r}")
real = (socket.getaddrinfo, socket.create_connection, socket.socket.connect,
        socket.socket.connect_ex, socket.socket.sendto)
def getaddrinfo(host, *a, **k):
    if host is not None and not is_loopback(host):
        refuse(("getaddrinfo", host))
    return real[0](host, *a, **k)
def create_connection(address, *a, **k):
    if not allowed(address):
        refuse(("create_connection", address))
    return real[1](address, *a, **k)
def connect(self, address):
    if not allowed(address):
        refuse(("connect", address))
    return real[2](self, address)
def connect_ex(self, address):
    if not allowed(address):
        refuse(("connect_ex", address))
    return real[3](self, address)
def sendto(self, data, *args):
    if not allowed(args[-1] if args else None):
        refuse(("sendto", args[-1]))
    return real[4](self, data, *args)
socket.getaddrinfo, socket.create_connection = getaddrinfo, create_connection
socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto = connect, connect_ex, sendto
t0 = time.perf_counter()
from infra import sagemaker_images as si
image_uris = si.sdk()
t1 = time.perf_counter()
regions = si.region_uris("djl-lmi", "0.33.0")
one = si.region_uri("huggingface-llm", "3.0.1", "eu-west-1")
config = image_uris.config_for_framework("huggingface-tei")
direct = image_uris.retrieve("djl-lmi", region="us-east-1", version="0.33.0")
problems = si.image_problems("m", "djl-lmi", "0.0.1")
print(json.dumps({"attempts": attempts, "regions": regions, "one": one, "direct": direct,
                  "tei": sorted(config), "problems": problems, "import_s": t1 - t0,
                  "resolve_s": time.perf_counter() - t1}))
"""


@pytest.fixture
def clear_cache() -> Iterator[None]:
    """Forget resolved images before and after the test."""
    si.region_uris.cache_clear()
    si.region_uri.cache_clear()
    yield
    si.region_uris.cache_clear()
    si.region_uri.cache_clear()


def test_resolving_makes_no_connection_but_loopback_and_needs_no_credentials(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "HOME": str(tmp_path),  # no ~/.aws, no ~/.config/sagemaker
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "ASYNCINFER_NETGUARD": "0",  # this script's guard records; the shared one only refuses
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }  # AWS_EC2_METADATA_DISABLED left unset: an instance-metadata lookup would be recorded
    out = subprocess.run(
        [sys.executable, "-c", _GUARDED],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["attempts"] == []
    assert got["regions"]["us-east-1"] == got["direct"]
    assert got["direct"].startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:")
    assert got["one"].startswith("763104351884.dkr.ecr.eu-west-1.amazonaws.com/")
    assert got["tei"] == ["inference"]
    (p,) = got["problems"]
    assert p.startswith("m: engine.image aws:djl-lmi version 0.0.1") and "engine.version" in p


def test_the_region_table_is_the_sdks_for_both_partitions(clear_cache: None) -> None:
    image_uris = si.sdk()
    uris = si.region_uris("huggingface-llm", "3.0.1")
    for region in ("us-east-1", "eu-west-1", "cn-north-1", "us-gov-west-1"):
        assert region in uris
    assert uris["cn-north-1"].split("/")[0].endswith(".amazonaws.com.cn")
    for region, uri in uris.items():
        assert uri == image_uris.retrieve("huggingface-llm", region=region, version="3.0.1")
    every = image_uris.config_for_framework("huggingface-llm")["inference"]["versions"]["3.0.1"]
    left_out = set(every["registries"]) - set(uris)
    for region in left_out:  # only the isolated partitions' hosts
        host = image_uris.retrieve("huggingface-llm", region=region, version="3.0.1").split("/")[0]
        assert not host.endswith((".amazonaws.com", ".amazonaws.com.cn")), region


def test_an_alias_resolves_as_the_sdk_resolves_it(clear_cache: None) -> None:
    image_uris = si.sdk()
    assert "latest" in si.known_versions("djl-lmi")
    assert si.region_uri("djl-lmi", "latest", "us-east-1") == image_uris.retrieve(
        "djl-lmi", region="us-east-1", version="latest"
    )


def test_a_region_the_sdk_lists_no_image_in_is_named(clear_cache: None) -> None:
    with pytest.raises(si.ImageError, match=r"aws:djl-lmi version 0\.31\.0.*no image in xx-1"):
        si.region_uri("djl-lmi", "0.31.0", "xx-1")


# ----------------------------------------------------------------- the config's errors

LMI = {
    "id": "a",
    "kind": "openai-server",
    "engine": {"image": "aws:djl-lmi", "version": "0.0.1", "model": "x"},
    "compute": {"backend": "sagemaker", "instance_type": "g6e.xlarge"},
}
TGI = {**LMI, "id": "b", "engine": {"image": "aws:huggingface-llm", "version": "9.9", "model": "x"}}
OWN = {
    **LMI,
    "id": "c",
    "engine": {"image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/e:1", "model": "x"},
}


def _load(tmp_path: Path, entries: list[dict[str, Any]]) -> Any:
    from infra.config import load_config

    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": entries}))
    return load_config({"models_file": str(path)})


def test_unknown_versions_are_one_config_error_naming_engine_version(
    tmp_path: Path, clear_cache: None
) -> None:
    from infra.config import DeployConfigError

    with pytest.raises(DeployConfigError) as err:
        _load(tmp_path, [LMI, TGI, OWN])
    found = [p for p in err.value.problems if "engine.version" in p]
    assert len(found) == 2, err.value.problems
    a, b = sorted(found)
    assert a.startswith("a: engine.image aws:djl-lmi version 0.0.1")
    assert b.startswith("b: engine.image aws:huggingface-llm version 9.9")
    for v in si.sdk().list_versions("djl-lmi"):
        assert v in a  # what the SDK knows, listed
    assert "3.0.1" in b


@pytest.fixture
def no_sdk(monkeypatch: pytest.MonkeyPatch, clear_cache: None) -> None:
    """The SDK is not importable (``sys.modules`` entry ``None``)."""
    monkeypatch.setitem(sys.modules, "sagemaker.core.image_uris", None)


def test_without_the_sdk_an_aws_image_names_the_extra(tmp_path: Path, no_sdk: None) -> None:
    from infra.config import DeployConfigError

    with pytest.raises(DeployConfigError) as err:
        _load(tmp_path, [{**LMI, "engine": {**LMI["engine"], "version": "0.31.0"}}])
    (p,) = err.value.problems
    assert p.startswith("a: engine.image aws:NAME") and "pip install -e '.[cdk]'" in p


def test_without_the_sdk_a_catalogue_without_aws_images_loads(tmp_path: Path, no_sdk: None) -> None:
    assert list(_load(tmp_path, [OWN]).model_compute) == ["c"]
    from infra.config import load_config

    assert load_config({}).catalogue.ids  # the default catalogue
