"""The Grafana dashboards and Prometheus alert rules, held to the metric catalog offline.

Every PromQL expression must parse, read only series a Firstlight scrape shows, filter on
labels those series carry, and take quantiles of rates of ``_bucket`` series; every metric
the platform exports must be on a dashboard; the rule file must pass ``promtool check
rules`` and the alerts must fire on the exact series names (``promtool test rules``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from firstlight.telemetry.catalog import CATALOG
from firstlight.telemetry.engine_metrics import VLLM_LABELS, VLLM_PREFIX
from firstlight.telemetry.gateways import GATEWAY_LABEL
from tests.telemetry.promql import (
    REPO_ROOT,
    base_metric_name,
    catalog_series,
    dashboard_expressions,
    dashboard_files,
    iter_nodes,
    metric_names,
    panels,
    parse,
    rule_expressions,
    rule_files,
    selector_names,
    substitute_grafana_variables,
)

ALERTS_TEST = Path(__file__).with_name("alerts_test.yaml")
PROMTOOL_MISSING = (
    "promtool not found: install the `prometheus` Debian package "
    "(`apt-get install prometheus`), which ships /usr/bin/promtool"
)

# Catalog metrics deliberately left off every dashboard, each with its reason. Empty: all
# exported metrics are plotted somewhere. Add an entry only with a comment saying why the
# metric needs no panel (e.g. it only feeds an alert).
NOT_ON_A_DASHBOARD: dict[str, str] = {}

# Alerts the platform promises, and the ones alerts_test.yaml must prove fire.
REQUIRED_ALERTS = {
    "FirstlightTTFTP95AboveSLO",
    "FirstlightHighErrorRatio",
    "FirstlightNoHealthyReplica",
    "FirstlightHintStoreUnreachable",
    "FirstlightPeerUnreachable",
    "FirstlightGatewayMetricsAbsent",
    "FirstlightReplicaMetricsAbsent",
}
MUST_FIRE_IN_UNIT_TESTS = {
    "FirstlightNoHealthyReplica",
    "FirstlightHintStoreUnreachable",
    "FirstlightPeerUnreachable",
    "FirstlightTTFTP95AboveSLO",
    "FirstlightGatewayMetricsAbsent",
    "FirstlightReplicaMetricsAbsent",
}

# Labels the scrape (job, instance) or the histogram (le) add to every series, and the
# gateway each sample came from (firstlight.telemetry.gateways labels the region's scrape).
SCRAPE_LABELS = {"job", "instance", GATEWAY_LABEL}
_SPECS = {m.prometheus_name: m for m in CATALOG}


def _labels_of(series: str) -> set[str]:
    """The label names a catalog series carries (``le`` too on ``_bucket``); a ``vllm:*``
    series carries vLLM's labels and the replica's (no ``gateway``: no gateway measured
    it, :mod:`firstlight.telemetry.engine_metrics`)."""
    if series.startswith(VLLM_PREFIX):
        le = {"le"} if series.endswith("_bucket") else set()
        return set(VLLM_LABELS) | {"job", "instance"} | le
    spec = _SPECS[base_metric_name(series)]
    labels = {a.replace(".", "_") for a in spec.attributes} | SCRAPE_LABELS
    if series.endswith("_bucket") and spec.kind == "histogram":
        labels.add("le")
    return labels


def _all_expressions() -> list[tuple[str, str, str]]:
    found = [
        (p.name, where, expr) for p in dashboard_files() for where, expr in dashboard_expressions(p)
    ]
    found += [(p.name, name, expr) for p in rule_files() for name, expr in rule_expressions(p)]
    return found


ALL_EXPRESSIONS = _all_expressions()
EXPR_IDS = [f"{file}:{where}" for file, where, _ in ALL_EXPRESSIONS]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(promtool).exists():
        pytest.fail(PROMTOOL_MISSING)
    result = subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=60, check=False, cwd=REPO_ROOT
    )
    assert result.returncode == 0, (
        f"promtool {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    )
    return result


# --- what the checks find (tested on deliberately broken expressions below) ---------------


def unknown_metrics(expr: str) -> set[str]:
    """Series ``expr`` reads that no Firstlight scrape shows."""
    return metric_names(expr) - catalog_series()


def bad_histogram_quantiles(expr: str) -> list[str]:
    """The ``histogram_quantile`` calls of ``expr`` not taken over ``rate``/``increase``
    of a ``_bucket`` series (aggregated ``by`` something including ``le``)."""

    def over_bucket_rates(node: Any) -> bool:
        if isinstance(node, promql_parser.ParenExpr):
            return over_bucket_rates(node.expr)
        if isinstance(node, promql_parser.AggregateExpr):
            modifier = node.modifier  # None: `sum(...)` drops le
            by = modifier is not None and modifier.type == promql_parser.AggModifierType.By
            keeps_le = modifier is not None and ("le" in modifier.labels) == by
            return keeps_le and over_bucket_rates(node.expr)
        if isinstance(node, promql_parser.BinaryExpr):  # e.g. a sum of two rates
            return over_bucket_rates(node.lhs) and over_bucket_rates(node.rhs)
        if isinstance(node, promql_parser.Call) and node.func.name in ("rate", "increase"):
            (matrix,) = node.args
            if not isinstance(matrix, promql_parser.MatrixSelector):
                return False
            names = selector_names(matrix.vector_selector)
            return bool(names) and all(n.endswith("_bucket") for n in names)
        return False

    return [
        str(node)
        for node in iter_nodes(parse(expr))
        if isinstance(node, promql_parser.Call)
        and node.func.name == "histogram_quantile"
        and not over_bucket_rates(node.args[1])
    ]


def label_problems(expr: str) -> list[str]:
    """Labels ``expr`` filters or groups on that the series beneath carry not."""
    problems: list[str] = []
    for node in iter_nodes(parse(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            for name in selector_names(node) & catalog_series():
                for matcher in node.matchers.matchers:
                    if matcher.name != "__name__" and matcher.name not in _labels_of(name):
                        problems.append(f"{name} has no label {matcher.name!r}")
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            if node.modifier.type != promql_parser.AggModifierType.By:
                continue
            below: set[str] = set()
            for inner in iter_nodes(node.expr):
                if isinstance(inner, promql_parser.VectorSelector):
                    for name in selector_names(inner) & catalog_series():
                        below |= _labels_of(name)
            missing = set(node.modifier.labels) - below
            if missing:
                problems.append(f"{node.op} by {sorted(missing)}: no series below has them")
    return problems


# --- the helpers themselves ----------------------------------------------------------------


def test_substitution_makes_grafana_expressions_valid_promql() -> None:
    expr = 'sum by (le) (rate(x_bucket{region=~"$region", model=~"${model}"}[$__rate_interval]))'
    out = substitute_grafana_variables(expr)
    assert out == 'sum by (le) (rate(x_bucket{region=~".*", model=~".*"}[1m]))'
    assert "$" not in substitute_grafana_variables("rate(x[$__interval]) + y[$__range]")
    with pytest.raises(ValueError, match=r"."):
        promql_parser.parse(expr)  # why substitution is needed
    parse(expr)


def test_metric_names_walks_the_whole_ast() -> None:
    expr = (
        "-(sum by (a) (rate(a_total[5m]))) + on (x) group_left() topk(3, b)"
        ' + max_over_time(c[10m:1m]) + {__name__="d"} + count_values("v", e)'
        " + histogram_quantile(0.9, rate(f_bucket[1m])) > bool 1"
    )
    assert metric_names(expr) == {"a_total", "b", "c", "d", "e", "f_bucket"}
    assert metric_names('{__name__="g" or __name__="h"}') == {"g", "h"}
    assert metric_names("1 + 2") == set()


def test_base_metric_name_maps_histogram_series_only() -> None:
    ttft = "gen_ai_server_time_to_first_token_seconds"
    assert base_metric_name(ttft + "_bucket") == ttft
    assert base_metric_name(ttft + "_sum") == ttft
    assert base_metric_name(ttft + "_count") == ttft
    assert base_metric_name("firstlight_route_decisions_total") == (
        "firstlight_route_decisions_total"
    )
    # A gauge's name is never cut, even if it ends like a histogram series.
    assert base_metric_name("firstlight_replicas_healthy_count") == (
        "firstlight_replicas_healthy_count"
    )


@pytest.mark.parametrize(
    "expr",
    [
        "gen_ai_server_time_to_first_token_bucket",  # unit suffix missing
        "rate(firstlight_route_decisions[5m])",  # _total missing
        'firstlight_replica_queue_depth{state="waiting"} + firstlight_replica_kv_cache_usage_ratio',
        '{__name__="firstlight_peer_up_total"}',
        "firstlight_replicas_healthy_bucket",  # a gauge has no buckets
    ],
)
def test_a_wrong_metric_name_is_caught(expr: str) -> None:
    assert unknown_metrics(expr)


@pytest.mark.parametrize(
    "expr",
    [
        "histogram_quantile(0.95, gen_ai_server_time_to_first_token_seconds_bucket)",
        "histogram_quantile(0.95, sum by (region) (rate(gen_ai_server_time_to_first_token_seconds_bucket[5m])))",
        "histogram_quantile(0.95, sum(rate(gen_ai_server_time_to_first_token_seconds_bucket[5m])))",
        "histogram_quantile(0.95, sum by (le) (rate(gen_ai_server_time_to_first_token_seconds_count[5m])))",
        "histogram_quantile(0.95, sum by (le) (delta(gen_ai_server_time_to_first_token_seconds_bucket[5m])))",
    ],
)
def test_a_bad_histogram_quantile_is_caught(expr: str) -> None:
    assert bad_histogram_quantiles(expr)
    good = "histogram_quantile(0.95, sum by (le, region) (rate(gen_ai_server_time_to_first_token_seconds_bucket[5m])))"
    assert not bad_histogram_quantiles(good)


@pytest.mark.parametrize(
    "expr",
    [
        'firstlight_peer_up{region="eu", model="m"}',  # peers have no model label
        'rate(gen_ai_server_request_duration_seconds_count{error_type=~"5.."}[5m]) + rate(gen_ai_server_time_to_first_token_seconds_count{error_type="503"}[5m])',
        'firstlight_replica_queue_depth{gen_ai_token_type="output"}',
        "sum by (replica) (firstlight_replicas_healthy)",
        "sum by (le) (rate(gen_ai_server_time_to_first_token_seconds_sum[5m]))",
    ],
)
def test_a_wrong_label_is_caught(expr: str) -> None:
    assert label_problems(expr)


# --- dashboards ----------------------------------------------------------------------------


def test_dashboards_and_rules_exist() -> None:
    names = {p.name for p in dashboard_files()}
    assert "firstlight-overview.json" in names
    assert [p.name for p in rule_files()] == ["alerts.yaml"]


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.name)
def test_dashboard_has_datasource_region_and_model_variables(path: Path) -> None:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    assert dashboard.get("uid"), "a fixed uid keeps links to the dashboard stable"
    assert dashboard.get("schemaVersion", 0) >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("region", "model"):
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["multi"] is True
        assert variable["includeAll"] is True
        assert variable["datasource"]["uid"] == "${datasource}"
    exprs = dict(dashboard_expressions(path))
    assert metric_names(exprs["variable region"]) == {
        "gen_ai_server_time_to_first_token_seconds_count"
    }


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(p.read_text(encoding="utf-8"))["uid"] for p in dashboard_files()]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.name)
def test_every_panel_queries_the_datasource_variable(path: Path) -> None:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    problems = []
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        title = panel.get("title") or f"panel {panel.get('id')}"
        if panel.get("datasource", {}).get("uid") not in ("${datasource}", "$datasource"):
            problems.append(f"{title}: datasource is {panel.get('datasource')}")
        targets = [t for t in panel.get("targets", []) if str(t.get("expr", "")).strip()]
        if not targets:
            problems.append(f"{title}: no target with an expr")
        for target in targets:
            uid = target.get("datasource", {}).get("uid", "${datasource}")
            if uid not in ("${datasource}", "$datasource"):
                problems.append(f"{title} {target.get('refId')}: datasource {uid}")
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append(f"{title}: no unit")
        if not panel.get("description"):
            problems.append(f"{title}: no description")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.name)
def test_every_panel_follows_the_region_and_model_variables(path: Path) -> None:
    """A panel that ignored $region or $model would show the wrong regions' data."""
    problems = []
    for where, expr in dashboard_expressions(path, include_variables=False):
        marked = expr.replace('"$region"', '"VAR:region"').replace('"$model"', '"VAR:model"')
        for node in iter_nodes(parse(marked)):
            if not isinstance(node, promql_parser.VectorSelector):
                continue
            filters = {(m.name, m.value) for m in node.matchers.matchers}
            for name in selector_names(node) & catalog_series():
                for label in ("region", "model"):
                    if label in _labels_of(name) and (label, f"VAR:{label}") not in filters:
                        problems.append(f"{where}: {name} not filtered by ${label}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("file", "where", "expr"), ALL_EXPRESSIONS, ids=EXPR_IDS)
def test_expression_parses(file: str, where: str, expr: str) -> None:
    try:
        parse(expr)
    except ValueError as error:
        pytest.fail(f"{file} / {where}: {error}\n{substitute_grafana_variables(expr)}")


def test_prometheus_itself_parses_the_dashboard_expressions(tmp_path: Path) -> None:
    """promql_parser is a port; Prometheus' own parser (via promtool) has the last word."""
    rules = [
        {"record": f"firstlight_dashboard_check:expr{i}", "expr": substitute_grafana_variables(e)}
        for i, (_, _, e) in enumerate(ALL_EXPRESSIONS)
    ]
    path = tmp_path / "dashboard-expressions.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
    _run("check", "rules", str(path))


@pytest.mark.parametrize(("file", "where", "expr"), ALL_EXPRESSIONS, ids=EXPR_IDS)
def test_expression_reads_only_catalog_series(file: str, where: str, expr: str) -> None:
    assert metric_names(expr), f"{file} / {where} reads no series"
    assert not unknown_metrics(expr), f"{file} / {where}: not in the catalog"


@pytest.mark.parametrize(("file", "where", "expr"), ALL_EXPRESSIONS, ids=EXPR_IDS)
def test_expression_uses_labels_the_series_carry(file: str, where: str, expr: str) -> None:
    problems = label_problems(expr)
    assert not problems, f"{file} / {where}:\n" + "\n".join(problems)


@pytest.mark.parametrize(("file", "where", "expr"), ALL_EXPRESSIONS, ids=EXPR_IDS)
def test_histogram_quantile_over_bucket_rates(file: str, where: str, expr: str) -> None:
    assert not bad_histogram_quantiles(expr), f"{file} / {where}"


def test_every_catalog_metric_is_on_a_dashboard() -> None:
    plotted = {
        base_metric_name(name)
        for path in dashboard_files()
        for _, expr in dashboard_expressions(path, include_variables=False)
        for name in metric_names(expr)
    }
    exported = {m.prometheus_name for m in CATALOG}
    assert set(NOT_ON_A_DASHBOARD) <= exported, "exemptions for metrics no longer exported"
    invisible = exported - plotted - set(NOT_ON_A_DASHBOARD)
    assert not invisible, f"exported but on no dashboard panel: {sorted(invisible)}"


# --- alert rules ---------------------------------------------------------------------------


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in rule_files()
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
    ]


def test_required_alerts_are_defined_completely() -> None:
    alerts = {rule["alert"]: rule for rule in _rules() if "alert" in rule}
    assert set(alerts) >= REQUIRED_ALERTS
    for name, rule in alerts.items():
        assert rule.get("for"), f"{name}: no `for`"
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert rule["annotations"]["summary"], name
        assert "$labels.region" in rule["annotations"]["description"], name


def test_recording_rules_do_not_shadow_catalog_names() -> None:
    records = {rule["record"] for rule in _rules() if "record" in rule}
    exported = catalog_series() | {m.name for m in CATALOG}
    assert not records & exported


def test_slo_alerts_take_the_threshold_from_the_exported_slo() -> None:
    alerts = {rule["alert"]: rule["expr"] for rule in _rules() if "alert" in rule}
    assert "firstlight_slo_time_to_first_token_seconds" in metric_names(
        alerts["FirstlightTTFTP95AboveSLO"]
    )
    if "FirstlightTPOTP95AboveSLO" in alerts:
        assert "firstlight_slo_time_per_output_token_seconds" in metric_names(
            alerts["FirstlightTPOTP95AboveSLO"]
        )


@pytest.mark.parametrize("path", rule_files(), ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    _run("check", "rules", str(path))


def test_alert_unit_tests_cover_the_required_alerts() -> None:
    cases = yaml.safe_load(ALERTS_TEST.read_text(encoding="utf-8"))
    rule_paths = {(ALERTS_TEST.parent / f).resolve() for f in cases["rule_files"]}
    assert rule_paths == {p.resolve() for p in rule_files()}
    fired = {
        check["alertname"]
        for case in cases["tests"]
        for check in case.get("alert_rule_test", [])
        if check.get("exp_alerts")
    }
    silent = {
        check["alertname"]
        for case in cases["tests"]
        for check in case.get("alert_rule_test", [])
        if not check.get("exp_alerts")
    }
    assert fired >= MUST_FIRE_IN_UNIT_TESTS
    assert "FirstlightTTFTP95AboveSLO" in silent
    # The inputs are real series names, so the cases test the names the rules use.
    for case in cases["tests"]:
        for series in case.get("input_series", []):
            name = series["series"].split("{", 1)[0]
            assert name in catalog_series(), f"{case['name']}: {name} is not exported"


def test_promtool_test_rules() -> None:
    """The alerts fire on the exact series names the exporter produces (and not under the
    SLO); promtool resolves alerts_test.yaml's rule_files relative to it."""
    result = _run("test", "rules", str(ALERTS_TEST))
    assert "SUCCESS" in result.stdout + result.stderr
