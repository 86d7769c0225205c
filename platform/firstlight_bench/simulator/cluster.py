"""The simulated deployment and the arms it can run: what
:func:`firstlight_bench.simulator.des.simulate` is given besides the workload.

Who calls what: ``firstlight bench sim`` (:mod:`firstlight_bench.simulator.sim`) builds a
:class:`ClusterSpec` from its options, sizes the replicas' KV caches with
:func:`kv_blocks_for` and hashes the workload once with :func:`block_hashes`; the
simulation checks the spec against the arm and workload (:meth:`ClusterSpec.check`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from firstlight.engine.sim import SimProfile, get_profile
from firstlight.errors import ConfigError, ConfigProblem
from firstlight.prefix import HashScheme, hint_hashes
from firstlight.routing.registry import REGISTRY
from firstlight_bench.workloads import Workload

__all__ = [
    "ARMS",
    "CROSS_REGION_ARMS",
    "ArmSpec",
    "ClusterSpec",
    "arm_names",
    "block_hashes",
    "kv_blocks_for",
    "parse_fleet",
]


RegionMode = Literal["local", "firstlight", "waterfall", "global_pool", "gorgo", "skywalker"]
"""How an arm picks the region (:mod:`firstlight_bench.simulator.region_arms` has the peers')."""


@dataclass(frozen=True, slots=True)
class ArmSpec:
    """One arm of the benchmark: its in-region policy and how it picks the region."""

    policy: str
    """The routing policy of each region's router (registry name)."""
    regions: RegionMode
    """``local``: the client's own region (latency DNS; the nearest healthy one while
    its region is down); ``firstlight``: the gateway's region decision
    (:func:`~firstlight.region.decide_region`); the others: the cross-region routers
    users would run instead (:mod:`firstlight_bench.simulator.region_arms`,
    :mod:`firstlight_bench.simulator.skywalker`)."""


ARMS: dict[str, ArmSpec] = {
    **{name: ArmSpec(name, "local") for name in REGISTRY},
    "firstlight": ArmSpec("firstlight", "firstlight"),
    "firstlight_local": ArmSpec("firstlight", "local"),
    "waterfall": ArmSpec("llmd_sticky", "waterfall"),
    "global_pool": ArmSpec("llmd_sticky", "global_pool"),
    "gorgo": ArmSpec("least_queue", "gorgo"),
    "skywalker": ArmSpec("least_queue", "skywalker"),
}
"""Arm name → its policy and region choice."""

CROSS_REGION_ARMS = ("waterfall", "global_pool", "gorgo", "skywalker")
"""The arms that exist for multi-region workloads (W6): elsewhere each reduces to an
in-region arm already in the matrix, so the suite runs them on W6 only."""


def arm_names() -> tuple[str, ...]:
    return tuple(ARMS)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The simulated deployment."""

    regions: int
    replicas_per_region: int
    profile: str = "h100-llama-8b"
    kv_cache_blocks: int | None = None
    """Per replica; ``None`` keeps the profile's."""
    host_kv_blocks: int = 0
    """Per replica: the host tier of its KV cache (vLLM's KV offloading, simulated at the
    profile's ``reload_ms_per_token``); 0, the default, keeps the profile's (none)."""
    rtt_ms: tuple[tuple[float, ...], ...] = ()
    """``rtt_ms[a][b]``: round trip between regions a and b; empty means 0 everywhere."""
    replica_capacity_rps: float | None = None
    """The load-1.0 rate per replica (the sweep's capacity over its replicas): what an
    operator configures as GKE's ``maxRatePerEndpoint`` (the ``waterfall`` arm)."""
    spill_over_margin_ms: float = 50.0
    stats_period_s: float = 0.5
    probe_interval_s: float = 1.0
    hash_seed: int = 0
    gateways: int = 1
    """Gateways (each with its own router) per region; requests go to them in turn."""
    route_share_ms: float | None = 1.0
    """With several gateways: how long one router's route announcements take to reach
    the region's other routers (:mod:`firstlight.region.shared_routes`, a Redis pub/sub
    hop and the publisher's batching); ``None``: routers do not share, each counts only
    the routes it made."""
    fleet: tuple[tuple[str, ...], ...] = ()
    """Per region, the profile of each of its replicas (a mixed fleet; :func:`parse_fleet`);
    empty: ``replicas_per_region`` replicas of ``profile`` in every region."""
    wan_gbps: float | None = None
    """The warm region priced (``firstlight`` only): a request whose prefix a peer holds
    may have that KV pulled to its own region over a link of this many Gbit/s
    (:mod:`firstlight.region.warm`), and each such request's three ways are replayed
    in hindsight. ``None``: no pulls, no replays."""
    hindsight_share: float = 1.0
    """With ``wan_gbps``: the share of warm requests replayed in hindsight (chosen by a
    hash of the request id, the same at every arm and load)."""
    policy_params: dict[str, dict[str, object]] = field(default_factory=dict)
    """Per policy: the parameters that differ from its defaults (the hardware figures an
    operator configures, such as the cost model's priors); other parameters and policies
    keep their published defaults."""

    def rtt(self, a: int, b: int) -> float:
        return self.rtt_ms[a][b] if self.rtt_ms else 0.0

    def build_profile(self, name: str | None = None) -> SimProfile:
        """Profile ``name`` (default: the cluster's reference ``profile``) with the KV
        cache set to ``kv_cache_blocks``, never above the device's own capacity, and a
        host tier of ``host_kv_blocks`` when set."""
        profile = get_profile(name or self.profile)
        if self.host_kv_blocks:
            profile = dataclasses.replace(profile, host_kv_blocks=self.host_kv_blocks)
        if self.kv_cache_blocks is not None:
            blocks = min(self.kv_cache_blocks, profile.kv_cache_blocks)
            # A smaller cache also caps the longest request it can hold.
            longest = min(profile.max_model_len, blocks * profile.block_size)
            profile = dataclasses.replace(profile, kv_cache_blocks=blocks, max_model_len=longest)
        return profile

    def region_profiles(self, g: int) -> list[SimProfile]:
        """The profile of each replica of region ``g``, in replica order."""
        if self.fleet:
            return [self.build_profile(name) for name in self.fleet[g]]
        return [self.build_profile()] * self.replicas_per_region

    @property
    def total_replicas(self) -> int:
        if self.fleet:
            return sum(len(region) for region in self.fleet)
        return self.regions * self.replicas_per_region

    def check(self, arm: str, workload_regions: int) -> None:
        """Raise :class:`ConfigError` for an unknown arm, a workload with more client
        regions than the cluster has, or an RTT matrix of the wrong shape."""
        if arm not in ARMS:
            raise ConfigError(
                [ConfigProblem("arms", f"unknown arm; known: {', '.join(ARMS)}", arm, True)]
            )
        if workload_regions > self.regions:
            raise ConfigError(
                [
                    ConfigProblem(
                        "regions",
                        f"the workload has {workload_regions} client regions",
                        self.regions,
                        True,
                    )
                ]
            )
        if self.fleet:
            if len(self.fleet) != self.regions or not all(self.fleet):
                raise ConfigError(
                    [
                        ConfigProblem(
                            "fleet",
                            f"must list the replicas of each of the {self.regions} regions",
                            self.fleet,
                            True,
                        )
                    ]
                )
            for region in self.fleet:
                for name in region:
                    get_profile(name)
        if self.wan_gbps is not None and not (math.isfinite(self.wan_gbps) and self.wan_gbps > 0):
            raise ConfigError(
                [ConfigProblem("wan_gbps", "must be a finite number > 0", self.wan_gbps, True)]
            )
        if not 0 < self.hindsight_share <= 1:
            raise ConfigError(
                [ConfigProblem("hindsight_share", "must be in (0, 1]", self.hindsight_share, True)]
            )
        if self.rtt_ms and (
            len(self.rtt_ms) != self.regions or any(len(row) != self.regions for row in self.rtt_ms)
        ):
            raise ConfigError(
                [
                    ConfigProblem(
                        "rtt_ms", f"must be {self.regions} x {self.regions}", self.rtt_ms, True
                    )
                ]
            )


def parse_fleet(text: str) -> tuple[tuple[str, ...], ...]:
    """``"h100-llama-8b*16;h100-llama-8b*8+a100-llama-8b*8"`` → per region (``;``) the
    profile of each replica (``+`` joins ``name*count`` parts). Raises
    :class:`ConfigError` naming ``fleet`` for a malformed text or an unknown profile."""
    regions = []
    try:
        for region_text in text.split(";"):
            replicas: list[str] = []
            for part in region_text.split("+"):
                name, _, count = part.strip().partition("*")
                number = int(count) if count else 1
                if not name or not 1 <= number <= 1024:
                    raise ValueError(part)
                get_profile(name)
                replicas += [name] * number
            regions.append(tuple(replicas))
    except ValueError as exc:
        raise ConfigError(
            [ConfigProblem("fleet", f"expected name*count[+...][;...], got {exc}", text, True)]
        ) from exc
    return tuple(regions)


def block_hashes(
    workload: Workload,
    cluster: ClusterSpec,
    memo: dict[tuple[int, ...], tuple[int, ...]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Every request's hint-form block hashes (the gateway's), by request id. ``memo``
    (prompt → hashes), shared across the loads of a sweep, saves hashing a prompt
    twice: request ids need not name the same prompt at another rate (W2)."""
    scheme = HashScheme(cluster.build_profile().block_size, cluster.hash_seed)
    memo = {} if memo is None else memo
    out = {}
    for r in workload.requests:
        hashes = memo.get(r.prompt)
        if hashes is None:
            hashes = memo[r.prompt] = hint_hashes(r.prompt, scheme)
        out[r.request_id] = hashes
    return out


def kv_blocks_for(
    workload: Workload,
    hashes: Mapping[str, tuple[int, ...]],
    replicas: int,
    profile: SimProfile,
    share: float = 0.7,
    min_requests: int = 16,
) -> int:
    """Per-replica KV-cache blocks such that the workload's distinct shared blocks (held
    by more than one request) need ``share`` of the whole cluster's cache (BENCHMARKS.md),
    but at least room for ``min_requests`` requests of the workload's mean size at once
    (a replica that can hold only a handful of requests measures its KV cache, not
    routing)."""
    seen: dict[int, int] = {}
    for block_list in hashes.values():
        for block in block_list:
            seen[block] = seen.get(block, 0) + 1
    shared = sum(1 for count in seen.values() if count > 1)
    mean_tokens = workload.mean_prompt_tokens() + workload.mean_output_tokens()
    longest = max((len(r.prompt) + r.max_tokens) for r in workload.requests)
    floor_tokens = max(min_requests * mean_tokens, 2 * longest)
    wanted = math.ceil(shared / (share * replicas)) if shared else 0
    return max(wanted, math.ceil(floor_tokens / profile.block_size))
