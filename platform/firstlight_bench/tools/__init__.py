"""The measurement tools: each ``firstlight bench <tool>`` is the typer ``app`` of the
module ``firstlight_bench.tools.<tool>`` (``-`` in the name becomes ``_``), beside the
private helpers of some of them (``*_checks``, ``*_judges``, ``*_gateways``, ...).

Listed without importing them by :mod:`firstlight_bench.registry`, which imports a
tool's module only when that tool runs; so this package's ``__init__`` imports nothing
(``firstlight --help`` stays fast: no vllm, ray, openai or matplotlib).
"""
