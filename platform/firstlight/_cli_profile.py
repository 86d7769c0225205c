"""``firstlight profile``: flame graphs and top frames of a local region's processes
(py-spy). Mounted by :mod:`firstlight.cli`; errors as there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from firstlight._console import fail as _fail
from firstlight._console import load as _load
from firstlight._console import stderr as _stderr
from firstlight.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from firstlight.profile import ProcessProfile

__all__ = ["profile"]


def profile(
    region: Annotated[
        str | None, typer.Option(help="Region to profile (default: the config's region).")
    ] = None,
    seconds: Annotated[
        int, typer.Option(min=1, max=3600, help="Seconds to record each process.")
    ] = 10,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for the files (default: profiles/<region>-<UTC time>)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="Configuration file (its region is the default region)."
        ),
    ] = None,
    address: Annotated[str, typer.Option(help="Ray cluster address.")] = "auto",
    rate: Annotated[int, typer.Option(min=1, max=1000, help="Samples per second.")] = 100,
    idle: Annotated[
        bool, typer.Option("--idle", help="Also sample waiting threads (wall time, not CPU).")
    ] = False,
    subprocesses: Annotated[
        bool,
        typer.Option(
            "--subprocesses", help="Also sample child processes (a vLLM replica's engine core)."
        ),
    ] = False,
    top: Annotated[int, typer.Option(min=1, max=100, help="Frames to print per process.")] = 10,
) -> None:
    """Record py-spy profiles of a running local region's gateway and model replicas.

    Writes a flame graph (SVG) and the collapsed stacks of every replica process to
    OUT, then prints each process's frames with the most self time. Exits 1 when no
    Ray cluster or no such region runs, or when a replica process of this machine could
    not be profiled (replicas on other nodes are listed with a note).
    """
    from firstlight.profile import (
        ProfileOptions,
        ProfilingError,
        default_out_dir,
        profile_region,
    )

    cfg = _load(config) if config is not None else None
    name = region or (cfg.region if cfg is not None else None)
    if name is None:
        _fail(ConfigError([ConfigProblem("region", "pass --region or set region", None)]))
    if cfg is not None and name not in {r.name for r in cfg.regions}:
        known = ", ".join(r.name for r in cfg.regions)
        _fail(ProfilingError(f"unknown region {name!r}; regions of {config}: {known}"))
    folder = out if out is not None else default_out_dir(name)
    options = ProfileOptions(
        seconds=seconds, rate_hz=rate, idle=idle, subprocesses=subprocesses, top=top
    )
    try:
        with _stderr.status(f"Recording region {name} for {seconds} s"):
            result = profile_region(name, folder, options, address=address)
    except ProfilingError as exc:
        _fail(exc)
    _stderr.print(
        f"Recorded {len(result.processes)} process(es) of region {name} for {seconds} s "
        f"at {rate} Hz into {folder}",
        markup=False,
    )
    _print_profiles(result.processes)
    failed = [p.process.label for p in result.processes if p.process.local and not p.recorded]
    if failed:
        _fail(ProfilingError(f"not profiled: {', '.join(failed)} (see the notes above)"))


def _print_profiles(profiles: tuple[ProcessProfile, ...]) -> None:
    from firstlight.profile import render_top_frames

    for item in profiles:
        typer.echo(
            f"\n{item.process.label} (pid {item.process.pid}): {item.stacks.total_samples} samples"
        )
        if item.flamegraph is not None:
            typer.echo(f"  flame graph       {item.flamegraph}")
        if item.collapsed is not None:
            typer.echo(f"  collapsed stacks  {item.collapsed}")
        for note in item.notes:
            typer.echo(f"  note: {note}")
        if item.collapsed is not None:
            typer.echo(render_top_frames(item.top))
