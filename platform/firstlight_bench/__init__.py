"""The routing benchmark: ``firstlight bench``, mounted into the main CLI through the
``firstlight.commands`` entry point (:data:`firstlight_bench.cli.bench_app`).

The folders, by role:

* :mod:`firstlight_bench.workloads` — the workloads W1..W8 and the published presets;
* :mod:`firstlight_bench.simulator` — the discrete-event simulation and what it runs
  (``firstlight bench sim``);
* :mod:`firstlight_bench.clients` — what talks to a live platform: the load driver and
  the closed loops (``firstlight bench run`` and ``live``, the measurement tools, the
  fault tests);
* :mod:`firstlight_bench.reports` — results files, reports, plots and the generated
  tables of the docs' pages;
* :mod:`firstlight_bench.tools` — the measurement tools (``firstlight bench <tool>``)
  and their private helpers.

At the top: the CLI (:mod:`~firstlight_bench.cli`), the options its commands share
(:mod:`~firstlight_bench.options`), the lazy list of the tools
(:mod:`~firstlight_bench.registry`) and the suite behind ``docs/benchmarks.md``
(:mod:`~firstlight_bench.suite`, :mod:`~firstlight_bench.remeasure`).
"""
