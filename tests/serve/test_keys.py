"""The keys a region's deployments share (:mod:`firstlight.serve.keys`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstlight.config import parse_config
from firstlight.errors import ConfigError
from firstlight.serve.keys import LAUNCHER_KEY, launcher_key, region_keys


def test_without_a_peer_secret_the_launchers_key_is_handed_over_and_used() -> None:
    config = parse_config({"regions": [{"name": "east"}]})
    assert launcher_key(config) == LAUNCHER_KEY
    keys = region_keys(config, "east", launcher_key(config))
    assert keys.peer == LAUNCHER_KEY
    # The gateway and the replicas of one region derive the same port key; another
    # region's differs, so one region's port key opens no other region's ports.
    assert keys.port == region_keys(config, "east", LAUNCHER_KEY).port
    assert keys.port != region_keys(config, "west", LAUNCHER_KEY).port


def test_a_configured_peer_secret_wins_and_is_resolved_by_the_deployment(tmp_path: Path) -> None:
    secret = tmp_path / "peer"
    secret.write_text("s" * 40 + "\n")
    config = parse_config(
        {"regions": [{"name": "east"}], "auth": {"peer_secret": {"file": str(secret)}}}
    )
    assert launcher_key(config) is None  # nothing secret travels in the app's arguments
    assert region_keys(config, "east", None).peer == "s" * 40


def test_a_short_or_missing_peer_key_names_the_field(tmp_path: Path) -> None:
    short = tmp_path / "peer"
    short.write_text("tooshort")
    config = parse_config(
        {"regions": [{"name": "east"}], "auth": {"peer_secret": {"file": str(short)}}}
    )
    with pytest.raises(ConfigError, match=r"auth\.peer_secret.*at least 16 characters"):
        region_keys(config, "east", None)
    unset = parse_config(
        {"regions": [{"name": "east"}], "auth": {"peer_secret": {"env": "FL_TEST_UNSET_PEER"}}}
    )
    with pytest.raises(ConfigError, match="FL_TEST_UNSET_PEER"):
        region_keys(unset, "east", None)
