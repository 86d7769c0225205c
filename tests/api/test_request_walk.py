"""The walk of one request through the package's parts (:mod:`tests.request_walk`): the
page draws the traced walk, and the trace shows one decision per request."""

from __future__ import annotations

import pytest

from tests.request_walk import PAGE, Walk, render_walk, shown_walk, trace_walk


@pytest.fixture(scope="module")
def walk() -> Walk:
    return trace_walk()


def test_the_page_draws_the_walk_the_code_takes(walk: Walk) -> None:
    assert shown_walk(PAGE.read_text()) == render_walk(walk), (
        "docs/architecture.md's walk is stale: run `python -m tests.request_walk`"
    )


def test_one_request_is_ranked_once_and_its_ticket_carries_it(walk: Walk) -> None:
    assert walk.called["FirstlightPolicy.choose"] == 1, "one decision per request"
    for step in ("RouterState.admit", "Ticket.commit", "Ticket.first_token", "Ticket.finished"):
        assert walk.called[step] == 1, step
    assert walk.calls[("api", "serve")] >= 1, "the gateway hands the request to its backend"
    assert ("serve", "api") not in walk.calls, "the backend never calls back into the HTTP layer"
