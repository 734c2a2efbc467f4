"""Webhook URL rules (spec, "Events"), checked at submit."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from asyncinfer.errors import InvalidRequest
from asyncinfer.webhook_urls import check_url

REFUSED = [
    "https://127.0.0.1/h",
    "https://localhost/h",
    "https://10.1.2.3/h",
    "https://172.16.0.1/h",
    "https://172.31.255.255/h",
    "https://192.168.1.1/h",
    "https://100.64.0.1/h",
    "https://169.254.169.254/latest/meta-data",
    "https://[fc00::1]/h",
    "https://[fd12:3456::1]/h",
    "https://[fe80::1]/h",
    "https://224.0.0.1/h",
    "https://[ff02::1]/h",
    "https://0.0.0.0/h",
    "https://[::]/h",
    "https://[::1]/h",
    "https://[::ffff:169.254.169.254]/h",
    "https://[::ffff:127.0.0.1]/h",
    "https://2130706433/h",
    "https://0x7f000001/h",
    "https://0177.0.0.1/h",
    "https://127.1/h",
    "http://93.184.216.34/h",  # http outside the local stack
    "ftp://93.184.216.34/h",
    "https://user:pw@93.184.216.34/h",
    "https:///nohost",
]


@pytest.mark.parametrize("url", REFUSED)
def test_refused_at_submit(url: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_url(url, local_mode=False, resolve=False)
    assert info.value.details[0]["field"] == "webhook.url"


@pytest.mark.parametrize("url", ["https://93.184.216.34/h", "https://[2606:4700::1111]/x"])
def test_public_addresses_pass(url: str) -> None:
    check_url(url, local_mode=False, resolve=False)


def test_local_stack_allows_http_and_loopback_only() -> None:
    check_url("http://127.0.0.1:9000/h", local_mode=True, resolve=False)
    check_url("http://localhost:9000/h", local_mode=True, resolve=False)
    with pytest.raises(InvalidRequest):
        check_url("http://10.0.0.1/h", local_mode=True, resolve=False)
    with pytest.raises(InvalidRequest):
        check_url("http://[::ffff:169.254.169.254]/h", local_mode=True, resolve=False)


def test_name_resolving_to_a_private_address_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(host: str, port: Any, *a: Any, **k: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(InvalidRequest, match="not a public address"):
        check_url("https://hooks.example.com/h", local_mode=False)


def test_unresolvable_name_is_accepted_and_checked_at_send(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*a: Any, **k: Any) -> list[Any]:
        raise socket.gaierror("no such name")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    check_url("https://hooks.example.com/h", local_mode=False)
