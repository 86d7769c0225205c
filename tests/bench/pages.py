"""The generated sections of the docs pages, as the tests that keep them current read
them: each benchmark writes its section between two HTML comment markers, and a test
compares what the page shows with the render of the stored run."""

from __future__ import annotations

__all__ = ["shown_section"]


def shown_section(page: str, begin: str, end: str) -> str:
    """The text of ``page`` from the ``begin`` marker to the end of the ``end`` marker,
    both included; raises ``ValueError`` when either is missing."""
    return page[page.index(begin) : page.index(end) + len(end)]
