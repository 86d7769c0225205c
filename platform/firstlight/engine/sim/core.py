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

from collections.abc import Sequence

from firstlight.engine.protocol import FinishReason, GenerationRequest, Usage, check_request
from firstlight.engine.sim._core_state import CoreState
from firstlight.engine.sim._request import DONE, RUNNING, WAITING, SimRequest
from firstlight.engine.sim.results import FinishedRequest, StepResult
from firstlight.errors import InvalidRequestError
from firstlight.prefix import hint_hashes

__all__ = ["SimCore"]


class SimCore(CoreState):
    """One simulated vLLM replica's scheduler, KV cache and prefix cache.

    ``profile`` is a :class:`SimProfile` or a registered name (unknown names raise
    :class:`~firstlight.errors.ConfigError`); ``hash_seed`` is the platform's
    ``hints.hash_seed``, so the core's block hashes are the gateway's; ``seed`` picks the
    filler output. ``record_events=False`` skips cache-event bookkeeping for runs
    without a hint consumer.

    The state and the methods that only read it (``stats``, ``cached_prefix_blocks``,
    the cache events, ...) are :class:`~firstlight.engine.sim._core_state.CoreState`'s;
    this class adds what changes it: requests in and out, and the steps.
    """

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
