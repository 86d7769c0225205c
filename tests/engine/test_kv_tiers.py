"""vLLM's KV events by medium → the router's two tiers (``firstlight.engine.kv_tiers``),
checked against the mirror they feed: after any sequence of events, the mirror's device
and host tiers are what the engine holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from firstlight.engine.kv_tiers import KvTiers
from firstlight.engine.protocol import CacheEvent
from firstlight.hints import BlockEvent, HintMirror


def _apply(mirror: HintMirror, event: CacheEvent | None) -> None:
    if event is not None:
        mirror.apply(
            BlockEvent(
                "r",
                1,
                event.stored,
                event.removed,
                event.cleared,
                event.offloaded,
                event.offload_removed,
            )
        )


def test_write_through_offloading_keeps_each_block_in_its_best_tier() -> None:
    tiers = KvTiers()
    assert tiers.stored([1, 2, 3], "GPU") == CacheEvent(stored=(1, 2, 3))
    assert tiers.stored([1, 2], "CPU") is None  # written through: still on the device
    assert tiers.removed([1, 3], "GPU") == CacheEvent(removed=(3,), offloaded=(1,))
    assert tiers.removed([2], "CPU") is None  # still on the device: nothing to tell
    assert tiers.removed([1], "CPU") == CacheEvent(offload_removed=(1,))
    assert tiers.stored([9], "CPU") == CacheEvent(offloaded=(9,))  # loaded from elsewhere
    assert tiers.stored([4], None) == CacheEvent(stored=(4,))  # builds that name no medium
    assert tiers.stored([5], "STORAGE") is None  # a tier the router does not price
    assert tiers.removed([5], "STORAGE") is None
    assert tiers.cleared() == CacheEvent(cleared=True)
    assert tiers.removed([2, 4, 9], "GPU") == CacheEvent(removed=(2, 4, 9))


def test_without_offloading_events_pass_through() -> None:
    tiers = KvTiers()
    assert tiers.stored([7, 8], "GPU") == CacheEvent(stored=(7, 8))
    assert tiers.removed([7], "GPU") == CacheEvent(removed=(7,))
    assert tiers.removed([], "GPU") is None


events = st.lists(
    st.tuples(
        st.sampled_from(["store", "remove", "clear"]),
        st.lists(st.integers(0, 12), max_size=5, unique=True),
        st.sampled_from(["GPU", "CPU", None]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_the_mirror_follows_the_engine_through_any_events(
    steps: list[tuple[str, list[int], str | None]],
) -> None:
    tiers = KvTiers()
    mirror = HintMirror(ttl_s=3600.0, clock=lambda: 0.0)
    device: set[int] = set()
    host: set[int] = set()
    for kind, blocks, medium in steps:
        on_device = medium in ("GPU", None)
        if kind == "clear":
            device.clear()
            host.clear()
            _apply(mirror, tiers.cleared())
        elif kind == "store":
            (device if on_device else host).update(blocks)
            _apply(mirror, tiers.stored(blocks, medium))
        else:
            (device if on_device else host).difference_update(blocks)
            _apply(mirror, tiers.removed(blocks, medium))
        for block in range(13):
            in_device = mirror.longest_prefix([block]).get("r", 0) == 1
            in_host = mirror.host_prefix([block], {}).get("r", 0) == 1
            assert in_device == (block in device), (block, device, host)
            assert in_host == (block in host and block not in device), (block, device, host)
