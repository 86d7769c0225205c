"""The simulator: the discrete-event simulation (:mod:`~firstlight_bench.simulator.des`)
and what it runs — the simulated cluster and its arms, one region's replicas and routers,
the cross-region routers users would run instead (GORGO, SkyWalker, ...), the warm
region, the ``floor`` reference and a W6 day's record.

Called by ``firstlight bench sim`` (:mod:`firstlight_bench.simulator.sim`), the suite
(:mod:`firstlight_bench.suite`), ``firstlight bench run`` (:mod:`firstlight_bench.clients.live`
takes its cluster and arms from here) and the offload study
(:mod:`firstlight_bench.tools.offload`). Importing this package imports none of its
modules.
"""
