"""Cache-index faults: how fast wrong-hint routing stops after each, on the real path.

Run ``firstlight bench index-faults`` (options ``--trials 20 --faults FAULT`` (repeated;
default: every one) ``--prefix-blocks 16 --redis-url URL --timeout-s 10 --out FOLDER
--page PAGE``, and ``--tables-only`` to re-render the page from a stored report). Redis
must answer at ``--redis-url``; every key is written under a key prefix of the run's own
and deleted at the end. No Ray cluster and no model are started.

In one process, as ``firstlight bench route-share`` does, run the replica side and a
gateway's router side of one model in one region:

* the replica: vLLM's KV-event wire format (topic, sequence number, vLLM's own msgpack
  ``KVEventBatch``) on a real ZMQ socket, read by the vLLM adapter
  (:meth:`~firstlight.engine.vllm_engine.VllmEngine.cache_events`) and published by
  :class:`~firstlight.serve.model_server.ModelServer`'s own hint bridge (its
  ``_publish_hints`` task, flushing every 100 ms) through
  :class:`~firstlight.hints.HintPublisher` into Redis;
* the router: a :class:`~firstlight.hints.HintMirror` kept by a
  :class:`~firstlight.hints.HintSubscriber`, built as the gateway's request router builds
  them, and a :class:`~firstlight.region.RouterState` with the configured policy, pricing
  a request for a prefix the faulty replica held, beside an idle replica holding nothing.

Per fault and trial the replica first stores the prefix and the router credits it (and
picks it); 0 to 200 ms later (at random, so engine events meet the bridge's flush cycle at
any phase) the fault happens at its source, at t0, and the router is asked in a tight
loop (yielding to the event loop, never sleeping) until it no longer credits the replica
with any block of that prefix: t1 is the start of that first healed decision. Reported:
t1 - t0 per trial, p50/p99/max per fault, and the verdict against the 2 s goal.
:data:`FAULTS` says where t0 is taken and what is not covered here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer
import zmq
import zmq.asyncio

from firstlight.config import HintsConfig, PlatformConfig
from firstlight.hints import HintMirror, HintSubscriber, redis_client
from firstlight.quantiles import percentile
from firstlight.region import ReplicaStats, RouterState, with_shared_rates
from firstlight.routing import RequestView, RoutingInput, build_policy
from firstlight_bench import options
from firstlight_bench.reports.results import run_header, short_commit
from firstlight_bench.reports.sections import replace_tables
from firstlight_bench.tools.engine import emit

if TYPE_CHECKING:
    from firstlight.serve.model_server import ModelServer

__all__ = [
    "FAULTS",
    "GOAL_S",
    "INDEX_BEGIN",
    "INDEX_END",
    "Fault",
    "app",
    "measure",
    "render",
    "render_report",
    "summarize",
]

INDEX_BEGIN = (
    "<!-- index-faults:begin (generated from docs/benchmarks/index-faults/results.json; "
    "do not edit) -->"
)
INDEX_END = "<!-- index-faults:end -->"
GOAL_S = 2.0
"""The goal: wrong-hint routing stops within this long after each fault."""
BLOCK_SIZE = 32


@dataclass(frozen=True, slots=True)
class Fault:
    """One cache-index fault: where its t0 is taken and what of its path runs here."""

    name: str
    t0: str
    """The moment at the fault's source the time is measured from."""
    path: str
    """What runs between t0 and the router's healed decision."""
    not_covered: str
    """What of the production path does not run here."""


_ENGINE_PATH = (
    "ZMQ → vLLM adapter → ModelServer hint bridge (100 ms flush) → HintPublisher → "
    "Redis feed → HintSubscriber → HintMirror → policy"
)
FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "cache-reset",
            "the engine publishes `AllBlocksCleared`",
            _ENGINE_PATH,
            "a running vLLM engine and its publisher thread (the batch is sent in vLLM's "
            "wire format by this process)",
        ),
        Fault(
            "sequence-gap",
            "the engine publishes the batch after the lost one (the gap shows then)",
            _ENGINE_PATH,
            "the wait for that next batch: an engine emits one per step with cache "
            "changes, none while idle; a running vLLM engine",
        ),
        Fault(
            "engine-restart",
            "the restarted replica's hint bridge starts with a newer epoch, same replica id",
            "ModelServer hint bridge (`start_epoch`) → HintPublisher → Redis feed → "
            "HintSubscriber → HintMirror (older epoch dropped) → policy",
            "the engine's start-up and Ray's first call to the new replica, which starts "
            "its bridge; Ray Serve never restarts a replica actor (`max_restarts=0`), a "
            "replacement comes with a new id: the removal row",
        ),
        Fault(
            "replica-removal",
            "the router applies the replica-set update without the replica",
            "`RouterState.replica_set` + `RouterState.set_replicas`, as the request "
            "router's `update_replicas` calls them",
            "Ray's controller noticing the replica go and long-polling the new set to "
            "the router (needs a Ray cluster)",
        ),
    )
}
"""The faults measured, in the report's order."""


class _Engine:
    """A vLLM engine's KV-event publisher as the adapter sees it: vLLM's wire format
    (topic ``kv``, 8-byte big-endian sequence number, msgpack ``KVEventBatch``) on a real
    XPUB socket, which tells when the adapter's subscription arrived."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        from vllm.distributed.kv_events import KVEventBatch

        self._batch = KVEventBatch
        self.socket = context.socket(zmq.XPUB)
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self._encoder = msgspec.msgpack.Encoder()
        self.next_seq = 0

    async def subscribed(self, timeout_s: float) -> None:
        await asyncio.wait_for(self.socket.recv(), timeout_s)

    async def send(self, events: list[Any], *, lose: int = 0) -> float:
        """Publish one batch after losing ``lose`` batches; returns when it was sent."""
        seq = self.next_seq + lose
        payload = self._encoder.encode(self._batch(ts=time.time(), events=events))
        self.next_seq = seq + 1
        sent_at = time.monotonic()
        await self.socket.send_multipart([b"kv", seq.to_bytes(8, "big", signed=True), payload])
        return sent_at


class _Replica:
    """One incarnation of a model replica: its engine's event socket, the vLLM adapter
    reading it, and the ModelServer's hint bridge publishing to Redis."""

    def __init__(
        self, context: zmq.asyncio.Context, config: PlatformConfig, region: str, rid: str
    ) -> None:
        from firstlight.engine.kv_feed import KvEventFeed
        from firstlight.engine.vllm_engine import VllmEngine

        self.replica_id = rid
        self.engine = _Engine(context)
        self._events = context.socket(zmq.SUB)
        self._events.setsockopt(zmq.SUBSCRIBE, b"kv")
        self._events.connect(f"tcp://127.0.0.1:{self.engine.port}")
        # The vLLM adapter's event feed without a model: all the bridge reads of it.
        adapter = VllmEngine.__new__(VllmEngine)
        adapter._feed = KvEventFeed(self._events, config.models[0].name)
        # What ModelServer._publish_hints reads; __init__ would ask Ray for the replica id
        # and load the model.
        bridge = _bridge_class()
        self._server = bridge.__new__(bridge)
        self._server._config = config
        self._server._region = region
        self._server._model = config.models[0]
        self._server._replica_id = rid
        self._server._engine = adapter
        self._server._announce = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self, epoch: int, timeout_s: float) -> float:
        """Wait for the adapter's subscription, then start the bridge with ``epoch``;
        returns when the bridge started."""
        await self.engine.subscribed(timeout_s)
        self._server._epoch = epoch
        started_at = time.monotonic()
        self._task = asyncio.create_task(self._server._publish_hints())
        return started_at

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._events.close(linger=0)
        self.engine.socket.close(linger=0)


@functools.cache
def _bridge_class() -> type[ModelServer]:
    from firstlight.serve.model_server import ModelServer

    class _Bridge(ModelServer):
        """The ModelServer, less the graceful shutdown Ray awaits (an ``async
        __del__``): Python calls it on garbage collection and drops the coroutine."""

        def __del__(self) -> None:  # type: ignore[override]
            return None

    return _Bridge


class _Router:
    """A gateway's router side of the model: the mirror and subscriber as
    ``FirstlightRequestRouter._start_hints`` builds them, the router state with the
    configured policy, and the replica set as ``update_replicas`` applies it."""

    def __init__(self, config: PlatformConfig, region: str, key_prefix: str) -> None:
        hints = config.hints
        self.mirror = HintMirror(hints.ttl_s)
        self.subscriber = HintSubscriber(
            lambda: redis_client(hints), key_prefix, config.models[0].name, self.mirror
        )
        policy = build_policy(
            config.router.policy, dict(config.router.params), rng=random.Random(), clock=time.time
        )
        self.state = RouterState(region, config.models[0].name, policy, clock=time.time)
        self.state.cache = self.mirror
        self._region = region

    def set_replicas(self, replica_ids: Sequence[str]) -> None:
        self.state.replica_set(replica_ids)
        views = {r: ReplicaStats(at=time.time()).view(r, self._region, None) for r in replica_ids}
        self.state.set_replicas(with_shared_rates(views))

    def credited(self, request: RequestView, replica_id: str) -> tuple[int, bool]:
        """The blocks the policy credits ``replica_id`` with, and whether it wins."""
        state = self.state
        decision = state.policy.choose(
            RoutingInput(request, tuple(state.replicas.values()), state.cache)
        )
        blocks = next((c.cached_blocks for c in decision.ranked if c.replica_id == replica_id), 0)
        return blocks, decision.winner.replica_id == replica_id


async def _credited_in_full(
    router: _Router, request: RequestView, rid: str, timeout_s: float
) -> bool:
    """Ask until ``rid`` is credited with the whole prefix; returns whether it wins."""
    deadline = time.monotonic() + timeout_s
    while True:
        blocks, wins = router.credited(request, rid)
        if blocks == len(request.block_hashes):
            return wins
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rid}: credited {blocks} blocks, not the stored prefix")
        await asyncio.sleep(0)  # a yield, so the bridge and subscriber run


async def _healed_at(
    router: _Router, request: RequestView, rid: str, timeout_s: float
) -> tuple[float | None, int]:
    """The start of the first decision that credits ``rid`` with nothing (``None``
    after ``timeout_s``), and how many decisions were asked."""
    deadline = time.monotonic() + timeout_s
    polls = 0
    while True:
        asked_at = time.monotonic()
        polls += 1
        if router.credited(request, rid)[0] == 0:
            return asked_at, polls
        if asked_at > deadline:
            return None, polls
        await asyncio.sleep(0)


def _stored(blocks: Sequence[int]) -> Any:
    from vllm.distributed.kv_events import BlockStored

    return BlockStored(
        block_hashes=list(blocks), parent_block_hash=None, token_ids=[],
        block_size=BLOCK_SIZE, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip


def _epoch_after(previous: int) -> int:
    return max(time.time_ns() // 1_000_000, previous + 1)  # as ModelServer stamps it


async def _run_fault(
    fault: str,
    trials: int,
    blocks: int,
    context: zmq.asyncio.Context,
    config: PlatformConfig,
    router: _Router,
    timeout_s: float,
) -> list[dict[str, Any]]:
    from vllm.distributed.kv_events import AllBlocksCleared

    region = router.state.region
    rng = random.Random(f"{fault}:{trials}:{blocks}")
    samples: list[dict[str, Any]] = []
    replica: _Replica | None = None
    epoch = 0
    try:
        for trial in range(trials):
            rid = f"{fault}-{trial}" if fault == "replica-removal" else fault
            if replica is None:
                replica = _Replica(context, config, region, rid)
                epoch = _epoch_after(epoch)
                await replica.start(epoch, timeout_s)
            router.set_replicas([rid, "idle"])
            prefix = tuple(rng.getrandbits(64) for _ in range(blocks))
            request = RequestView(f"{fault}-{trial}", blocks * BLOCK_SIZE + 40, prefix, BLOCK_SIZE)
            await replica.engine.send([_stored(prefix)])
            won = await _credited_in_full(router, request, rid, timeout_s)
            # Not a synchronisation: the fault comes at a random moment, so it meets the
            # bridge's 100 ms flush cycle at any phase, not always right after a flush.
            await asyncio.sleep(rng.uniform(0.0, 0.2))
            if fault == "cache-reset":
                t0 = await replica.engine.send([AllBlocksCleared()])
            elif fault == "sequence-gap":  # the batch evicting the prefix is lost
                t0 = await replica.engine.send([_stored([rng.getrandbits(64)])], lose=1)
            elif fault == "engine-restart":
                await replica.stop()  # the engine dies; nothing is published for it
                replica = _Replica(context, config, region, rid)
                epoch = _epoch_after(epoch)
                t0 = await replica.start(epoch, timeout_s)
            else:
                t0 = time.monotonic()
                router.set_replicas(["idle"])
            t1, polls = await _healed_at(router, request, rid, timeout_s)
            if fault == "replica-removal":
                await replica.stop()
                replica = None
            samples.append(
                {
                    "fault": fault,
                    "trial": trial,
                    "healed": t1 is not None,
                    "heal_ms": None if t1 is None else round((t1 - t0) * 1000.0, 3),
                    "won_before": won,
                    "credited_after": router.credited(request, rid)[0],
                    "mirror_after": router.mirror.longest_prefix(prefix).get(rid, 0),
                    "polls": polls,
                }
            )
    finally:
        if replica is not None:
            await replica.stop()
    return samples


async def measure(
    faults: Sequence[str],
    trials: int,
    *,
    redis_url: str = "redis://127.0.0.1:6379/0",
    blocks: int = 16,
    timeout_s: float = 10.0,
    key_prefix: str | None = None,
) -> dict[str, Any]:
    """Run ``trials`` of each fault (module docstring); returns ``samples`` (one per
    trial) and ``feed`` (the subscriber's reconnects, bootstraps and events applied).

    Every key is written under ``key_prefix`` (default: a new one) and deleted at the end.
    Raises ``TimeoutError`` when the setup does not come up within ``timeout_s`` (Redis
    unreachable, a prefix never credited); a fault that does not heal within
    ``timeout_s`` is a sample with ``healed`` false.
    """
    # Imported before the subscriber starts: importing vLLM blocks the loop for seconds.
    import vllm.distributed.kv_events  # noqa: F401

    from firstlight.serve.model_server import hint_key_prefix

    _bridge_class()
    key_prefix = key_prefix or f"flbench:{uuid.uuid4().hex[:12]}:"
    hints = HintsConfig(redis_url=redis_url, key_prefix=key_prefix)
    config = PlatformConfig(hints=hints)
    region = config.regions[0].name
    router = _Router(config, region, hint_key_prefix(config, region))
    context = zmq.asyncio.Context()
    follow = asyncio.create_task(router.subscriber.run())
    samples: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not router.subscriber.status.connected:
            if time.monotonic() > deadline or follow.done():
                raise TimeoutError(f"hint feed not connected: {router.subscriber.status}")
            await asyncio.sleep(0)
        for fault in faults:
            samples += await _run_fault(fault, trials, blocks, context, config, router, timeout_s)
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
        context.destroy(linger=0)
        await _delete_keys(hints)
    status = router.subscriber.status
    feed = {
        "reconnects": status.reconnects,
        "bootstraps": status.bootstraps,
        "events_applied": status.events_applied,
    }
    return {"samples": samples, "feed": feed}


async def _delete_keys(hints: HintsConfig) -> None:
    client = redis_client(hints)
    try:
        keys = [k async for k in client.scan_iter(match=f"{hints.key_prefix}*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def summarize(samples: Sequence[dict[str, Any]], goal_s: float = GOAL_S) -> list[dict[str, Any]]:
    """Per fault (in :data:`FAULTS` order): trials, how many healed, p50/p99/max of the
    heal time in ms, and whether every trial healed within ``goal_s``."""
    rows = []
    for name, fault in FAULTS.items():
        mine = [s for s in samples if s["fault"] == name]
        if not mine:
            continue
        times = sorted(float(s["heal_ms"]) for s in mine if s["healed"])
        quantiles = {q: percentile(times, v) for q, v in (("p50", 0.5), ("p99", 0.99))}
        longest = times[-1] if times else None
        rows.append(
            {
                "fault": name,
                "trials": len(mine),
                "healed": len(times),
                **{f"{q}_ms": None if v is None else round(v, 3) for q, v in quantiles.items()},
                "max_ms": longest,
                "meets_goal": len(times) == len(mine) and longest is not None
                and longest <= goal_s * 1000.0,
                "t0": fault.t0,
                "path": fault.path,
                "not_covered": fault.not_covered,
            }
        )  # fmt: skip
    return rows


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}" if value >= 1 else f"{value:.3f}"


def render(report: dict[str, Any]) -> str:
    """The generated section of ``docs/reliability.md`` (markers included)."""
    lines = [
        INDEX_BEGIN,
        "",
        f"Measured at {short_commit(report['git_commit'])} (`{report['command']}`): "
        f"{report['trials']} trials per fault, a {report['prefix_blocks']}-block prefix, "
        "real Redis and ZMQ, replica and router in one process, each fault 0 to 200 ms after "
        "the router first credited the prefix. Time from the fault at its source until the "
        "router credits the replica with none of the prefix, in ms:",
        "",
        "| fault | t0: the moment … | healed | p50 | p99 | max | within 2 s |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in report["summary"]:
        lines.append(
            f"| {row['fault']} | {row['t0']} | {row['healed']}/{row['trials']} | "
            f"{_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} | {_ms(row['max_ms'])} | "
            f"{'**yes**' if row['meets_goal'] else '**no**'} |"
        )
    lines += ["", "Not covered here:", ""]
    lines += [f"* {row['fault']}: {row['not_covered']}." for row in report["summary"]]
    lines += ["", INDEX_END]
    return "\n".join(lines)


def render_report(report: dict[str, Any]) -> str:
    """The run folder's ``report.md``: the page's section, each fault's path, the verdict."""
    machine = report["machine"]
    body = render(report).removeprefix(INDEX_BEGIN).removesuffix(INDEX_END).strip()
    lines = [
        "# Cache-index faults: time until wrong-hint routing stops",
        "",
        f"`{report['command']}` at {short_commit(report['git_commit'])}, {report['time']}, "
        f"{machine['cpu']} ({machine['cores']} cores), Python {machine['python']}.",
        "",
        body,
        "",
        "What runs between t0 and the healed decision:",
        "",
    ]
    lines += [f"* {row['fault']}: {row['path']}." for row in report["summary"]]
    feed = report["feed"]
    lines += [
        "",
        f"The router's hint feed: {feed['reconnects']} reconnects, {feed['bootstraps']} "
        f"bootstraps, {feed['events_applied']} events applied.",
        "",
        f"Verdict against the {report['goal_s']:g} s goal: {report['verdict']}.",
        "",
    ]
    return "\n".join(lines)


class FaultName(StrEnum):
    """A fault ``--faults`` names: the keys of :data:`FAULTS`."""

    CACHE_RESET = "cache-reset"
    SEQUENCE_GAP = "sequence-gap"
    ENGINE_RESTART = "engine-restart"
    REPLICA_REMOVAL = "replica-removal"


app = typer.Typer(add_completion=False)


@app.command()
def index_faults(
    trials: Annotated[int, typer.Option(min=1, help="Trials per fault.")] = 20,
    faults: Annotated[
        list[FaultName] | None, typer.Option(help="A fault to run (repeat; default: all).")
    ] = None,
    prefix_blocks: Annotated[int, typer.Option(min=1, help="Blocks of the prefix.")] = 16,
    redis_url: Annotated[
        str, typer.Option(help="Where Redis answers.")
    ] = "redis://127.0.0.1:6379/0",
    timeout_s: Annotated[float, typer.Option(help="Longest wait for set-up and heal.")] = 10.0,
    out: options.OutOption = None,
    page: options.PageOption = None,
    tables_only: options.TablesOnlyOption = False,
) -> None:
    """How fast wrong-hint routing stops after each cache-index fault, on the real path
    (run as firstlight bench index-faults; Redis at --redis-url). Prints the JSON report
    and the page's section, stores the report and report.md with --out, rewrites --page's
    section (--tables-only: only that, from --out)."""
    if options.rewrote_tables(out, page, tables_only, _rewrite):
        return
    if not timeout_s > 0:
        raise typer.BadParameter(f"{timeout_s:g}: must be more than 0", param_hint="--timeout-s")
    chosen = list(dict.fromkeys(f.value for f in faults)) if faults else list(FAULTS)
    measured = asyncio.run(
        measure(
            chosen, trials, redis_url=redis_url, blocks=prefix_blocks, timeout_s=timeout_s,
        )
    )  # fmt: skip
    samples = measured["samples"]
    summary = summarize(samples)
    report = {
        **run_header(),
        "simulated": False,
        "goal_s": GOAL_S,
        "trials": trials,
        "prefix_blocks": prefix_blocks,
        "policy": PlatformConfig().router.policy,
        "verdict": "met by every fault"
        if all(row["meets_goal"] for row in summary)
        else "missed by " + ", ".join(row["fault"] for row in summary if not row["meets_goal"]),
        "summary": summary,
        "feed": measured["feed"],
        "samples": samples,
    }
    emit(report, out / "results.json" if out else None)
    if out is not None:
        (out / "report.md").write_text(render_report(report))
    typer.echo(render(report))
    if page is not None:
        _rewrite(page, report)


def _rewrite(page: Path, report: dict[str, Any]) -> None:
    page.write_text(
        replace_tables(page.read_text(), render(report), begin=INDEX_BEGIN, end=INDEX_END)
    )
