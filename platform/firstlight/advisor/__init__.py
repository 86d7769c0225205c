"""The prefix-cache advisor: per caller group and model, the share of prompt tokens served
from cache, why the rest was not, and the time to first token a fix would save.

* :mod:`firstlight.advisor.chunks` — content-defined chunks of a prompt (equal content,
  equal chunks, wherever it sits).
* :mod:`firstlight.advisor.ledger` — :class:`PrefixAdvisor`, fed one
  :class:`PromptSample` per request served here by the gateway's telemetry and read by
  the dashboard and ``GET /v1/firstlight/advisor``.

Pure: no Ray, FastAPI, Redis or clock.
"""

from firstlight.advisor.chunks import Chunk, content_chunks
from firstlight.advisor.ledger import (
    FINDING_KINDS,
    AdvisorRow,
    Finding,
    FindingKind,
    PrefixAdvisor,
    PriceSource,
    PromptSample,
)

__all__ = [
    "FINDING_KINDS",
    "AdvisorRow",
    "Chunk",
    "Finding",
    "FindingKind",
    "PrefixAdvisor",
    "PriceSource",
    "PromptSample",
    "content_chunks",
]
