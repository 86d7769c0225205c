"""PlatformConfig: table-driven valid and invalid documents, overrides, and field hygiene."""

from __future__ import annotations

import textwrap
import types
import typing
from collections.abc import Callable
from pathlib import Path

import annotated_types
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from firstlight._config_reference import config_reference_markdown
from firstlight.config import (
    PlatformConfig,
    SecretRef,
    load_config,
    load_config_data,
    parse_config,
)
from firstlight.errors import ConfigError
from tests.conftest import REPO_ROOT

TWO_REGIONS = """
regions:
  - name: us-east
    peers: [{region: eu-west, rtt_ms: 80}]
  - name: eu-west
    peers: [{region: us-east, rtt_ms: 80}]
models:
  - name: m
"""

KUBERNETES = """
mode: kubernetes
region: us-east
regions:
  - name: us-east
    peers: [{region: eu-west, url: "https://eu-west.example.com", rtt_ms: 80}]
  - name: eu-west
models: [{name: m}]
auth:
  enabled: true
  api_keys: [{env: FIRSTLIGHT_API_KEY}]
  peer_secret: {env: FIRSTLIGHT_PEER_SECRET}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def _with(base: str, **changes: object) -> str:
    """``base`` with dotted-path changes applied (``models.0.replicas=-1``)."""
    data = yaml.safe_load(base)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return yaml.safe_dump(data)


VALID: list[tuple[str, str, Callable[[PlatformConfig], bool]]] = [
    (
        "empty-document-gives-local-defaults",
        "",
        lambda c: (
            c.mode == "local"
            and [r.name for r in c.regions] == ["local"]
            and c.models[0].name == "SmolLM2-135M-Instruct"
            and c.router.policy == "firstlight"
            and not c.auth.enabled
        ),
    ),
    (
        "two-regions-with-peers",
        TWO_REGIONS,
        lambda c: c.regions[0].peers[0].region == "eu-west" and c.regions[1].peers[0].rtt_ms == 80,
    ),
    (
        "kubernetes-region",
        KUBERNETES,
        lambda c: c.region == "us-east" and str(c.regions[0].peers[0].url).startswith("https://"),
    ),
    (
        "speculative-ngram",
        _with(TWO_REGIONS, models__0__speculative={"method": "ngram", "prompt_lookup_max": 4}),
        lambda c: (
            c.models[0].speculative is not None and c.models[0].speculative.prompt_lookup_max == 4
        ),
    ),
    (
        "quantized-sim-model",
        _with(TWO_REGIONS, models__0__engine="sim", models__0__quantization="awq"),
        lambda c: c.models[0].engine == "sim" and c.models[0].quantization == "awq",
    ),
]


@pytest.mark.parametrize(("text", "check"), [v[1:] for v in VALID], ids=[v[0] for v in VALID])
def test_valid_documents(
    tmp_path: Path, text: str, check: Callable[[PlatformConfig], bool]
) -> None:
    assert check(load_config(_write(tmp_path, text), environ={}))


# (id, document, expected field path, text the reported problem must contain)
INVALID: list[tuple[str, str, str, str]] = [
    ("malformed-yaml", "regions: [\n  - name: a\n", "", "malformed YAML at line"),
    ("not-a-mapping", "- a\n- b\n", "", "must be a mapping, not list"),
    ("unknown-policy", _with(TWO_REGIONS, router={"policy": "fastest"}), "router.policy", "'fastest'"),
    ("unknown-engine", _with(TWO_REGIONS, models__0__engine="tensorrt"), "models[0].engine", "'tensorrt'"),
    ("negative-replicas", _with(TWO_REGIONS, models__0__replicas=-1), "models[0].replicas", "-1"),
    ("zero-replicas", _with(TWO_REGIONS, models__0__replicas=0), "models[0].replicas", "0"),
    ("duplicate-region", _with(TWO_REGIONS, regions=[{"name": "us-east"}, {"name": "us-east"}]), "regions[1].name", "duplicate region name"),
    (
        "peer-unknown-region",
        _with(TWO_REGIONS, regions__0__peers=[{"region": "mars", "rtt_ms": 5}]),
        "regions[0].peers[0].region",
        "'mars': unknown region; known regions: us-east, eu-west",
    ),
    (
        "peer-is-self",
        _with(TWO_REGIONS, regions__0__peers=[{"region": "us-east", "rtt_ms": 5}]),
        "regions[0].peers[0].region",
        "cannot be its own peer",
    ),
    ("negative-rtt", _with(TWO_REGIONS, regions__0__peers=[{"region": "eu-west", "rtt_ms": -3}]), "regions[0].peers[0].rtt_ms", "-3"),
    ("region-not-dns-label", _with(TWO_REGIONS, regions__1__name="EU West"), "regions[1].name", "'EU West'"),
    ("unknown-field", _with(TWO_REGIONS, router={"polcy": "random"}), "router.polcy", "unknown field"),
    ("block-size", _with(TWO_REGIONS, models__0__block_size=24), "models[0].block_size", "multiple of 16"),
    ("duplicate-model", _with(TWO_REGIONS, models=[{"name": "m"}, {"name": "m"}]), "models[1].name", "duplicate model name"),
    ("no-models", _with(TWO_REGIONS, models=[]), "models", "at least 1 item"),
    ("redis-scheme", _with(TWO_REGIONS, hints={"redis_url": "http://x:6379"}), "hints.redis_url", "'http://x:6379'"),
    ("auth-without-keys", _with(TWO_REGIONS, auth={"enabled": True}), "auth.api_keys", "no API key"),
    (
        "secret-env-and-file",
        _with(TWO_REGIONS, hints={"password": {"env": "A", "file": "/b"}}),
        "hints.password.env",
        "exactly one",
    ),
    (
        "draft-model-missing",
        _with(TWO_REGIONS, models__0__speculative={"method": "eagle"}),
        "models[0].speculative.draft_model",
        "required for method 'eagle'",
    ),
    ("trace-url-without-id", _with(TWO_REGIONS, telemetry={"trace_url": "https://jaeger.example/trace/"}), "telemetry.trace_url", "holding {trace_id}"),
    ("trace-url-not-http", _with(TWO_REGIONS, telemetry={"trace_url": "javascript:x/{trace_id}"}), "telemetry.trace_url", "'javascript:x/{trace_id}'"),
    ("redis-ca-without-tls", _with(TWO_REGIONS, hints={"tls_ca_file": "/ca.pem"}), "hints.tls_ca_file", "needs a rediss:// URL"),
    ("token-quota-zero", _with(TWO_REGIONS, gateway={"max_tokens_per_minute_per_key": 0}), "gateway.max_tokens_per_minute_per_key", "= 0"),
    ("token-quota-not-a-number", _with(TWO_REGIONS, gateway={"max_tokens_per_minute_per_key": "lots"}), "gateway.max_tokens_per_minute_per_key", "'lots'"),
    (
        "token-lease-over-the-quota",
        _with(TWO_REGIONS, gateway={"max_tokens_per_minute_per_key": 100, "token_quota": {"lease_tokens": 500}}),
        "gateway.token_quota.lease_tokens",
        "500: more than the whole quota (max_tokens_per_minute_per_key = 100)",
    ),
    ("token-quota-global-without-redis", _with(TWO_REGIONS, gateway={"token_quota": {"scope": "global"}}), "gateway.token_quota.redis_url", "scope 'global' needs"),
    ("token-quota-region-with-redis", _with(TWO_REGIONS, gateway={"token_quota": {"redis_url": "redis://q:6379/0"}}), "gateway.token_quota.redis_url", "only with scope 'global'"),
    ("token-quota-unknown-fallback", _with(TWO_REGIONS, gateway={"token_quota": {"when_unreachable": "maybe"}}), "gateway.token_quota.when_unreachable", "'maybe'"),
    ("token-quota-deadline", _with(TWO_REGIONS, gateway={"token_quota": {"deadline_ms": 0}}), "gateway.token_quota.deadline_ms", "= 0"),
    ("local-region-unknown", _with(TWO_REGIONS, region="ap-south"), "region", "'ap-south': unknown region"),
    ("kubernetes-needs-region", _with(KUBERNETES, region=None), "region", "required in kubernetes mode"),
    ("kubernetes-needs-auth", _with(KUBERNETES, auth={"enabled": False}), "auth.enabled", "only in local mode"),
    (
        # The regions' hop key: without it a peer's forward could only be told from a
        # client's by headers a client can send (issue: the hop header was a client's).
        "kubernetes-peers-need-a-peer-secret",
        _with(KUBERNETES, auth={"enabled": True, "api_keys": [{"env": "FIRSTLIGHT_API_KEY"}]}),
        "auth.peer_secret",
        "required in kubernetes mode when the region has peers",
    ),
    (
        "kubernetes-peer-needs-url",
        _with(KUBERNETES, regions__0__peers=[{"region": "eu-west", "rtt_ms": 80}]),
        "regions[0].peers[0].url",
        "required in kubernetes mode",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "path", "fragment"), [v[1:] for v in INVALID], ids=[v[0] for v in INVALID]
)
def test_invalid_documents_name_the_field_and_value(
    tmp_path: Path, text: str, path: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text), environ={})
    problems = caught.value.problems
    assert [p.path for p in problems] == [path], problems
    assert fragment in str(problems[0])
    assert "config.yaml" in str(caught.value)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = _with(TWO_REGIONS, models__0__replicas=-1, router={"policy": "x"})
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text), environ={})
    assert sorted(p.path for p in caught.value.problems) == ["models[0].replicas", "router.policy"]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(tmp_path / "absent.yaml", environ={})


def test_environment_overrides_win_over_the_file(tmp_path: Path) -> None:
    env = {
        "FIRSTLIGHT__ROUTER__POLICY": "least_queue",
        "FIRSTLIGHT__MODELS__0__REPLICAS": "3",
        "FIRSTLIGHT__HINTS__TTL_S": "30.5",
        "FIRSTLIGHT_UNRELATED": "ignored",
    }
    config = load_config(_write(tmp_path, TWO_REGIONS), environ=env)
    assert config.router.policy == "least_queue"
    assert config.models[0].replicas == 3
    assert config.hints.ttl_s == 30.5


def test_environment_overrides_apply_without_a_file() -> None:
    config = load_config(None, environ={"FIRSTLIGHT__CACHE_DIR": "/srv/cache"})
    assert config.cache_dir == Path("/srv/cache")
    assert config.default_model_dir == Path("/srv/cache/models/SmolLM2-135M-Instruct")


@pytest.mark.parametrize(
    ("name", "value", "path", "fragment"),
    [
        ("FIRSTLIGHT__MODELS__4__REPLICAS", "2", "FIRSTLIGHT__MODELS__4__REPLICAS", "no list item"),
        (
            "FIRSTLIGHT__MODELS__0__NAME__X",
            "1",
            "FIRSTLIGHT__MODELS__0__NAME__X",
            "inside a scalar",
        ),
        ("FIRSTLIGHT__MODELS__0__REPLICAS", "-2", "models[0].replicas", "-2"),
    ],
)
def test_bad_environment_overrides_are_reported(
    tmp_path: Path, name: str, value: str, path: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, TWO_REGIONS), environ={name: value})
    assert [p.path for p in caught.value.problems] == [path]
    assert fragment in str(caught.value.problems[0])


@pytest.mark.parametrize("example", sorted((REPO_ROOT / "examples").glob("*.yaml")), ids=str)
def test_every_example_is_valid(example: Path) -> None:
    config = load_config(example, environ={})
    assert config.models


def test_the_resolved_config_is_itself_valid_input() -> None:
    config = load_config(REPO_ROOT / "examples" / "kubernetes-us-east.yaml", environ={})
    assert parse_config(config.model_dump(mode="json")) == config


def test_sections_are_immutable() -> None:
    config = PlatformConfig()
    with pytest.raises(ValidationError, match="frozen"):
        config.router.policy = "random"  # type: ignore[misc]


def _sections(model: type[BaseModel]) -> list[type[BaseModel]]:
    found = [model]
    for field in model.model_fields.values():
        for arg in _flatten(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel) and arg not in found:
                found += [s for s in _sections(arg) if s not in found]
    return found


def _flatten(annotation: object) -> list[object]:
    args = typing.get_args(annotation)
    return [annotation] if not args else [a for arg in args for a in _flatten(arg)]


def _numeric(annotation: object) -> bool:
    kinds = {a for a in _flatten(annotation) if a is not types.NoneType}
    return bool(kinds) and kinds <= {int, float}


@pytest.mark.parametrize("section", _sections(PlatformConfig), ids=lambda s: s.__name__)
def test_every_field_has_a_docstring_and_numbers_have_bounds(section: type[BaseModel]) -> None:
    for name, field in section.model_fields.items():
        assert field.description, f"{section.__name__}.{name} has no docstring"
        if _numeric(field.annotation):
            meta = field.metadata
            lower = any(isinstance(m, annotated_types.Ge | annotated_types.Gt) for m in meta)
            upper = any(isinstance(m, annotated_types.Le | annotated_types.Lt) for m in meta)
            assert lower, f"{section.__name__}.{name} has no lower bound"
            assert upper, f"{section.__name__}.{name} has no upper bound"


def test_secret_ref_resolves_environment_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FL_TEST_KEY", "sk-123")
    assert SecretRef(env="FL_TEST_KEY").resolve() == "sk-123"
    secret = tmp_path / "key"
    secret.write_text("sk-456\n")
    assert SecretRef(file=secret).resolve() == "sk-456"


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        (SecretRef(env="FL_TEST_UNSET_KEY"), "environment variable FL_TEST_UNSET_KEY is empty"),
        (SecretRef(file=Path("/nonexistent/key")), "cannot read secret"),
    ],
)
def test_secret_ref_that_cannot_resolve_is_a_config_error(ref: SecretRef, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ref.resolve()


def test_configuration_reference_in_docs_is_current() -> None:
    docs = (REPO_ROOT / "docs" / "configuration.md").read_text()
    begin, end = "<!-- reference:begin -->\n", "<!-- reference:end -->"
    embedded = docs[docs.index(begin) + len(begin) : docs.index(end)]
    assert embedded == config_reference_markdown(), (
        "docs/configuration.md is stale: paste the output of `firstlight config reference`"
    )


def test_inline_config_takes_overrides_without_changing_its_input() -> None:
    """The chart's RayService passes the config inline; overrides still apply."""
    data = {"router": {"policy": "least_queue"}, "models": [{"name": "m", "replicas": 2}]}
    environ = {"FIRSTLIGHT__MODELS__0__REPLICAS": "3", "FIRSTLIGHT__ROUTER__POLICY": "random"}
    config = load_config_data(data, "inline", environ)
    assert (config.models[0].replicas, config.router.policy) == (3, "random")
    assert data == {"router": {"policy": "least_queue"}, "models": [{"name": "m", "replicas": 2}]}
    with pytest.raises(ConfigError, match=r"models\[0\]\.replicas = 0"):
        load_config_data(data, "inline", {"FIRSTLIGHT__MODELS__0__REPLICAS": "0"})


@pytest.mark.parametrize(
    ("adapters", "field", "value"),
    [
        ([{"name": "m2", "path": "/a"}], "models[0].lora_adapters[0].name", "m2"),
        ([{"name": "a", "path": "/a"}, {"name": "a", "path": "/b"}], "lora_adapters[1]", "a"),
        (
            [{"name": "a", "path": "relative/a"}],
            "lora_adapters[0].path",
            "must be an absolute path",
        ),
    ],
)
def test_an_adapter_name_must_be_free_and_its_path_absolute(
    adapters: list[dict[str, str]], field: str, value: str
) -> None:
    data = {"models": [{"name": "m1", "lora_adapters": adapters}, {"name": "m2"}]}
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "test")
    assert field in str(caught.value)
    assert value in str(caught.value)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"engine": "sim"}, "models[0].task = 'embed'"),
        ({"tool_call_parser": "hermes"}, "models[0].tool_call_parser = 'hermes'"),
        ({"lora_adapters": [{"name": "a", "path": "/a"}]}, "models[0].lora_adapters[0].name"),
    ],
)
def test_an_embedding_model_is_real_and_plain(model: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"models": [{"name": "e", "task": "embed", **model}]}, "test")
    assert field in str(caught.value)
