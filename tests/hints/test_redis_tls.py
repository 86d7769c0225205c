"""TLS to Redis: the platform's Redis clients verify the server against the CA of
``hints.tls_ca_file`` (the in-chart Redis's own CA, which the chart mounts), against a
real ``redis-server`` that speaks TLS only.

The hole (issue "trust boundaries"): the in-chart Redis was plain ``redis://`` and the
platform had no way to trust a private CA, so TLS to an in-cluster Redis was not
available at all; the first test fails on that code (no ``tls_ca_file``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from redis.exceptions import ConnectionError as RedisConnectionError

from firstlight.config import HintsConfig
from firstlight.hints import BlockEvent, HintPublisher, redis_client
from tests.hints.conftest import MODEL, RedisServer, ServerTls, client_for


def _tls_files(folder: Path) -> ServerTls:
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    files = ServerTls(folder / "server.pem", folder / "server.key", folder / "ca.pem")
    server.cert_chain_pems[0].write_to_path(str(files.cert_file))
    server.private_key_pem.write_to_path(str(files.key_file))
    ca.cert_pem.write_to_path(str(files.ca_file))
    return files


@pytest.fixture
async def tls_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path, _tls_files(tmp_path))
    try:
        await server.start()
        yield server
    finally:
        await server.stop()


async def test_hints_are_published_over_tls_to_a_redis_signed_by_its_own_ca(
    tls_redis: RedisServer,
) -> None:
    assert tls_redis.tls is not None
    config = HintsConfig(redis_url=tls_redis.url, tls_ca_file=tls_redis.tls.ca_file)
    client = redis_client(config)
    try:
        publisher = HintPublisher(client, "fltest:tls:", MODEL, "replica-a", 1, ttl_s=60)
        await publisher.start_epoch()
        await publisher.publish(BlockEvent("replica-a", 1, (11, 12, 13), ()))
        keys = [key async for key in client.scan_iter(match="fltest:tls:*")]
        assert keys
        plain = client_for(tls_redis.url.replace("rediss://", "redis://"), timeout_s=1.0)
        with pytest.raises(RedisConnectionError):  # the server speaks nothing but TLS
            await plain.ping()
        await plain.aclose()
    finally:
        await client.aclose()


async def test_a_redis_the_ca_did_not_sign_is_refused(tmp_path: Path) -> None:
    """The client verifies the server: a Redis with a certificate from another CA (a
    pod impersonating the Service) gets no connection, and no password."""
    (tmp_path / "server").mkdir()
    (tmp_path / "other").mkdir()
    server = RedisServer(tmp_path / "server", _tls_files(tmp_path / "server"))
    stranger = _tls_files(tmp_path / "other")
    await server.start()
    try:
        client = client_for(server.url, timeout_s=2.0, tls_ca_file=stranger.ca_file)
        with pytest.raises(RedisConnectionError, match="certificate verify failed"):
            await client.ping()
        await client.aclose()
    finally:
        await server.stop()
