"""The soak run's way into its gateways' memory: ``tracemalloc`` in every gateway process,
through each region's ``gateway`` deployment handle (``Gateway.memory_*``,
:mod:`firstlight.telemetry.memory`), not an HTTP route.

A handle sends each call to one replica of its choosing, and a region runs several
gateways (``gateway.replicas``). So every ask goes out several times at once (the handle
spreads concurrent calls over the replicas) until each gateway process the soak run
found in ``/proc`` has answered, for a few rounds at most; the gateways that never
answered, and the errors, are reported rather than raised. Every ask is idempotent on the
gateway (a baseline or a growth is taken once per label), so a gateway asked twice does
the work once.

Used by :func:`firstlight_bench.tools.soak.soak` in the process that started the local Ray
cluster; :func:`each_gateway` is plain asyncio (tests drive it with a fake ask).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Protocol, TypeVar

__all__ = ["GatewayMemory", "HasPid", "each_gateway"]


class HasPid(Protocol):
    """An answer that says which process gave it."""

    @property
    def pid(self) -> int: ...


AnswerT = TypeVar("AnswerT", bound=HasPid)

ROUNDS = 20
"""Rounds of asks before a gateway that has not answered is given up on."""
PAUSE_S = 0.5
"""Between rounds: a new handle learns the replicas from Serve's controller a moment after
its first call, and a replica whose queue length did not come back in time (a busy
machine) is passed over for that call."""


async def each_gateway(
    ask: Callable[[], Awaitable[AnswerT]],
    pids: Collection[int],
    *,
    rounds: int = ROUNDS,
    pause_s: float = PAUSE_S,
) -> tuple[dict[int, AnswerT], list[str]]:
    """Call ``ask`` (which reaches one gateway of its choosing) until every process of
    ``pids`` has answered or ``rounds`` rounds have passed: each round sends two asks per
    gateway at once, ``pause_s`` after the previous one. Returns the first answer per pid
    (answers from processes not in ``pids`` included: a gateway started since) and the
    errors, as text."""
    answers: dict[int, AnswerT] = {}
    errors: list[str] = []
    for round_ in range(rounds):
        if pids and set(pids) <= answers.keys():
            break
        if round_:
            await asyncio.sleep(pause_s)  # a retry's back-off, not synchronisation
        got = await asyncio.gather(
            *(ask() for _ in range(2 * max(len(pids), 1))), return_exceptions=True
        )
        for answer in got:
            if isinstance(answer, Exception):
                errors.append(_brief(answer))
            elif isinstance(answer, BaseException):
                raise answer
            else:
                answers.setdefault(answer.pid, answer)
        if not pids:
            break
    return answers, errors


def _brief(error: Exception) -> str:
    """An error in one line: Ray's carry the remote traceback, whose last line says it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:300]


class GatewayMemory:
    """The ``memory_*`` methods of every gateway of ``regions`` (Ray Serve applications
    named after their regions), each answer keyed by the gateway's process name in the
    soak report (``<region>/gateway#<pid>``). ``gateways(region)`` lists the region's
    gateway processes now (process name → pid). Every call has a deadline of
    ``timeout_s`` (snapshots of a large heap take a while)."""

    def __init__(
        self,
        regions: Iterable[str],
        gateways: Callable[[str], Mapping[str, int]],
        *,
        timeout_s: float = 600.0,
    ) -> None:
        from ray import serve

        self._handles = {r: serve.get_deployment_handle("gateway", app_name=r) for r in regions}
        self._gateways = gateways
        self._timeout_s = timeout_s

    async def ask(self, method: str, *args: Any) -> tuple[dict[str, Any], list[str]]:
        """``method(*args)`` on every gateway of every region: the answers by process name,
        and what went wrong (errors, gateways that never answered)."""
        answers: dict[str, Any] = {}
        problems: list[str] = []
        for region, (got, errors) in zip(
            self._handles,
            await asyncio.gather(*(self._ask_region(r, method, args) for r in self._handles)),
            strict=True,
        ):
            answers.update(got)
            problems += [f"{region} {method}: {e}" for e in sorted(set(errors))]
        return answers, problems

    async def _ask_region(
        self, region: str, method: str, args: tuple[Any, ...]
    ) -> tuple[dict[str, Any], list[str]]:
        names = {pid: name for name, pid in self._gateways(region).items()}
        handle = getattr(self._handles[region], method)

        async def one() -> Any:
            response = handle.remote(*args)
            try:
                return await asyncio.wait_for(_awaited(response), self._timeout_s)
            except TimeoutError:
                response.cancel()
                raise

        got, errors = await each_gateway(one, names)
        missing = sorted(names[pid] for pid in names.keys() - got.keys())
        errors += [f"{name} did not answer" for name in missing]
        return {names.get(pid, f"{region}/gateway#{pid}"): a for pid, a in got.items()}, errors


async def _awaited(response: Any) -> Any:
    return await response
