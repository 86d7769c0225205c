"""API keys: Bearer tokens from secret files, identities for limits, refusals."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from firstlight.api.auth import SALT_KEY_PURPOSE, ApiKeys, Caller
from firstlight.config import ApiKeyRef, AuthConfig
from firstlight.errors import AuthenticationError
from firstlight.regions.hop import HopSigner

KEY_A = "sk-firstlight-aaaaaaaaaaaaaaaa"
KEY_B = "sk-firstlight-bbbbbbbbbbbbbbbb"
SALT_KEY = HopSigner("a-peer-key-of-this-deployment", "west").derived_key(SALT_KEY_PURPOSE)


def _keys(
    tmp_path: Path,
    *keys: str,
    tenants: tuple[str | None, ...] = (),
    isolate: bool | None = None,
    salt_key: bytes = SALT_KEY,
) -> ApiKeys:
    refs = []
    for i, key in enumerate(keys):
        path = tmp_path / f"key-{i}"
        path.write_text(f"  {key}\n", encoding="utf-8")  # files from Secrets often end in a newline
        tenant = tenants[i] if i < len(tenants) else None
        refs.append(ApiKeyRef(file=path, tenant=tenant))
    auth = AuthConfig(enabled=True, api_keys=tuple(refs), tenant_isolation=isolate)
    return ApiKeys(auth, salt_key=salt_key)


@pytest.mark.parametrize("authorization", [None, "", "Bearer nothing-configured", "garbage"])
def test_auth_off_accepts_everything_as_anonymous(authorization: str | None) -> None:
    keys = ApiKeys(AuthConfig(enabled=False), salt_key=SALT_KEY)
    assert not keys.enabled
    assert keys.check(authorization) == Caller("anonymous")


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="missing-header"),
        pytest.param("", id="empty-header"),
        pytest.param(f"Basic {KEY_A}", id="wrong-scheme"),
        pytest.param(f"Token {KEY_A}", id="other-scheme"),
        pytest.param(KEY_A, id="no-scheme"),
        pytest.param("Bearer", id="no-token"),
        pytest.param("Bearer    ", id="blank-token"),
        pytest.param("Bearer sk-firstlight-wrong", id="wrong-key"),
        pytest.param(f"Bearer {KEY_A}x", id="key-with-suffix"),
        pytest.param(f"Bearer {KEY_A[:-1]}", id="key-prefix"),
        pytest.param(f"Bearer {KEY_A.upper()}", id="key-case-changed"),
    ],
)
def test_refusals_are_authentication_errors(tmp_path: Path, authorization: str | None) -> None:
    keys = _keys(tmp_path, KEY_A)
    with pytest.raises(AuthenticationError) as caught:
        keys.check(authorization)
    assert caught.value.code == "invalid_api_key"
    assert caught.value.status == 401
    assert KEY_A not in caught.value.message


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {KEY_A}", f"bearer {KEY_A}", f"BEARER {KEY_A}", f"Bearer   {KEY_A}  "],
)
def test_an_accepted_key_returns_a_stable_identity(tmp_path: Path, authorization: str) -> None:
    keys = _keys(tmp_path, KEY_A)
    identity = keys.check(authorization).identity
    assert re.fullmatch(r"[0-9a-f]{16}", identity)
    assert keys.check(f"Bearer {KEY_A}").identity == identity
    assert KEY_A not in identity


def test_identity_is_the_same_across_gateways(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = _keys(tmp_path / "one", KEY_A)
    second = _keys(tmp_path / "two", KEY_B, KEY_A)
    assert first.check(f"Bearer {KEY_A}").identity == second.check(f"Bearer {KEY_A}").identity


def test_every_configured_key_is_accepted_with_its_own_identity(tmp_path: Path) -> None:
    keys = _keys(tmp_path, KEY_A, KEY_B)
    identity_a = keys.check(f"Bearer {KEY_A}").identity
    identity_b = keys.check(f"Bearer {KEY_B}").identity
    assert identity_a != identity_b
    assert re.fullmatch(r"[0-9a-f]{16}", identity_b)


def test_keys_are_read_at_start_up_only(tmp_path: Path) -> None:
    keys = _keys(tmp_path, KEY_A)
    (tmp_path / "key-0").write_text(KEY_B)
    assert re.fullmatch(r"[0-9a-f]{16}", keys.check(f"Bearer {KEY_A}").identity)
    with pytest.raises(AuthenticationError):
        keys.check(f"Bearer {KEY_B}")


KEY_C = "sk-firstlight-cccccccccccccccc"


def test_without_tenants_there_is_no_cache_salt(tmp_path: Path) -> None:
    keys = _keys(tmp_path, KEY_A, KEY_B)
    assert keys.check(f"Bearer {KEY_A}").cache_salt is None
    assert keys.check(f"Bearer {KEY_B}").cache_salt is None


def _salt_elsewhere(tmp_path: Path, key: str, tenant: str, peer_key: str) -> str | None:
    """The salt ``tenant``'s ``key`` gets at another gateway (region ``east``) of a
    deployment whose peer key is ``peer_key``."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    salt_key = HopSigner(peer_key, "east").derived_key(SALT_KEY_PURPOSE)
    keys = _keys(folder, key, tenants=(tenant,), salt_key=salt_key)
    return keys.check(f"Bearer {key}").cache_salt


def test_keys_of_one_tenant_share_a_salt_and_tenants_differ(tmp_path: Path) -> None:
    keys = _keys(tmp_path, KEY_A, KEY_B, KEY_C, tenants=("acme", "acme", "globex"))
    a, b, c = (keys.check(f"Bearer {k}").cache_salt for k in (KEY_A, KEY_B, KEY_C))
    assert a is not None
    assert c is not None
    assert a == b != c
    assert "acme" not in a
    assert KEY_A not in a
    # The salt depends on the tenant and the deployment's peer key only: every gateway
    # and region of the deployment computes the same.
    assert _salt_elsewhere(tmp_path, KEY_C, "acme", "a-peer-key-of-this-deployment") == a


def test_the_salt_is_keyed_by_the_deployments_peer_key(tmp_path: Path) -> None:
    """Knowing a tenant's name is not enough to compute its salt: a deployment with
    another peer key salts the same tenant differently, and no plain digest of the name
    (with or without the domain prefix) is it."""
    keys = _keys(tmp_path, KEY_A, tenants=("acme",))
    salt = keys.check(f"Bearer {KEY_A}").cache_salt
    assert salt is not None
    assert _salt_elsewhere(tmp_path, KEY_A, "acme", "another-deployments-peer-key") != salt
    for name in (b"acme", b"firstlight-tenant/acme"):
        for digest in (hashlib.sha256, hashlib.sha1, hashlib.md5, hashlib.blake2b):
            assert not digest(name).hexdigest().startswith(salt)


def test_isolation_can_be_forced_on_for_keys_without_tenants(tmp_path: Path) -> None:
    keys = _keys(tmp_path, KEY_A, KEY_B, isolate=True)
    a, b = (keys.check(f"Bearer {k}").cache_salt for k in (KEY_A, KEY_B))
    assert a is not None
    assert b is not None
    assert a != b  # each key its own tenant
    off = _keys(tmp_path, KEY_A, tenants=("acme",), isolate=False)
    assert off.check(f"Bearer {KEY_A}").cache_salt is None


def test_a_callers_group_is_its_tenant_else_its_key(tmp_path: Path) -> None:
    keys = _keys(tmp_path, KEY_A, KEY_B, KEY_C, tenants=("acme", "acme", None))
    a, b, c = (keys.check(f"Bearer {k}") for k in (KEY_A, KEY_B, KEY_C))
    assert a.group == b.group == "acme"
    assert c.tenant is None
    assert c.group == c.identity != a.identity
    assert KEY_C not in c.group
