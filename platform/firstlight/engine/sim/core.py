"""The simulator's scheduler core: vLLM v1 continuous batching, pure and synchronous.

Each step, as ``vllm/v1/core/sched/scheduler.py`` does it:

1. Running requests, in admission order, each take what they still need — one token
   when decoding, the rest of their prompt (chunked) when prefilling — within the step's
   token budget (``max_num_batched_tokens``). A request that needs a new KV block when
   none is free preempts the most recently admitted running request (its blocks are
   freed; it restarts from the waiting queue's head and recomputes).
2. Unless something was preempted, waiting requests are admitted first come first
   served while fewer than ``max_num_seqs`` run and budget and blocks remain. Admission
   looks up the prompt's leading blocks in the prefix cache (at most ``prompt - 1``
   tokens, so the last token is always computed) and schedules only the rest. With a
   host tier (``profile.host_kv_blocks``, vLLM's KV offloading) the lookup runs on into
   the blocks held in host memory right after the device ones: those are reloaded (they
   become device blocks again) at ``profile.reload_ms_per_token`` each token, added to
   the step's duration, instead of being prefilled.
3. The step lasts ``profile.step_ms(prefill tokens, decoding sequences, prefill
   context)``, the context summed over the prefill chunks, each from the position it
   starts at. When it ends, prompt blocks that became full are cached; every request
   whose computed tokens caught up with its sequence samples a token (a prefill's first
   token, or the next one); requests end at ``max_tokens`` (``"length"``) or on a stop
   string (``"stop"``).

Who calls what: a driver — :class:`~firstlight.engine.sim.SimEngine` (real time, asyncio)
or :class:`~firstlight.engine.sim.VirtualSim` (virtual time) — calls :meth:`begin_step`,
waits the returned duration, then :meth:`finish_step`, in a loop; requests come in
through :meth:`add` and leave through :meth:`abort` at any time, also mid-step. Routing
adapters read :meth:`stats` and :meth:`cached_prefix_blocks`. No clock, no I/O, no
randomness: the same calls give the same results.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from firstlight.engine._steps import RecentSteps
from firstlight.engine.protocol import (
    CacheEvent,
    EngineStats,
    FinishReason,
    GenerationRequest,
    Usage,
    check_request,
)
from firstlight.engine.sim._filler import Filler
from firstlight.engine.sim._kv import BlockPool
from firstlight.engine.sim._request import DONE, RUNNING, WAITING, SimRequest
from firstlight.engine.sim.profiles import DEFAULT_PROFILE, SimProfile, get_profile
from firstlight.engine.sim.results import FinishedRequest, StepResult
from firstlight.errors import InvalidRequestError
from firstlight.prefix import HashScheme, hint_hashes

__all__ = ["SimCore"]


class SimCore:
    """One simulated vLLM replica's scheduler, KV cache and prefix cache.

    ``profile`` is a :class:`SimProfile` or a registered name (unknown names raise
    :class:`~firstlight.errors.ConfigError`); ``hash_seed`` is the platform's
    ``hints.hash_seed``, so the core's block hashes are the gateway's; ``seed`` picks the
    filler output. ``record_events=False`` skips cache-event bookkeeping for runs
    without a hint consumer.
    """

    def __init__(
        self,
        profile: SimProfile | str = DEFAULT_PROFILE,
        *,
        hash_seed: int = 0,
        seed: int = 0,
        record_events: bool = True,
    ) -> None:
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        self.scheme = HashScheme(self.profile.block_size, hash_seed)
        self.seed = seed
        self._filler = Filler(seed)
        self._pool = BlockPool(
            self.profile.kv_cache_blocks,
            record_events=record_events,
            host_capacity=self.profile.host_kv_blocks,
        )
        self._requests: dict[str, SimRequest] = {}
        self._waiting: deque[SimRequest] = deque()
        self._waiting_count = 0
        self._waiting_unscheduled = 0
        self._running: list[SimRequest] = []
        self._batch: list[tuple[SimRequest, int]] | None = None
        self._step: StepResult | None = None
        self._pending_tokens = 0
        self._queries = 0
        self._hits = 0
        self._events: list[CacheEvent] = []
        self._recent = RecentSteps()
        self.slowdown = 1.0
        """Every step takes this many times the profile's time (a brownout: throttled or
        degraded hardware, a noisy neighbour); set by the benchmark's fleet events. The
        stats report the slower steps, as a real engine's would."""

    # --- requests ------------------------------------------------------------------------

    def add(self, request: GenerationRequest, *, block_hashes: Sequence[int] | None = None) -> None:
        """Queue ``request`` (FCFS). ``block_hashes`` are its prompt's hint hashes when the
        caller already has them (the benchmark computes them once for routing); otherwise
        the core computes them with its :class:`HashScheme` and the request's salt.

        Raises :class:`~firstlight.errors.InvalidRequestError` (incl.
        ``PromptTooLongError``) as :func:`check_request` does, for a request id already
        in the core, or for ``block_hashes`` of the wrong length.
        """
        check_request(request, self.profile.max_model_len)
        if request.request_id in self._requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use")
        prompt = request.prompt_token_ids
        bs = self.profile.block_size
        if block_hashes is None:
            block_hashes = hint_hashes(
                prompt, self.scheme, cache_salt=request.cache_salt, lora=request.lora
            )
        elif len(block_hashes) != len(prompt) // bs:
            raise InvalidRequestError(
                f"{len(block_hashes)} block hashes given for a {len(prompt)}-token prompt "
                f"in blocks of {bs} (expected {len(prompt) // bs})"
            )
        req = SimRequest(
            request.request_id, len(prompt), request.sampling.max_tokens, block_hashes, bs
        )
        req.offset = self._filler.offset(request.response_id, request.resumed_tokens)
        if request.sampling.stop:
            req.stop_ids = self._filler.stop_token_ids(request.sampling.stop)
        limit = (len(prompt) - 1) // bs
        hit = self._pool.longest_prefix(block_hashes, limit)
        hit += self._pool.host_prefix(block_hashes, hit, limit)  # reloaded, not prefilled
        req.pending = len(prompt) - hit * bs
        self._pending_tokens += req.pending
        self._requests[req.request_id] = req
        self._waiting.append(req)
        self._waiting_count += 1

    def abort(self, request_id: str) -> FinishedRequest | None:
        """Remove a waiting or running request and free its blocks; ``None`` if it is
        unknown or already finished. Safe mid-step: the in-flight step then leaves it out.
        """
        req = self._requests.get(request_id)
        if req is None:
            return None
        if req.state == RUNNING:
            self._running.remove(req)
        else:
            self._waiting_count -= 1  # dropped from the deque lazily
        return self._finish(req, "abort")

    # --- stepping ------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Whether a step would schedule anything (requests are waiting or running)."""
        return bool(self._running) or self._waiting_count > 0

    @property
    def in_flight(self) -> bool:
        """Whether :meth:`begin_step` was called and :meth:`finish_step` not yet."""
        return self._batch is not None

    def begin_step(self) -> float | None:
        """Schedule the next step and return its duration in seconds, or ``None`` when
        there is no work. Raises ``RuntimeError`` if a step is already in flight."""
        if self._batch is not None:
            raise RuntimeError("a step is already in flight; call finish_step() first")
        if not self.has_work:
            return None
        profile, pool = self.profile, self._pool
        bs, budget = profile.block_size, profile.max_num_batched_tokens
        batch: list[tuple[SimRequest, int]] = []
        preempted: list[str] = []
        prefill = decodes = context2 = 0  # context2: twice the prefill context
        running = self._running
        count = len(running)
        i = 0
        while i < count and budget > 0:
            req = running[i]
            need = req.prompt_len + req.generated - req.computed
            n = need if need < budget else budget
            extra = -(-(req.computed + n) // bs) - req.held
            if extra > 0:
                while pool.used + extra > pool.capacity:
                    victim = running.pop()
                    count -= 1
                    self._preempt(victim)
                    preempted.append(victim.request_id)
                    if victim is req:
                        break
                if req.state != RUNNING:
                    break
                pool.allocate(extra)
                req.held += extra
            batch.append((req, n))
            budget -= n
            if need == 1 and req.generated:
                decodes += 1
            else:
                prefill += n
                context2 += n * (2 * req.computed + n)
            i += 1
        reload_ms = 0.0
        if not preempted:
            admitted, admitted_context2, reloaded = self._admit(batch, budget)
            prefill += admitted
            context2 += admitted_context2
            reload_ms = reloaded * profile.reload_ms_per_token
        self._waiting_unscheduled = self._waiting_count
        # Work always schedules: a lone request fits the KV cache (SimProfile checks it).
        assert batch, "a step with work scheduled nothing"
        self._take_event()  # evictions made room for this step: announce them now
        self._batch = batch
        context = context2 / 2
        step_ms = profile.step_ms(prefill, decodes, context) + reload_ms
        duration_s = step_ms * self.slowdown / 1000.0
        self._step = StepResult(
            duration_s,
            prefill + decodes,
            prefill,
            context,
            decodes,
            len(batch),
            [],
            [],
            [],
            preempted,
        )
        return duration_s

    def _admit(self, batch: list[tuple[SimRequest, int]], budget: int) -> tuple[int, int, int]:
        """Admit waiting requests FCFS into ``batch``; returns their prefill tokens, twice
        their prefill context, and the tokens they reload from the host tier."""
        pool, waiting, running = self._pool, self._waiting, self._running
        bs, max_seqs = self.profile.block_size, self.profile.max_num_seqs
        scheduled = context2 = reloaded = 0
        while waiting and budget > 0 and len(running) < max_seqs:
            req = waiting[0]
            if req.state != WAITING:  # aborted while waiting
                waiting.popleft()
                continue
            target = req.prompt_len + req.generated
            hashes = req.hashes
            limit = (target - 1) // bs
            hit = pool.longest_prefix(hashes, limit)
            host = pool.host_prefix(hashes, hit, limit)
            computed = (hit + host) * bs
            n = min(target - computed, budget)
            blocks = -(-(computed + n) // bs)
            if pool.used + pool.unpinned_among(hashes, hit) + blocks - hit > pool.capacity:
                break
            pool.acquire(hashes, hit)
            # Out of the host tier before allocating, so no eviction pushes them out of it.
            pool.reload(hashes, hit, host)
            pool.allocate(blocks - hit)
            refs = list(hashes[:hit])
            for index in range(hit, hit + host):  # reloaded: device blocks again
                pool.commit(hashes[index])
                refs.append(hashes[index])
            reloaded += host * bs
            waiting.popleft()
            self._waiting_count -= 1
            req.state = RUNNING
            req.refs = refs
            req.held = blocks
            req.computed = computed
            if not req.admitted:
                req.admitted = True
                req.cached_tokens = computed
                self._queries += req.prompt_len
                self._hits += computed
            self._pending_tokens += target - computed - req.pending
            req.pending = target - computed
            running.append(req)
            batch.append((req, n))
            budget -= n
            scheduled += n
            context2 += n * (2 * computed + n)
        return scheduled, context2, reloaded

    def finish_step(self) -> StepResult:
        """Complete the in-flight step: cache newly full prompt blocks, sample tokens,
        finish requests. Raises ``RuntimeError`` when no step is in flight."""
        batch, result = self._batch, self._step
        if batch is None or result is None:
            raise RuntimeError("no step in flight; call begin_step() first")
        self._batch = self._step = None
        pool, bs, token_id_of = self._pool, self.profile.block_size, self._filler.token_id
        tokens, finished = result.tokens, result.finished
        running_state = RUNNING
        any_finished = False
        for req, n in batch:
            if req.state != running_state:  # aborted mid-step
                continue
            start = req.computed
            req.computed = end = start + n
            if req.pending:
                done = n if n < req.pending else req.pending
                req.pending -= done
                self._pending_tokens -= done
            if start < req.cacheable:  # full prompt blocks may have filled up
                hashes = req.hashes
                for index in range(start // bs, min(end, req.cacheable) // bs):
                    pool.commit(hashes[index])
                    req.refs.append(hashes[index])
            generated = req.generated
            if end == req.prompt_len + generated:
                token_id = token_id_of(req.offset, generated)
                req.generated = generated = generated + 1
                tokens.append((req.request_id, token_id))
                if generated == 1:
                    result.first_token_ids.append(req.request_id)
                if req.stop_ids and token_id in req.stop_ids:
                    finished.append(self._finish(req, "stop"))
                    any_finished = True
                elif generated == req.max_tokens:
                    finished.append(self._finish(req, "length"))
                    any_finished = True
        if any_finished:
            self._running = [r for r in self._running if r.state == RUNNING]
        self._recent.record(result.prefill_tokens, result.decode_seqs, result.duration_s)
        self._take_event()
        return result

    def step(self) -> StepResult | None:
        """:meth:`begin_step` then :meth:`finish_step` at once (no time passes in
        between); ``None`` when idle. For tests and drivers that need no interleaving."""
        if self.begin_step() is None:
            return None
        return self.finish_step()

    def _take_event(self) -> None:
        event = self._pool.take_event()
        if event is not None:
            self._events.append(event)

    def _preempt(self, req: SimRequest) -> None:
        self._pool.release(req.refs, req.held - len(req.refs))
        req.refs = []
        req.held = req.computed = 0
        req.state = WAITING
        self._pending_tokens += req.prompt_len + req.generated - req.pending
        req.pending = req.prompt_len + req.generated
        self._waiting.appendleft(req)
        self._waiting_count += 1

    def _finish(self, req: SimRequest, reason: FinishReason) -> FinishedRequest:
        if req.state == RUNNING:
            self._pool.release(req.refs, req.held - len(req.refs))
        req.state = DONE
        self._pending_tokens -= req.pending
        req.pending = 0
        del self._requests[req.request_id]
        return FinishedRequest(
            req.request_id, reason, Usage(req.prompt_len, req.generated, req.cached_tokens)
        )

    # --- observation ---------------------------------------------------------------------

    def text(self, token_id: int) -> str:
        """Text of an output token id (filler: a space and a word)."""
        return self._filler.text(token_id)

    def drain_cache_events(self) -> list[CacheEvent]:
        """Cache changes since the last call, oldest first: evictions when a step is
        scheduled, stores when it finishes, so replaying every event drained so far
        always gives :meth:`cache_contents`."""
        events, self._events = self._events, []
        return events

    def receive_blocks(self, block_hashes: Sequence[int]) -> int:
        """A prefix's KV arrived from another site (the benchmark's KV pull across
        regions): its blocks join the prefix cache unpinned, as :meth:`BlockPool.receive`
        places them, announced in the next cache event. Returns how many leading blocks
        of ``block_hashes`` are cached afterwards; a request added later hits them unless
        they are evicted before it is scheduled."""
        count = self._pool.receive(block_hashes)
        self._take_event()
        return count

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of ``block_hashes`` the cache holds right now (the true
        state, as :class:`TrueCacheView` reads it). Linear in the answer; never raises."""
        return self._pool.longest_prefix(block_hashes, len(block_hashes))

    def host_prefix_blocks(self, block_hashes: Sequence[int], start: int) -> int:
        """How many blocks of ``block_hashes`` from index ``start`` on the host tier holds
        right now (the run a prefix hit after ``start`` device blocks would reload; 0
        without a host tier). Never raises."""
        return self._pool.host_prefix(block_hashes, start, len(block_hashes))

    def cache_contents(self) -> frozenset[int]:
        """Hint hashes of every cached block, pinned or evictable (device tier)."""
        return self._pool.contents()

    def host_contents(self) -> frozenset[int]:
        """Hint hashes of every block held in the host tier (empty without one)."""
        return self._pool.host_contents()

    def is_pinned(self, block_hash: int) -> bool:
        """Whether a running request holds the cached block ``block_hash``."""
        return self._pool.is_pinned(block_hash)

    @property
    def kv_blocks_used(self) -> int:
        """KV blocks held by running requests."""
        return self._pool.used

    @property
    def num_running(self) -> int:
        """Requests admitted and not finished."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued (including preempted ones)."""
        return self._waiting_count

    @property
    def waiting_after_schedule(self) -> int:
        """Requests the last step's scheduling left waiting — what vLLM's
        ``vllm:num_requests_waiting`` gauge shows between steps (its scheduler reports
        stats after each step; requests added during a step are not in it yet)."""
        return self._waiting_unscheduled

    def stats(self) -> EngineStats:
        """Load and cache statistics, every number simulated; rates over the last 16
        prefill and decode steps. O(1): the benchmark calls it per replica per decision."""
        return EngineStats(
            running=len(self._running),
            waiting=self._waiting_count,
            kv_cache_usage=self._pool.used / self._pool.capacity,
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
            pending_prefill_tokens=self._pending_tokens,
            prefill_tokens_per_s=self._recent.prefill_tokens_per_s,
            inter_token_latency_ms=self._recent.inter_token_latency_ms,
            step_ms=self._recent.step_ms,
            kv_cache_blocks=self._pool.capacity,
            simulated=True,
        )
