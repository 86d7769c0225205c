"""Forged hops: a request gets peer treatment only with a valid, fresh, unreplayed
signature from a region that holds the peer key.

Before signed hops, any key holder could send ``x-firstlight-hop`` and be treated as a
peer: send raw token ids past the prompt bound (``firstlight_resume``), choose the
request id handed to the engine, have its ``traceparent`` followed, and skip spill-over.
Every case with a client key fails on that code (it adopted the forged request id, or
accepted the resume field) and passes now; without a key a forged hop was refused
before and still is — a signature is no longer a way around the key either.

What peer treatment looks like from outside, and so what each case checks:

* authentication by the signature: a forged hop without a client key is 401;
* the resume field: a client's is refused (400, ``param`` names it);
* the forwarder's request id: adopted only from a verified hop (the response id shows it);
* streamed chunks carry ``firstlight_token_ids`` only for a peer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from firstlight.api.resume import RESUME_FIELD
from firstlight.regions.hop import (
    CALLER_HEADER,
    HOP_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    CallerClaim,
    HopSigner,
)
from tests.api.fake_region import (
    MODEL,
    TEST_PEER_KEY,
    FakeGateway,
    fake_gateway,
    gateway_config,
    peer_hop,
)
from tests.api.test_gateway_app import CHAT, chat, sse_data
from tests.serve.cluster import API_KEY

FORGED_ID = "chatcmpl-chosen-by-the-client"


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[FakeGateway]:
    key_file = tmp_path / "key"
    key_file.write_text(API_KEY + "\n")
    async with fake_gateway(gateway_config(key_file=key_file)) as gateway:
        yield gateway


def _payload(resume: bool) -> dict[str, Any]:
    payload = chat("Tell me a story", max_tokens=3, stream=True)
    if resume:
        payload[RESUME_FIELD] = {"token_ids": [1, 2]}
    return payload


def _forgeries(body: bytes) -> dict[str, dict[str, str]]:
    """Hop headers a client can craft without the peer key, by name."""
    good = HopSigner(TEST_PEER_KEY, "east").sign(CHAT, body, request_id=FORGED_ID)
    wrong_key = HopSigner("some-other-regions-key", "east").sign(CHAT, body, request_id=FORGED_ID)
    other_body = HopSigner(TEST_PEER_KEY, "east").sign(CHAT, b"{}", request_id=FORGED_ID)
    other_path = HopSigner(TEST_PEER_KEY, "east").sign(
        "/v1/completions", body, request_id=FORGED_ID
    )
    stale = HopSigner(TEST_PEER_KEY, "east", clock=lambda: 1_000_000.0).sign(
        CHAT, body, request_id=FORGED_ID
    )
    future = HopSigner(TEST_PEER_KEY, "east", clock=lambda: 9_999_999_999.0).sign(
        CHAT, body, request_id=FORGED_ID
    )
    return {
        "bare-hop-header": {HOP_HEADER: "east", REQUEST_ID_HEADER: FORGED_ID},
        "garbage-signature": {**good, SIGNATURE_HEADER: "t=1,n=00,s=00"},
        "malformed-signature": {**good, SIGNATURE_HEADER: good[SIGNATURE_HEADER] + ",x=1"},
        "wrong-key": wrong_key,
        "signed-for-another-body": other_body,
        "signed-for-another-path": other_path,
        "stale": stale,
        "from-the-future": future,
        "region-swapped": {**good, HOP_HEADER: "west"},
        "request-id-swapped": {**good, REQUEST_ID_HEADER: "chatcmpl-another"},
        "caller-added": {**good, CALLER_HEADER: "admin;-;-"},
    }


BODIES = {resume: json.dumps(_payload(resume)).encode() for resume in (False, True)}
CASES = [
    (name, resume, with_key)
    for resume in (False, True)
    for name in _forgeries(BODIES[resume])
    for with_key in (False, True)
]


@pytest.mark.parametrize(
    ("forgery", "resume", "with_key"), CASES, ids=["-".join(map(str, c)) for c in CASES]
)
async def test_a_forged_hop_gets_no_peer_treatment(
    gw: FakeGateway, forgery: str, resume: bool, with_key: bool
) -> None:
    body = BODIES[resume]
    headers = {"content-type": "application/json", **_forgeries(body)[forgery]}
    if with_key:
        headers["authorization"] = f"Bearer {API_KEY}"
    response = await gw.client.post(CHAT, content=body, headers=headers)
    if not with_key:
        assert response.status_code == 401, response.text  # no key, no way in
    elif resume:
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == RESUME_FIELD
    else:
        assert response.status_code == 200, response.text
        chunks = [json.loads(d) for d in sse_data(response.text)[:-1]]
        assert {c["id"] for c in chunks} != {FORGED_ID}
        assert all("firstlight_token_ids" not in c for c in chunks)
    assert all(request_id != FORGED_ID for request_id, _ in gw.backend.served)


async def test_a_replayed_signature_is_refused_even_inside_the_window(gw: FakeGateway) -> None:
    sent = peer_hop(_payload(False), request_id=FORGED_ID)
    first = await gw.client.post(CHAT, **sent)
    assert first.status_code == 200, first.text  # the genuine hop: no client key needed
    chunks = [json.loads(d) for d in sse_data(first.text)[:-1]]
    assert {c["id"] for c in chunks} == {FORGED_ID}
    assert all("firstlight_token_ids" in c for c in chunks if c["choices"])
    again = await gw.client.post(CHAT, **sent)  # the same bytes, captured and replayed
    assert again.status_code == 401, again.text


async def test_a_peers_vouched_caller_gets_its_tenants_cache_salt(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(API_KEY + "\n")
    config = gateway_config(
        auth={"enabled": True, "api_keys": [{"file": str(key_file), "tenant": "acme"}]}
    )
    async with fake_gateway(config) as gw:
        own = await gw.client.post(
            CHAT, json=chat(max_tokens=2), headers={"authorization": f"Bearer {API_KEY}"}
        )
        assert own.status_code == 200, own.text
        vouched = CallerClaim("someone", "salt-of-globex", "globex")
        forwarded = await gw.client.post(CHAT, **peer_hop(chat(max_tokens=2), caller=vouched))
        assert forwarded.status_code == 200, forwarded.text
    salts = [r.cache_salt for r in gw.backend.requests]
    assert salts[0] is not None
    assert salts[0] != "salt-of-globex"
    assert salts[1] == "salt-of-globex"


async def test_a_forged_hop_with_no_replica_here_is_refused_at_once(tmp_path: Path) -> None:
    """A request with an unverified hop header is never forwarded, and with no healthy
    replica here it is refused at once (503) rather than left waiting for one."""
    key_file = tmp_path / "key"
    key_file.write_text(API_KEY + "\n")
    async with fake_gateway(gateway_config(key_file=key_file), replicas={MODEL: 0}) as gw:
        headers = {"authorization": f"Bearer {API_KEY}", HOP_HEADER: "east"}
        response = await gw.client.post(CHAT, json=chat(max_tokens=2), headers=headers)
    assert response.status_code == 503, response.text
    assert "no healthy replica" in response.json()["error"]["message"]
    # Refused by the region decision, before any stream was tried: Ray would hold an
    # attempt until a replica starts (the fake fails it at once, so count the attempts).
    assert gw.backend.trace_contexts == []


async def test_a_peers_request_id_names_the_answer_never_the_engines_request(
    gw: FakeGateway,
) -> None:
    """The forwarder's id (signed) is the id the client sees, but the engine gets this
    gateway's own: two forwards under one id — a continuation sent back to a region
    whose first attempt is still being aborted — cannot collide in an engine, and no
    peer chooses which engine request an abort reaches."""
    for _ in range(2):
        response = await gw.client.post(CHAT, **peer_hop(_payload(False), request_id=FORGED_ID))
        assert response.status_code == 200, response.text
        chunks = [json.loads(d) for d in sse_data(response.text)[:-1]]
        assert {c["id"] for c in chunks} == {FORGED_ID}
    engine_ids = [r.request_id for r in gw.backend.requests]
    assert len(set(engine_ids)) == 2
    assert FORGED_ID not in engine_ids
    assert {r.response_id for r in gw.backend.requests} == {FORGED_ID}
