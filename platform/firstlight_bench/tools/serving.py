"""Serving benchmark: what the platform adds over the engine, and what its gateways carry.

Run ``firstlight bench serving [--requests 200] [--concurrency 1,8,32] [--gateways 1,2]
[--kill on|off] [--prompt-tokens 128] [--max-tokens 8] [--duration 10] [--seed 0]
[--ingress haproxy|serve-proxy] [--throughput-optimized on|off] [--out FOLDER [--page
PAGE]]`` (:func:`serving`, the typer command of this module's ``app``). One local Ray
cluster (``num_cpus=2``), one region whose model runs the simulator's ``instant`` profile
(2 replicas, microsecond steps): **simulated engine, real platform** - the numbers are
the platform's own cost, and the report says ``"simulated_engine": true``.

1. Overhead: ``--requests`` sequential requests per path (after 20 warm-up ones), the
   same random token prompts on each (the HTTP paths take turns request by request, then
   ``port``, ``handle``, then ``direct``); TTFT (first chunk, or first SSE ``data:``
   event) and end-to-end, p50/p90/p99, timed by the caller:

   * ``direct``: a ``SimEngine`` (``instant``) in this process, no Ray;
   * ``port``: the replicas' own ports from this process, taking turns, as a gateway
     streams from them (:mod:`firstlight.serve.replica_port`): the data path's hop alone;
   * ``handle``: the model deployment's Ray handle from this process (Firstlight's
     request router then runs here): Ray routing and the replica hop, no gateway;
   * ``http_tokens``: streaming ``POST /v1/completions``, ``prompt`` as token ids
     (httpx, keep-alive): the ingress → gateway → the chosen replica's port (or its
     handle, with ``gateway.data_path: ray-handle``);
   * ``http_chat_text``: streaming chat completions, a text prompt as long once
     templated (the sim byte-level encoder, not a real tokenizer);
   * ``http_floor``: ``GET /healthz`` (proxy → gateway, no model call);
   * ``ray_serve_floor``: the ``http_tokens`` bodies to a bare Ray Serve app of the same
     shape (ingress → 2-replica deployment streaming ``max_tokens + 1`` items as SSE).

   ``added_ms`` subtracts percentiles (not a percentile of differences); ``target``
   checks an earlier issue's goal, ``http_tokens - direct`` p50 ≤ 3 ms (the page shows
   the current goals); ``decision_mean_us`` is the gateways' mean policy time per
   decision, from their ``/metrics`` histogram. The page splits ``http_tokens``'s TTFT
   p50 by hop (:func:`~firstlight_bench.reports.serving_markdown.hops`) and draws it (``hops.png``).
2. Capacity per gateway count (``--gateways 1,2``: ``gateway.replicas``), the region
   redeployed for each, in A B B A blocks: closed-loop clients at each ``--concurrency``
   for ``--duration`` s, and the cores each group of processes used meanwhile
   (:mod:`firstlight_bench.tools.serving_gateways`); ``capacity`` compares the most gateways'
   best requests/s with the fewest's against the issue's goal (at least 1.7 times).
3. With ``--kill on`` (the default), one of the most gateways is killed under steady
   load after its last block, and every failed request is counted (goal: none).

The overhead paths run on the deployment with the most gateways (the default region has
two).

``--ingress`` and ``--throughput-optimized`` choose the data plane (``gateway.ingress``,
``gateway.throughput_optimized``; defaults: the configuration's), set in the environment
before Ray starts (:mod:`firstlight.serve.data_plane`) and recorded in ``meta``. Prints a
table; the JSON goes to ``OUT/results.json`` (else stdout), with the command and commit,
and ``--page`` rewrites that page's section for the run (markers named after OUT's
folder name: :func:`~firstlight_bench.reports.serving_markdown.markers`); ``--tables-only --page
PAGE`` rewrites every section from the reports stored beside the page. A test holds
``docs/serving.md`` to the stored reports. Phase 1's paths are timed by
:mod:`firstlight_bench.tools.serving_paths`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import platform
import re
import sys
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from firstlight._ports import free_port
from firstlight.config import PlatformConfig, parse_config
from firstlight_bench.options import (
    OutOption,
    PageOption,
    PageTablesOnlyOption,
    SeedOption,
    command_line,
    csv_ints,
    page_needs_out,
    tables_page,
)
from firstlight_bench.reports.results import git_commit
from firstlight_bench.reports.sections import rewrite_sections, store_section
from firstlight_bench.reports.serving_markdown import markers, plot_hops, render_markdown
from firstlight_bench.reports.serving_report import (
    capacity,
    render,
)
from firstlight_bench.tools.serving_gateways import KILL_CLIENTS, capacity_block, kill_one_gateway
from firstlight_bench.tools.serving_paths import CHAT_PATH, MODEL, REGION, WARM_UP, measure_overhead

__all__ = ["app", "bench_config", "rewrite_page"]


# --- the platform's config ----------------------------------------------------------------


def _drop_hints(config: PlatformConfig) -> None:
    """Delete this run's Redis keys (its prefix is unique; the hint feed never expires)."""
    import redis

    client = redis.Redis.from_url(config.hints.redis_url, socket_timeout=2.0)
    try:
        keys = list(client.scan_iter(match=f"{config.hints.key_prefix}*"))
        if keys:
            client.delete(*keys)
    except redis.RedisError as exc:
        typer.echo(f"could not delete the run's hint keys: {exc}", err=True)
    finally:
        client.close()


def bench_config(
    port: int,
    prompt_tokens: int,
    run_id: str,
    *,
    ingress: str = "haproxy",
    throughput_optimized: bool = True,
    gateways: int = 2,
) -> PlatformConfig:
    """One local region serving the ``instant`` simulator on 2 replicas, auth off, with
    the given data plane (``gateway.ingress``, ``gateway.throughput_optimized``) and
    ``gateways`` gateway replicas."""
    model = {
        "name": MODEL,
        "engine": "sim",
        "sim_profile": "instant",
        "replicas": 2,
        "resources": {"num_cpus": 0},
        "max_model_len": max(2048, prompt_tokens + 256),
    }
    data: dict[str, Any] = {
        "mode": "local",
        "regions": [{"name": REGION}],
        "models": [model],
        "router": {"policy": "firstlight"},
        "hints": {"key_prefix": f"flbench:{run_id}:"},
        "auth": {"enabled": False},
        "gateway": {
            "host": "127.0.0.1",
            "port": port,
            "ingress": ingress,
            "throughput_optimized": throughput_optimized,
            "replicas": gateways,
        },
    }
    return parse_config(data, "serving benchmark")


def rewrite_page(page: Path) -> None:
    """Rewrite every ``serving:`` section of ``page`` from the report stored for it
    (:func:`~firstlight_bench.reports.sections.rewrite_sections`), and redraw its ``hops.png``."""
    rewrite_sections(page, "serving", markers, render_markdown)
    for name in re.findall(r"<!-- serving:([\w-]+):begin", page.read_text()):
        folder = page.parent / "benchmarks" / name
        plot_hops(json.loads((folder / "results.json").read_text()), folder / "hops.png")


class OnOff(StrEnum):
    """``--kill`` and ``--throughput-optimized``: on or off."""

    ON = "on"
    OFF = "off"


class Ingress(StrEnum):
    """``--ingress``: what takes the clients' HTTP (``gateway.ingress``)."""

    HAPROXY = "haproxy"
    SERVE_PROXY = "serve-proxy"


app = typer.Typer(add_completion=False)


@app.command()
def serving(
    requests: Annotated[int, typer.Option(min=2, help="Sequential, per path.")] = 200,
    concurrency: Annotated[str, typer.Option(help="Closed-loop client levels.")] = "1,8,32",
    gateways: Annotated[str, typer.Option(help="Gateway counts compared (A B B A).")] = "1,2",
    kill: Annotated[OnOff, typer.Option(help="Kill a gateway under load.")] = OnOff.ON,
    duration: Annotated[float, typer.Option(help="Seconds per level.")] = 10.0,
    prompt_tokens: Annotated[int, typer.Option(min=32, help="Prompt tokens.")] = 128,
    max_tokens: Annotated[int, typer.Option(help="Output tokens (overhead).")] = 8,
    seed: SeedOption = 0,
    out: OutOption = None,
    page: PageOption = None,
    tables_only: PageTablesOnlyOption = False,
    ingress: Annotated[Ingress, typer.Option(help="gateway.ingress")] = Ingress.HAPROXY,
    throughput_optimized: Annotated[
        OnOff, typer.Option(help="gateway.throughput_optimized")
    ] = OnOff.ON,
) -> None:
    """``firstlight bench serving``: what the platform adds over the engine (on the most
    --gateways), each gateway count's capacity, and one gateway killed under load; prints
    the table (and the JSON without --out)."""
    if tables_only:
        rewrite_page(tables_page(page))
        return
    levels = csv_ints(concurrency, "--concurrency")
    counts = sorted(set(csv_ints(gateways, "--gateways")))
    if kill is OnOff.ON and max(counts) < 2:
        raise typer.BadParameter("--kill on needs a count >= 2", param_hint="--gateways")
    page_needs_out(out, page)
    options: dict[str, Any] = {  # as recorded in the report's meta
        "requests": requests,
        "concurrency": concurrency,
        "gateways": gateways,
        "kill": kill.value,
        "duration": duration,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "seed": seed,
        "tables_only": tables_only,
        "ingress": ingress.value,
        "throughput_optimized": throughput_optimized.value,
    }
    commit = git_commit()

    from firstlight.serve.data_plane import prepare_local_ray

    port, run_id = free_port(), uuid.uuid4().hex[:8]
    optimized = throughput_optimized is OnOff.ON  # the data plane: gateway.* settings
    plane: dict[str, Any] = {"ingress": ingress.value, "throughput_optimized": optimized}
    configs = {n: bench_config(port, prompt_tokens, run_id, gateways=n, **plane) for n in counts}
    config = configs[max(counts)]

    # Before Ray Serve is imported: this process's handle path reads the settings too.
    prepare_local_ray(config.gateway)

    import ray
    from ray import serve

    from firstlight.serve.local_mode import LocalPlatform, start_local, stop_local

    say = functools.partial(typer.echo, err=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # A B B A: each count's blocks straddle the other's, so a drift touches both alike.
    order = counts + counts[::-1]
    most, last_of_most = max(counts), len(order) - 1 - order[::-1].index(max(counts))
    rows: list[dict[str, Any]] = []
    overhead: dict[str, Any] | None = None
    kills: list[dict[str, Any]] = []
    running: LocalPlatform | None = None
    hints_note = ""
    try:
        for block, n in enumerate(order):
            if block == 0 or order[block - 1] != n:
                if running is not None:
                    stop_local(running)
                    running = None
                running = start_local(configs[n], report=say, timeout_s=300)
                hints_note, endpoint = running.hints_note, running.endpoints[REGION]
            if n == most and overhead is None:
                say("measuring overhead")
                overhead = measure_overhead(options, configs[n], endpoint)
            say(f"measuring throughput with {n} gateway(s), block {block}")
            url = f"{endpoint}{CHAT_PATH}"
            rows += asyncio.run(
                capacity_block(url, MODEL, levels, duration, gateways=n, block=block)
            )
            if kill is OnOff.ON and block == last_of_most:
                for client in KILL_CLIENTS:
                    say(f"killing one of {n} gateways under load ({client} clients)")
                    run = kill_one_gateway(endpoint, REGION, MODEL, gateways=n, client=client)
                    try:
                        kills.append(asyncio.run(run))
                    except (TimeoutError, httpx.HTTPError) as exc:  # keep what was measured
                        kills.append({"client": client, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        if running is not None:
            stop_local(running)
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
        _drop_hints(config)
    report: dict[str, Any] = {
        "simulated_engine": True,
        "meta": {
            "what": "simulated engine (sim profile 'instant'), real platform",
            "command": command_line(),
            "git_commit": commit,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "ray": ray.__version__,
            "ingress": config.gateway.ingress,
            "serve_throughput_optimized": "1" if config.gateway.throughput_optimized else "0",
            "hints": hints_note,
            "options": options,
            "warm_up": WARM_UP,
            "config": config.model_dump(mode="json"),
        },
        "overhead": overhead,
        "throughput": rows,
        "capacity": capacity(rows),
        "kills": kills,
    }
    typer.echo(render(report))
    if out is not None:
        store_section(report, out, page, markers, render_markdown)
        plot_hops(report, out / "hops.png")
    else:
        typer.echo(json.dumps(report, indent=2))
