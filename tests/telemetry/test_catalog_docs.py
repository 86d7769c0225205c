"""The metric table in docs/observability.md lists exactly the catalog's metrics."""

from __future__ import annotations

import re

from firstlight.telemetry import CATALOG
from tests.conftest import REPO_ROOT


def test_docs_list_every_exported_metric_and_no_other() -> None:
    text = (REPO_ROOT / "docs" / "observability.md").read_text()
    table = set(re.findall(r"^\| `((?:gen_ai|firstlight)_[a-z_]+)` \|", text, re.MULTILINE))
    assert table == {spec.prometheus_name for spec in CATALOG}


def test_catalog_names_are_unique_and_histograms_have_buckets() -> None:
    names = [spec.name for spec in CATALOG]
    assert len(names) == len(set(names))
    for spec in CATALOG:
        assert (spec.kind == "histogram") == bool(spec.buckets), spec.name
        assert list(spec.buckets) == sorted(spec.buckets), spec.name
