"""GET /v1/jobs: forged cursors of any shape are 422 naming ``cursor``; a filtered list reads a
bounded number of pages and hands back a cursor to go on."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import pytest

from asyncinfer.aws import clients
from asyncinfer.core.errors import InvalidRequest
from asyncinfer.jobs import store as store_module
from asyncinfer.jobs.cursors import decode_cursor, encode_cursor
from asyncinfer.local.resources import Resources
from tests.conftest import ApiCaller
from tests.unit.helpers import count_calls

JOB = "job_01ARZ3NDEKTSV4RRFFQ69G5FAV"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def real_cursor(api: ApiCaller) -> str:
    for i in range(3):
        api("POST", "/v1/jobs", {"model": "echo", "input": {"n": i}})
    _, page, _ = api("GET", "/v1/jobs?limit=1")
    assert page["next_cursor"]
    return str(page["next_cursor"])


FORGED = [
    "!!!!",  # not base64 at all
    "YQ==",  # padded
    b64(b"not json"),
    b64(b"\xff\xfe\xfd"),  # not UTF-8
    b64(b"[1, 2]"),
    b64(b'"a string"'),
    b64(b"null"),
    b64(json.dumps({"job_id": JOB}).encode()),  # a key missing
    b64(json.dumps({"job_id": JOB, "tenant": "tenant-a", "x": 1}).encode()),  # one too many
    b64(json.dumps({"job_id": 12345, "tenant": "tenant-a"}).encode()),
    b64(json.dumps({"job_id": [JOB], "tenant": "tenant-a"}).encode()),
    b64(json.dumps({"job_id": JOB, "tenant": ["tenant-a"]}).encode()),
    b64(json.dumps({"job_id": JOB, "tenant": None}).encode()),
    b64(json.dumps({"job_id": JOB + "\n", "tenant": "tenant-a"}).encode()),
    b64(json.dumps({"job_id": "job_" + "0" * 26 + "x", "tenant": "tenant-a"}).encode()),
    b64(json.dumps({"job_id": JOB, "tenant": "tenant-b"}).encode()),  # another tenant's
    b64(b"[" * 1500),  # nested past the parser's recursion limit (a 500 before)
    b64(b"{" * 1000 + b"}" * 1000)[:2048],
    "A" * 513,  # longer than any cursor
    "A" * 100_000,  # huge
    "A",  # cannot be base64 (length 1 mod 4)
]


@pytest.mark.parametrize("cursor", FORGED)
def test_forged_cursor_of_any_shape_is_422_naming_cursor(api: ApiCaller, cursor: str) -> None:
    status, resp, _ = api("GET", f"/v1/jobs?cursor={quote(cursor, safe='')}")
    assert status == 422, resp
    assert resp["error"]["code"] == "invalid_request"
    assert resp["error"]["details"][0]["field"] == "cursor"


@pytest.mark.parametrize("extra", ["!", "=", "\n", " ", "%", "+", "/", "."])
def test_real_cursor_with_a_stray_character_is_422(api: ApiCaller, extra: str) -> None:
    # Lenient base64 decoding would drop the stray character and accept the cursor.
    cursor = real_cursor(api)
    for forged in (cursor + extra, cursor[:4] + extra + cursor[4:]):
        status, resp, _ = api("GET", f"/v1/jobs?cursor={quote(forged, safe='')}")
        assert status == 422, (forged, resp)
        assert resp["error"]["details"][0]["field"] == "cursor"


def test_cursor_is_url_safe_base64_without_padding(api: ApiCaller) -> None:
    cursor = real_cursor(api)
    assert set(cursor) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert 1 <= len(cursor) <= 512
    status, page, _ = api("GET", f"/v1/jobs?limit=1&cursor={cursor}")
    assert status == 200 and len(page["jobs"]) == 1


def test_decode_rejects_non_strings_and_round_trips() -> None:
    key = {"job_id": {"S": JOB}, "tenant": {"S": "t"}}
    assert decode_cursor(encode_cursor(key), "t") == key
    for bad in (None, 5, b"abc", ["x"]):
        with pytest.raises(InvalidRequest):
            decode_cursor(bad, "t")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        decode_cursor(b64(b"[" * 100_000), "t")  # huge: refused before it is decoded


def test_filtered_list_reads_a_bounded_number_of_pages_and_hands_back_a_cursor(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [
        api("POST", "/v1/jobs", {"model": "echo", "input": {"n": i}})[1]["id"] for i in range(12)
    ]
    api("POST", f"/v1/jobs/{ids[0]}/cancel")  # the oldest: found last, newest first
    monkeypatch.setattr(store_module, "LIST_FILTERED_READ", 3)
    monkeypatch.setattr(store_module, "LIST_MAX_QUERIES", 2)
    calls = count_calls(clients.client("dynamodb"))
    found: list[str] = []
    cursor: str | None = None
    requests = 0
    while True:
        before = calls["Query"]
        query = "/v1/jobs?status=cancelled&limit=5" + (f"&cursor={cursor}" if cursor else "")
        status, page, _ = api("GET", query)
        requests += 1
        assert status == 200
        assert calls["Query"] - before <= 2  # within the page budget
        found += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
        assert requests < 10
    assert found == [ids[0]]
    assert requests >= 2  # the first page came back empty, with a cursor to go on


def test_filtered_list_stops_at_the_time_budget(
    api: ApiCaller, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(6):
        api("POST", "/v1/jobs", {"model": "echo", "input": {"n": i}})
    monkeypatch.setattr(store_module, "LIST_FILTERED_READ", 2)
    monkeypatch.setattr(store_module, "LIST_TIME_BUDGET_SECONDS", 0.0)
    calls = count_calls(clients.client("dynamodb"))
    status, page, _ = api("GET", "/v1/jobs?status=running")
    assert status == 200 and page["jobs"] == []
    assert page["next_cursor"]
    assert calls["Query"] == 1


def test_unfiltered_list_pages_exactly(api: ApiCaller) -> None:
    ids = [api("POST", "/v1/jobs", {"model": "echo", "input": {"n": i}})[1]["id"] for i in range(4)]
    _, p1, _ = api("GET", "/v1/jobs?limit=2")
    _, p2, _ = api("GET", f"/v1/jobs?limit=2&cursor={p1['next_cursor']}")
    assert [j["id"] for j in p1["jobs"] + p2["jobs"]] == ids[::-1]
    assert p2["next_cursor"] is None


def test_empty_cursor_is_the_first_page(api: ApiCaller) -> None:
    api("POST", "/v1/jobs", {"model": "echo", "input": {}})
    status, page, _ = api("GET", "/v1/jobs?cursor=")
    assert status == 200 and len(page["jobs"]) == 1
