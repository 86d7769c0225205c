"""A RAG workload with known answers, for dynamic context loading
(:mod:`firstlight.api.context`): each question comes with five retrieved documents about
five fictional facilities of the same kind, one of which holds the answer.

The documents are alike on purpose — same template, same vocabulary, only the names and
facts differ — so that choosing the right one takes the question's meaning (the facility's
name and what is asked), as in a real retrieval set where every hit is on topic. Seeded
and deterministic: the same seed gives the same cases. Pure: no I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RagCase", "rag_cases"]

_SYLLABLES = ("ka", "lo", "mer", "vin", "tas", "ro", "de", "bel", "quin", "sa", "tor", "ly")
_KINDS = ("observatory", "seed vault", "tidal power station", "glacier laboratory")
_CITIES = (
    "Lisbon", "Tromsø", "Valparaíso", "Hobart", "Reykjavik", "Dakar", "Osaka", "Tallinn",
    "Quito", "Nairobi", "Perth", "Montreal", "Bergen", "Cusco", "Hanoi", "Windhoek",
)  # fmt: skip
_MATERIALS = ("basalt", "cedar", "granite", "steel", "limestone", "glass", "copper", "oak")
_FILLER = (
    "Visitors arrive by a narrow road that follows the coast for several kilometres.",
    "The operating team publishes a yearly report on maintenance and energy use.",
    "Local schools organise guided tours during the spring and autumn terms.",
    "A small museum beside the entrance shows photographs from the construction years.",
    "Funding comes from a mix of public grants and long-term research partnerships.",
    "The site has been renovated twice, each time keeping its original outline.",
    "Weather records from the site are shared with the national meteorological office.",
    "Staff rotate between day and night shifts so the instruments are never unattended.",
    "A library on the upper floor holds technical manuals and early correspondence.",
    "The facility hosts an open day each summer with talks by the engineers.",
)


@dataclass(frozen=True, slots=True)
class RagCase:
    """One question, its retrieved documents, which one answers it, and the answer."""

    question: str
    documents: tuple[str, ...]
    relevant: int
    answer: str


@dataclass(frozen=True, slots=True)
class _Facility:
    name: str
    kind: str
    city: str
    year: int
    material: str


def rag_cases(seed: int, questions: int, documents: int = 5, filler: int = 40) -> list[RagCase]:
    """``questions`` cases of ``documents`` documents each (about ``filler`` sentences of
    background per document: some 620 tokens with SmolLM2's tokenizer at 40)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(questions):
        kind = rng.choice(_KINDS)
        facilities = _distinct_facilities(rng, kind, documents)
        relevant = rng.randrange(documents)
        target = facilities[relevant]
        ask, answer = rng.choice(
            [
                (f"In which city is the {target.name} {kind}?", target.city),
                (f"In which year did the {target.name} {kind} open?", str(target.year)),
                (f"What material is the {target.name} {kind} built from?", target.material),
            ]
        )
        texts = tuple(_document(rng, f, filler) for f in facilities)
        cases.append(RagCase(ask, texts, relevant, answer))
    return cases


def _distinct_facilities(rng: random.Random, kind: str, count: int) -> list[_Facility]:
    names: set[str] = set()
    while len(names) < count:
        names.add("".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize())
    cities = rng.sample(_CITIES, count)
    years = rng.sample(range(1950, 2020), count)
    materials = [rng.choice(_MATERIALS) for _ in range(count)]
    return [
        _Facility(name, kind, city, year, material)
        for name, city, year, material in zip(sorted(names), cities, years, materials, strict=True)
    ]


def _document(rng: random.Random, facility: _Facility, filler: int) -> str:
    facts = [
        f"The {facility.name} {facility.kind} is in {facility.city}.",
        f"The {facility.name} {facility.kind} opened in {facility.year}.",
        f"The {facility.name} {facility.kind} is built from {facility.material}.",
    ]
    background = [rng.choice(_FILLER) for _ in range(filler)]
    for i, fact in enumerate(facts):
        background.insert(rng.randrange(len(background) + 1) if i else 0, fact)
    return f"About the {facility.name} {facility.kind}. " + " ".join(background)
