"""Results and reports: per-request outcomes into result points, the ``results.json``
schema, a run folder's ``report.md`` and plots, the spread over seeds, and the pure
report and table makers of the measurement tools (the generated sections of the docs'
pages, held to the stored runs by the tests).

Called by the simulator and the load driver (:func:`firstlight_bench.reports.report.write_run`),
the suite (:mod:`firstlight_bench.suite`), the measurement tools
(:mod:`firstlight_bench.tools`) and the tests. Importing this package imports none of its
modules (matplotlib is imported only when a plot is drawn).
"""
