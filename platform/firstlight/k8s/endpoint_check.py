"""``firstlight check URL``: is a region's endpoint serving? (the chart's ``helm test``)

Who calls it: the CLI, run by the chart's test pod against the region's Serve service
and by operators against a public endpoint. Three steps, each reported with its time:
``/readyz`` says ready (polled up to ``wait_s``), ``/v1/models`` lists the model, and
one chat completion returns text. Nothing here raises for a failed check: the steps
carry the reason, and the caller turns a failure into an exit code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

__all__ = ["CheckStep", "check_endpoint"]

_PROMPT = "Reply with one short sentence: is this endpoint working?"
_POLL_S = 2.0


@dataclass(frozen=True)
class CheckStep:
    """One step of the check: its name, whether it passed, what was seen, how long."""

    name: str
    ok: bool
    detail: str
    elapsed_ms: float


def check_endpoint(
    url: str,
    api_key: str,
    model: str | None = None,
    *,
    wait_s: float = 0.0,
    timeout_s: float = 120.0,
    transport: httpx.BaseTransport | None = None,
) -> list[CheckStep]:
    """Check the endpoint at ``url`` (``https://us-east.llm.example.com``); stop at the
    first failing step. ``model`` defaults to the first one ``/v1/models`` lists.
    ``wait_s`` keeps polling ``/readyz`` (every 2 s) while the region starts."""
    headers = {"authorization": f"Bearer {api_key}"}
    base = url.rstrip("/")
    steps: list[CheckStep] = []
    with httpx.Client(
        base_url=base, headers=headers, timeout=timeout_s, transport=transport
    ) as client:
        steps.append(_ready(client, wait_s))
        if steps[-1].ok:
            step, model = _models(client, model)
            steps.append(step)
        if steps[-1].ok and model is not None:
            steps.append(_completion(client, model))
    return steps


def _ready(client: httpx.Client, wait_s: float) -> CheckStep:
    started = time.monotonic()
    deadline = started + wait_s
    while True:
        try:
            response = client.get("/readyz")
            ready = response.status_code == 200 and response.json().get("ready") is True
            detail = f"HTTP {response.status_code}: {response.text[:200]}"
        except (httpx.HTTPError, ValueError) as exc:
            ready, detail = False, _error_text(exc)
        if ready or time.monotonic() >= deadline:
            return CheckStep("readyz", ready, detail, _ms_since(started))
        time.sleep(_POLL_S)


def _models(client: httpx.Client, model: str | None) -> tuple[CheckStep, str | None]:
    started = time.monotonic()
    try:
        response = client.get("/v1/models")
        if response.status_code != 200:
            detail = f"HTTP {response.status_code}: {response.text[:200]}"
            return CheckStep("models", False, detail, _ms_since(started)), None
        served = [entry["id"] for entry in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return CheckStep("models", False, _error_text(exc), _ms_since(started)), None
    chosen = model or (served[0] if served else None)
    ok = chosen is not None and chosen in served
    detail = f"serves {', '.join(served) or 'nothing'}"
    if not ok and model is not None:
        detail = f"model {model!r} is not served; {detail}"
    return CheckStep("models", ok, detail, _ms_since(started)), chosen


def _completion(client: httpx.Client, model: str) -> CheckStep:
    started = time.monotonic()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": _PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
    }
    try:
        response = client.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            detail = f"HTTP {response.status_code}: {response.text[:200]}"
            return CheckStep("completion", False, detail, _ms_since(started))
        text = response.json()["choices"][0]["message"]["content"] or ""
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return CheckStep("completion", False, _error_text(exc), _ms_since(started))
    region = response.headers.get("x-firstlight-region", "?")
    ok = bool(text.strip())
    detail = f"{model} in region {region}: {text.strip()[:80]!r}" if ok else "empty completion"
    return CheckStep("completion", ok, detail, _ms_since(started))


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _ms_since(started: float) -> float:
    return (time.monotonic() - started) * 1000.0
