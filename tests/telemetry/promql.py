"""Helpers that read the Grafana dashboards and Prometheus rules and take their PromQL apart.

No tests live here: :mod:`tests.telemetry.test_dashboards` uses these to hold the
dashboards and alert rules to the metric catalog. Expressions are parsed with
``promql_parser`` (the Prometheus parser compiled from Rust), never picked at with regexes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from firstlight.telemetry.catalog import CATALOG
from firstlight.telemetry.engine_metrics import VLLM_SERIES

try:
    from tests.conftest import REPO_ROOT
except ImportError:  # pragma: no cover - only when imported outside the test tree
    REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = [
    "DASHBOARD_DIR",
    "HISTOGRAM_SUFFIXES",
    "REPO_ROOT",
    "base_metric_name",
    "catalog_series",
    "children",
    "dashboard_expressions",
    "dashboard_files",
    "iter_nodes",
    "metric_names",
    "panels",
    "parse",
    "rule_expressions",
    "rule_files",
    "selector_names",
    "substitute_grafana_variables",
]

DASHBOARD_DIR = REPO_ROOT / "helm" / "firstlight" / "dashboards"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# Grafana's range variables; any valid duration makes the expression parse.
_RANGE_VARIABLES = ("$__rate_interval", "$__interval", "$__range", "$__interval_ms")
_RANGE_VALUE = "1m"
# What a template variable like ``$region`` stands for inside ``=~"..."``: anything.
_VARIABLE_VALUE = ".*"


def dashboard_files() -> list[Path]:
    """The Grafana dashboards (``*.json``) shipped with the Helm chart."""
    return sorted(DASHBOARD_DIR.glob("*.json"))


def rule_files() -> list[Path]:
    """The Prometheus rule files (``*.yaml``) shipped with the Helm chart (not the
    ``promtool test rules`` inputs, which live with the tests)."""
    return sorted(p for p in DASHBOARD_DIR.glob("*.y*ml") if "groups" in _load_yaml(p))


def _load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard, rows and the panels nested in (collapsed) rows
    included, depth first."""

    def walk(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from walk(panel.get("panels", []))

    yield from walk(dashboard.get("panels", []))
    for row in dashboard.get("rows", []):  # the pre-5.0 schema, should one sneak in
        yield from walk(row.get("panels", []))


def _variable_promql(query: Any) -> str | None:
    """The PromQL inside a Prometheus template-variable query, or None.

    ``label_values(<selector>, label)`` and ``query_result(<expr>)`` hold PromQL;
    ``label_values(label)``, ``label_names()`` and ``metrics(...)`` do not.
    """
    if isinstance(query, dict):
        query = query.get("query", "")
    if not isinstance(query, str):
        return None
    text = query.strip()
    for function in ("label_values", "query_result"):
        if text.startswith(function + "(") and text.endswith(")"):
            inner = text[len(function) + 1 : -1].strip()
            if function == "label_values":
                # The label is the last argument; a selector's own commas sit in braces.
                selector, comma, _label = inner.rpartition(",")
                return selector.strip() if comma and selector.strip() else None
            return inner or None
    return None


def dashboard_expressions(path: Path, *, include_variables: bool = True) -> list[tuple[str, str]]:
    """``(where, expr)`` for every PromQL expression of a dashboard: each panel target
    (``where`` is the panel title) and, unless ``include_variables`` is false, each
    template-variable query holding PromQL (``where`` is ``"variable <name>"``)."""
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    found: list[tuple[str, str]] = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if isinstance(expr, str) and expr.strip():
                found.append((panel.get("title", "<untitled>"), expr))
    if include_variables:
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable.get("type") != "query":
                continue
            expr = _variable_promql(variable.get("query")) or _variable_promql(
                variable.get("definition")
            )
            if expr:
                found.append((f"variable {variable.get('name')}", expr))
    return found


def rule_expressions(path: Path) -> list[tuple[str, str]]:
    """``(alert or record name, expr)`` for every rule of a Prometheus rule file."""
    found: list[tuple[str, str]] = []
    for group in _load_yaml(path).get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record") or "<unnamed>"
            found.append((name, str(rule["expr"])))
    return found


def substitute_grafana_variables(expr: str) -> str:
    """``expr`` with Grafana's variables replaced so it is plain, valid PromQL: range
    variables by ``1m``, template variables (``$region``, ``${model}``, ``[[x]]``) by
    ``.*`` (they are only ever used inside ``=~"..."`` matchers)."""
    for variable in sorted(_RANGE_VARIABLES, key=len, reverse=True):
        expr = expr.replace("${" + variable[1:] + "}", _RANGE_VALUE)
        expr = expr.replace(variable, _RANGE_VALUE)
    out: list[str] = []
    i = 0
    while i < len(expr):
        char = expr[i]
        if char == "$" and expr.startswith("${", i) and "}" in expr[i:]:
            i = expr.index("}", i) + 1
            out.append(_VARIABLE_VALUE)
        elif char == "$" and i + 1 < len(expr) and (expr[i + 1].isalnum() or expr[i + 1] == "_"):
            i += 1
            while i < len(expr) and (expr[i].isalnum() or expr[i] == "_"):
                i += 1
            out.append(_VARIABLE_VALUE)
        elif expr.startswith("[[", i) and "]]" in expr[i:]:
            i = expr.index("]]", i) + 2
            out.append(_VARIABLE_VALUE)
        else:
            out.append(char)
            i += 1
    return "".join(out)


def parse(expr: str) -> promql_parser.Expr:
    """The AST of ``expr`` (Grafana variables substituted first); ``ValueError`` if it
    is not valid PromQL."""
    return promql_parser.parse(substitute_grafana_variables(expr))


def children(node: Any) -> list[Any]:
    """The direct sub-expressions of an AST node."""
    if isinstance(node, promql_parser.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, promql_parser.AggregateExpr):
        return [n for n in (node.param, node.expr) if n is not None]
    if isinstance(node, promql_parser.Call):
        return list(node.args)
    if isinstance(node, promql_parser.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, promql_parser.SubqueryExpr | promql_parser.ParenExpr):
        return [node.expr]
    if isinstance(node, promql_parser.UnaryExpr):
        return [node.expr]
    if isinstance(
        node,
        promql_parser.VectorSelector | promql_parser.NumberLiteral | promql_parser.StringLiteral,
    ):
        return []
    raise TypeError(f"unknown PromQL node {type(node).__name__}: {node!r}")


def iter_nodes(node: Any) -> Iterator[Any]:
    """``node`` and every node below it, depth first."""
    yield node
    for child in children(node):
        yield from iter_nodes(child)


def selector_names(selector: promql_parser.VectorSelector) -> set[str]:
    """The metric names a vector selector selects: its name, or ``__name__="x"`` matchers
    (an ``or`` of matcher sets may name several)."""
    if selector.name:
        return {selector.name}
    names: set[str] = set()
    for matchers in [selector.matchers.matchers, *selector.matchers.or_matchers]:
        for matcher in matchers:
            if matcher.name == "__name__":
                if matcher.op != promql_parser.MatchOp.Equal:
                    raise ValueError(f"metric name matched by {matcher.op}: {selector}")
                names.add(matcher.value)
    return names


def metric_names(expr: str) -> set[str]:
    """The series names ``expr`` reads (``x_bucket`` stays ``x_bucket``)."""
    return {
        name
        for node in iter_nodes(parse(expr))
        if isinstance(node, promql_parser.VectorSelector)
        for name in selector_names(node)
    }


def _histograms() -> set[str]:
    return {m.prometheus_name for m in CATALOG if m.kind == "histogram"}


def catalog_series() -> set[str]:
    """Every series name a scrape of Firstlight can show: the catalog's Prometheus names,
    with ``_bucket``, ``_sum`` and ``_count`` for histograms, and the ``vllm:*`` series the
    replicas add (:data:`~firstlight.telemetry.engine_metrics.VLLM_SERIES`)."""
    series: set[str] = set(VLLM_SERIES)
    for m in CATALOG:
        if m.kind == "histogram":
            series.update(m.prometheus_name + suffix for suffix in HISTOGRAM_SUFFIXES)
        else:
            series.add(m.prometheus_name)
    return series


def base_metric_name(series: str) -> str:
    """The catalog's Prometheus name behind ``series``: ``x_bucket``, ``x_sum`` and
    ``x_count`` map to ``x`` when ``x`` is a histogram; anything else is itself."""
    histograms = _histograms()
    for suffix in HISTOGRAM_SUFFIXES:
        if series.endswith(suffix) and series.removesuffix(suffix) in histograms:
            return series.removesuffix(suffix)
    return series
