"""Every alert links its section of ``docs/runbook.md``, and the runbook has one section
per alert, each saying what the alert means, what to check and how to fix it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.telemetry.promql import REPO_ROOT, rule_files

RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
PARTS = ("**What it means.**", "**What to check.**", "**How to fix.**")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _sections(text: str) -> dict[str, str]:
    """``## `` sections of the runbook: anchor → body."""
    found: dict[str, str] = {}
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        found[github_anchor(heading)] = body
    return found


def _alerts() -> dict[str, dict[str, str]]:
    """Alert name → its annotations, over every shipped rule file."""
    return {
        rule["alert"]: rule.get("annotations", {})
        for path in rule_files()
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


SECTIONS = _sections(RUNBOOK.read_text(encoding="utf-8"))
ALERTS = _alerts()


def test_github_anchor_matches_githubs_rules() -> None:
    assert github_anchor("FirstlightTTFTP95AboveSLO") == "firstlightttftp95aboveslo"
    assert github_anchor("Before you start: `kubectl` access") == "before-you-start-kubectl-access"


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_alert_links_an_existing_runbook_section(alert: str) -> None:
    url = ALERTS[alert].get("runbook_url", "")
    path, _, anchor = url.partition("#")
    assert (REPO_ROOT / path).resolve() == RUNBOOK.resolve(), f"{alert}: {url!r}"
    assert anchor in SECTIONS, f"{alert}: no heading for #{anchor} in docs/runbook.md"
    assert anchor == github_anchor(alert), f"{alert}: link the alert's own section"


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_section_says_what_it_means_what_to_check_and_how_to_fix(alert: str) -> None:
    body = SECTIONS.get(github_anchor(alert), "")
    missing = [part for part in PARTS if part not in body]
    assert not missing, f"{alert}: its runbook section lacks {missing}"


def test_the_runbook_has_a_section_per_alert_and_no_orphan() -> None:
    alert_anchors = {github_anchor(a) for a in ALERTS}
    alert_sections = {a for a in SECTIONS if a.startswith("firstlight")}
    assert alert_sections == alert_anchors


def test_readme_links_the_runbook() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/runbook.md)" in readme


def test_runbook_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", RUNBOOK.read_text(encoding="utf-8")):
        if target.startswith("http"):
            continue
        assert (RUNBOOK.parent / target).exists(), target


def test_runbook_path_is_where_the_rules_say() -> None:
    assert Path("docs/runbook.md") == RUNBOOK.relative_to(REPO_ROOT)
