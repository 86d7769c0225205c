"""Clients of a live platform: the load driver that replays a workload over HTTP, the
live policy comparison built on it, and the closed loops (httpx, and the official
``openai`` client) that keep a number of requests in flight.

Called by ``firstlight bench run`` and ``live`` (:mod:`firstlight_bench.cli`), by the
measurement tools (:mod:`firstlight_bench.tools`: soak, autoscale, serving) and by the
fault tests (``tests/serve/``). Importing this package imports none of its modules.
"""
