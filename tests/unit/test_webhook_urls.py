"""Webhook URL rules (spec, "Events"), checked at submit."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from asyncinfer.core.errors import InvalidRequest
from asyncinfer.webhooks.urls import (
    NOT_GLOBAL,
    ForbiddenAddress,
    check_address,
    check_url,
    parse_url,
)

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


# ---------------------------------------------------------------------------- IANA registries
#: One address from each special-purpose block that is not globally reachable (IANA IPv4 and
#: IPv6 Special-Purpose Address Registries), and those Python's ``is_global`` misses.
NOT_GLOBAL_SAMPLES = [
    "192.0.0.9",  # IETF protocol assignments (PCP anycast, inside the block refused whole)
    "192.0.0.100",  # IETF protocol assignments; Python 3.11 calls it global
    "192.0.0.170",  # NAT64/DNS64 discovery
    "192.88.99.1",  # deprecated 6to4 relay anycast (RFC 7526)
    "198.18.0.1",  # benchmarking
    "198.51.100.7",  # TEST-NET-2
    "203.0.113.7",  # TEST-NET-3
    "192.0.2.1",  # TEST-NET-1
    "240.0.0.1",  # reserved
    "255.255.255.255",  # limited broadcast
    "0.1.2.3",  # "this network"
    "fec0::1",  # site-local (deprecated, RFC 3879); Python calls it global
    "64:ff9b:1::1",  # local-use IPv4/IPv6 translation (RFC 8215)
    "3fff::1",  # documentation (RFC 9637)
    "5f00::1",  # segment routing SIDs (RFC 9602)
    "100::1",  # discard-only
    "100:0:0:1::1",  # dummy IPv6 prefix (RFC 9780)
    "2001::1",  # Teredo
    "2001:2::1",  # benchmarking
    "2001:10::1",  # ORCHID (deprecated)
    "2001:db8::1",  # documentation
    "::7f00:1",  # IPv4-compatible (deprecated) form of 127.0.0.1
    "::ffff:0:a00:1",  # IPv4-translated (RFC 2765) form of 10.0.0.1
    "2002:c0a8:101::1",  # 6to4 embedding 192.168.1.1
    "2002:a9fe:a9fe::1",  # 6to4 embedding 169.254.169.254
    "2002:c058:6301::1",  # 6to4 embedding the 6to4 relay anycast 192.88.99.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "::ffff:192.0.0.100",  # IPv4-mapped
    "ff05::2",  # multicast
]
GLOBAL_SAMPLES = [
    "93.184.216.34",
    "192.31.196.1",  # AS112 (globally reachable)
    "2606:4700::1111",
    "2002:5db8:d822::1",  # 6to4 embedding the public 93.184.216.34
    "64:ff9b::5db8:d822",  # NAT64 of the public 93.184.216.34
    "::ffff:93.184.216.34",
]


@pytest.mark.parametrize("addr", NOT_GLOBAL_SAMPLES)
def test_special_purpose_addresses_are_refused(addr: str) -> None:
    with pytest.raises(ForbiddenAddress):
        check_address(ipaddress.ip_address(addr))
    with pytest.raises(InvalidRequest):
        check_url(f"https://[{addr}]/h" if ":" in addr else f"https://{addr}/h", local_mode=False)


@pytest.mark.parametrize("addr", GLOBAL_SAMPLES)
def test_globally_reachable_addresses_pass(addr: str) -> None:
    check_address(ipaddress.ip_address(addr))


def test_every_listed_block_is_refused_at_both_ends() -> None:
    for net in NOT_GLOBAL:
        for addr in (net.network_address + 1, net.broadcast_address - 1):
            with pytest.raises(ForbiddenAddress):
                check_address(addr)


def test_loopback_on_the_local_stack_is_not_reached_through_nat64() -> None:
    check_address(ipaddress.ip_address("::ffff:127.0.0.1"), allow_loopback=True)
    with pytest.raises(ForbiddenAddress):
        check_address(ipaddress.ip_address("64:ff9b::7f00:1"), allow_loopback=True)


# ---------------------------------------------------------------------------- one parser, ports
#: Refused at submit, each for a reason of its own; before the shared parser some of these passed
#: the submit-time check and then were read differently (or not at all) by the sender.
MALFORMED = [
    "https://93.184.216.34\\x.example/h",  # urlsplit: a name; the old sender: 93.184.216.34
    "https://hooks.example\\@93.184.216.34/h",
    "https://xn--/h",  # passed the check, then the sender raised IDNAError (retried for 24 h)
    "https://ex%61mple.com/h",
    "https://a..b.example/h",
    "https://-a.example/h",
    "https://1.2.3.4.5/h",
    "https://hooks.example.123/h",
    "https://[fe80::1%25eth0]/h",
    "https://[93.184.216.34]/h",
    "https://hooks.example:+443/h",
    "https://hooks.example:0/h",
    "https://hooks.example:65536/h",
    "https://hooks.example/h\x7f",
    "https://hooks.example/h\tx",
    "https://foo.localhost/h",
    "https://stra\u00dfe.example/h",  # IDNA 2003: strasse.example; IDNA 2008: xn--strae-oqa
    "https://\uff45xample.com/h",  # full-width: IDNA 2003 maps it to example.com
    "https://hooks\u3002example.com/h",  # ideographic full stop: a dot to IDNA 2003
    "",
]


@pytest.mark.parametrize("url", MALFORMED)
def test_urls_the_sender_cannot_read_alike_are_refused_at_submit(url: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_url(url, local_mode=False, resolve=False)
    assert info.value.details[0]["field"] == "webhook.url"


@pytest.mark.parametrize(
    ("url", "host", "port", "target"),
    [
        ("https://Hooks.Example.com:8443/in?x=1#frag", "hooks.example.com", 8443, "/in?x=1"),
        ("https://hooks.example:/h", "hooks.example", 443, "/h"),
        (
            "https://b\u00fccher.example/\u00e9?q=\u00e9",
            "xn--bcher-kva.example",
            443,
            "/%C3%A9?q=%C3%A9",
        ),
        ("https://hooks.example", "hooks.example", 443, "/"),
        ("https://[2606:4700::1111]:1024/a%20b", "2606:4700::1111", 1024, "/a%20b"),
        ("https://0x5db8d822/h", "93.184.216.34", 443, "/h"),
    ],
)
def test_parsed_parts(url: str, host: str, port: int, target: str) -> None:
    parsed = check_url(url, local_mode=False, resolve=False)
    assert (parsed.host, parsed.port, parsed.target) == (host, port, target)
    assert parse_url(url, local_mode=False) == parsed


@pytest.mark.parametrize("port", [1, 22, 25, 53, 80, 110, 389, 636, 993, 1023])
def test_well_known_ports_other_than_443_are_refused(port: int) -> None:
    with pytest.raises(InvalidRequest, match="port"):
        check_url(f"https://93.184.216.34:{port}/h", local_mode=False, resolve=False)


@pytest.mark.parametrize("port", [443, 1024, 3000, 8080, 8443, 65535])
def test_443_and_unprivileged_ports_pass(port: int) -> None:
    check_url(f"https://93.184.216.34:{port}/h", local_mode=False, resolve=False)


def test_local_stack_allows_any_port() -> None:
    check_url("http://127.0.0.1:9/h", local_mode=True, resolve=False)
    check_url("http://127.0.0.1:80/h", local_mode=True, resolve=False)


def test_a_slow_resolver_does_not_hold_the_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import asyncinfer.webhooks.urls as wu

    def slow(*a: Any, **k: Any) -> list[Any]:
        time.sleep(4)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 443))]

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    monkeypatch.setattr(wu, "SUBMIT_RESOLVE_SECONDS", 0.5)
    t0 = time.monotonic()
    check_url("https://hooks.example.com/h", local_mode=False)  # accepted; checked at send
    assert time.monotonic() - t0 < 2.5
