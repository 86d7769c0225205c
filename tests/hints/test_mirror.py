"""HintMirror: longest-prefix lookups, TTL, epochs, removal, pruning — against a naive
reference model under hypothesis, and case by case."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstlight.errors import HintsError, InvalidBlockEventError
from firstlight.hints import MAX_BLOCK_HASH, BlockEvent, HintMirror, ReplicaSnapshot
from tests.hints.conftest import FakeClock

TTL_S = 10.0


def ev(
    replica: str,
    stored: tuple[int, ...] = (),
    removed: tuple[int, ...] = (),
    *,
    epoch: int = 1,
    cleared: bool = False,
) -> BlockEvent:
    return BlockEvent(replica, epoch, stored, removed, cleared)


def mirror_with(*events: BlockEvent, clock: FakeClock | None = None) -> HintMirror:
    mirror = HintMirror(TTL_S, clock or FakeClock())
    for event in events:
        mirror.apply(event)
    return mirror


# --- longest_prefix, case by case ---------------------------------------------------------

LOOKUPS = [
    pytest.param([], [1, 2], {}, id="empty-mirror"),
    pytest.param([ev("a", (1, 2))], [], {}, id="empty-chain"),
    pytest.param([ev("a", (1, 2, 3))], [1, 2, 3], {"a": 3}, id="full-match"),
    pytest.param([ev("a", (1, 2, 3))], [1, 2], {"a": 2}, id="chain-shorter-than-holdings"),
    pytest.param([ev("a", (1, 2, 3))], [1, 2, 3, 4, 5], {"a": 3}, id="chain-longer"),
    pytest.param([ev("a", (1, 2, 4))], [1, 2, 3, 4], {"a": 2}, id="gap-stops-count"),
    pytest.param([ev("a", (2, 3))], [1, 2, 3], {}, id="first-block-missing"),
    pytest.param([ev("a", (3, 2, 1))], [1, 2, 3], {"a": 3}, id="stored-order-irrelevant"),
    pytest.param(
        [ev("a", (1, 2, 3)), ev("b", (1,)), ev("c", (2, 3))],
        [1, 2, 3],
        {"a": 3, "b": 1},
        id="several-replicas",
    ),
    pytest.param([ev("a", (1, 2, 3)), ev("b", (1, 2, 3))], [1, 2, 3], {"a": 3, "b": 3}, id="tie"),
    pytest.param(
        [ev("a", (1, 2, 3)), ev("a", removed=(2,))], [1, 2, 3], {"a": 1}, id="removed-makes-gap"
    ),
    pytest.param([ev("a", (1, 2)), ev("a", removed=(1,))], [1, 2], {}, id="removed-first-block"),
    pytest.param(
        [ev("a", (1, 2)), ev("a", (5,), cleared=True)], [1, 2], {}, id="cleared-drops-old"
    ),
    pytest.param(
        [ev("a", (1, 2)), ev("a", (1,), cleared=True)], [1, 2], {"a": 1}, id="cleared-then-stored"
    ),
    pytest.param(
        [ev("a", (1, 2)), ev("a", (2,), (2,))], [1, 2], {"a": 2}, id="removed-then-stored"
    ),
    pytest.param([ev("a", (7,))], [7, 7, 7], {"a": 3}, id="repeated-block"),
    pytest.param(
        [ev("a", (0, MAX_BLOCK_HASH))], [0, MAX_BLOCK_HASH], {"a": 2}, id="extreme-hashes"
    ),
    pytest.param(
        [ev("a", (1, 2), epoch=1), ev("a", (1,), epoch=2)], [1, 2], {"a": 1}, id="new-epoch"
    ),
    pytest.param(
        [ev("a", (1,), epoch=2), ev("a", (1, 2), epoch=1)], [1, 2], {"a": 1}, id="stale-epoch"
    ),
]


@pytest.mark.parametrize(("events", "chain", "expected"), LOOKUPS)
def test_longest_prefix(
    events: list[BlockEvent], chain: list[int], expected: dict[str, int]
) -> None:
    assert mirror_with(*events).longest_prefix(chain) == expected


# --- TTL ---------------------------------------------------------------------------------


def test_entries_expire_after_ttl_without_sleeping() -> None:
    clock = FakeClock()
    mirror = mirror_with(ev("a", (1, 2, 3)), clock=clock)
    clock.advance(TTL_S)
    assert mirror.longest_prefix([1, 2, 3]) == {"a": 3}, "an entry exactly ttl old still counts"
    clock.advance(0.001)
    assert mirror.longest_prefix([1, 2, 3]) == {}
    assert len(mirror) == 3, "expired entries stay until pruned"


def test_a_batch_published_exactly_ttl_ago_is_still_stored() -> None:
    """A batch's age counts against the ttl as an entry's does: exactly ttl old is still
    fresh (stored, and found until the clock moves on), a moment older stores nothing."""
    clock = FakeClock()
    mirror = HintMirror(TTL_S, clock)
    mirror.apply(ev("a", (1,)), age_s=TTL_S)
    mirror.apply(ev("b", (1,)), age_s=TTL_S + 0.001)
    assert mirror.longest_prefix([1]) == {"a": 1}
    assert mirror.replicas() == {"a"}
    clock.advance(0.001)
    assert mirror.longest_prefix([1]) == {}


def test_a_ttl_under_a_second_is_accepted_and_expires_its_entries() -> None:
    clock = FakeClock()
    mirror = HintMirror(0.5, clock)
    assert mirror.ttl_s == 0.5
    mirror.apply(ev("a", (1, 2)))
    clock.advance(0.5)
    assert mirror.longest_prefix([1, 2]) == {"a": 2}
    clock.advance(0.001)
    assert mirror.longest_prefix([1, 2]) == {}


def test_refreshing_a_block_extends_only_that_block() -> None:
    clock = FakeClock()
    mirror = mirror_with(ev("a", (1, 2, 3)), clock=clock)
    clock.advance(6)
    mirror.apply(ev("a", (1, 2)))
    clock.advance(6)
    assert mirror.longest_prefix([1, 2, 3]) == {"a": 2}


def test_age_of_a_published_batch_counts_against_its_ttl() -> None:
    clock = FakeClock()
    mirror = HintMirror(TTL_S, clock)
    mirror.apply(ev("a", (1,)), age_s=8)
    mirror.apply(ev("b", (1,)), age_s=TTL_S + 1)
    assert mirror.longest_prefix([1]) == {"a": 1}
    assert mirror.replicas() == {"a"}, "a batch older than the ttl stores nothing"
    clock.advance(2.5)
    assert mirror.longest_prefix([1]) == {}


def test_a_replayed_older_batch_does_not_age_a_block() -> None:
    clock = FakeClock()
    mirror = HintMirror(TTL_S, clock)
    mirror.apply(ev("a", (1,)))
    mirror.apply(ev("a", (1,)), age_s=9)
    clock.advance(5)
    assert mirror.longest_prefix([1]) == {"a": 1}


def test_prune_removes_only_expired_entries() -> None:
    clock = FakeClock()
    mirror = mirror_with(ev("a", (1, 2)), ev("b", (1,)), clock=clock)
    clock.advance(TTL_S - 1)
    mirror.apply(ev("b", (2, 3)))
    clock.advance(2)
    assert mirror.prune() == 3
    assert len(mirror) == 2
    assert mirror.replicas() == {"b"}
    assert mirror.longest_prefix([2, 3]) == {"b": 2}
    assert mirror.prune() == 0


def test_prune_with_a_budget_works_through_the_blocks_in_slices() -> None:
    clock = FakeClock()
    mirror = mirror_with(ev("a", tuple(range(10))), ev("b", tuple(range(5))), clock=clock)
    clock.advance(TTL_S + 1)
    removed = [mirror.prune(budget=4) for _ in range(3)]  # 10 blocks: 4 + 4 + 2 checked
    assert all(count <= 4 * 2 for count in removed), "at most budget blocks x 2 replicas"
    assert sum(removed) == 15
    assert len(mirror) == 0
    assert mirror.replicas() == set()
    assert mirror.prune(budget=4) == 0


# --- epochs, clearing, dropping ----------------------------------------------------------


def test_new_epoch_drops_the_replicas_old_blocks_only() -> None:
    mirror = mirror_with(ev("a", (1, 2, 3)), ev("b", (1, 2)))
    mirror.apply(ev("a", removed=(), epoch=2))
    assert mirror.longest_prefix([1, 2, 3]) == {"b": 2}
    assert mirror.epoch_of("a") == 2
    assert len(mirror) == 2


def test_stale_epoch_events_are_ignored_and_counted() -> None:
    mirror = mirror_with(ev("a", (1,), epoch=3))
    mirror.apply(ev("a", (1, 2), epoch=2))
    mirror.apply(ev("a", removed=(1,), epoch=1))
    mirror.apply(ev("a", cleared=True, epoch=0))
    assert mirror.longest_prefix([1, 2]) == {"a": 1}
    assert mirror.stats.ignored_stale_epoch == 3


def test_drop_replica_forgets_its_blocks_but_not_its_epoch() -> None:
    mirror = mirror_with(ev("a", (1, 2), epoch=4), ev("b", (1, 2)))
    assert mirror.drop_replica("a") == 2
    assert mirror.drop_replica("a") == 0
    assert mirror.drop_replica("never-seen") == 0
    assert mirror.replicas() == {"b"}
    assert mirror.longest_prefix([1, 2]) == {"b": 2}
    mirror.apply(ev("a", (1,), epoch=3))
    assert mirror.longest_prefix([1]) == {"b": 1}, "a late event of an old epoch stays ignored"


def test_stats_snapshot() -> None:
    clock = FakeClock()
    mirror = HintMirror(TTL_S, clock)
    assert mirror.stats.last_event_at is None
    mirror.apply(ev("a", (1, 2)))
    clock.advance(1)
    mirror.apply(ev("b", (1,)))
    mirror.apply(ev("b", (9,), epoch=0))
    mirror.record_malformed(2)
    stats = mirror.stats
    assert (stats.entries, stats.replicas) == (3, 2)
    assert (stats.ignored_stale_epoch, stats.malformed_skipped) == (1, 2)
    assert stats.last_event_at == clock.now


def test_load_snapshot_replaces_the_content() -> None:
    clock = FakeClock()
    mirror = mirror_with(ev("a", (1, 2)), ev("gone", (1,)), ev("old", (1,), epoch=5), clock=clock)
    mirror.load_snapshot(
        {
            "a": ReplicaSnapshot(1, [(1, 0.0), (3, 9.5), (4, TTL_S + 1)]),
            "new": ReplicaSnapshot(2, [(1, 1.0)]),
            "old": ReplicaSnapshot(4, [(1, 0.0)]),
        }
    )
    assert mirror.replicas() == {"a", "new"}
    assert mirror.longest_prefix([1]) == {"a": 1, "new": 1}
    assert mirror.longest_prefix([3]) == {"a": 1}
    assert mirror.longest_prefix([4]) == {}, "members older than the ttl are not loaded"
    assert mirror.stats.ignored_stale_epoch == 1
    clock.advance(1)
    assert mirror.longest_prefix([3]) == {}, "a snapshot member keeps its age"


# --- the host tier (KV offloading) --------------------------------------------------------


def off(
    replica: str,
    offloaded: tuple[int, ...] = (),
    offload_removed: tuple[int, ...] = (),
    *,
    stored: tuple[int, ...] = (),
    epoch: int = 1,
) -> BlockEvent:
    return BlockEvent(
        replica, epoch, stored, (), offloaded=offloaded, offload_removed=offload_removed
    )


def test_a_block_moves_between_the_tiers_and_leaves_the_host_tier_when_evicted_there() -> None:
    mirror = mirror_with(ev("a", (1, 2, 3)))
    chain = [1, 2, 3]
    assert mirror.tiered_prefix(chain) == {"a": (3, 0)}
    mirror.apply(off("a", (2, 3)))  # the device evicted 2 and 3 to host memory
    assert mirror.longest_prefix(chain) == {"a": 1}
    assert mirror.tiered_prefix(chain) == {"a": (1, 2)}
    assert mirror.host_entries() == 2
    mirror.apply(ev("a", (2,)))  # 2 reloaded: a device block again, out of the host tier
    assert mirror.tiered_prefix(chain) == {"a": (2, 1)}
    assert mirror.host_entries() == 1
    mirror.apply(off("a", offload_removed=(3,)))  # the host tier evicted 3
    assert mirror.tiered_prefix(chain) == {"a": (2, 0)}
    assert mirror.host_entries() == 0
    assert len(mirror) == 2


def test_a_lookup_gives_device_blocks_then_the_host_blocks_right_after_them() -> None:
    mirror = mirror_with(
        ev("a", (1, 2)),
        off("a", (3, 4, 6)),  # 5 is nowhere: the host run stops at it
        ev("b", (1,)),
        off("b", (2,)),
        off("c", (1, 2, 3)),  # no device block at all: reload from the first block on
        ev("d", (1, 2, 3, 4, 5, 6)),  # all on device
        off("e", (2, 3)),  # host blocks, but not leading ones
        ev("f", (1,)),
        off("f", (3,)),  # a host block that does not follow the device run
    )
    chain = [1, 2, 3, 4, 5, 6]
    assert mirror.tiered_prefix(chain) == {
        "a": (2, 2),
        "b": (1, 1),
        "c": (0, 3),
        "d": (6, 0),
        "f": (1, 0),
    }
    assert mirror.longest_prefix(chain) == {"a": 2, "b": 1, "d": 6, "f": 1}
    assert mirror.host_prefix(chain, mirror.longest_prefix(chain)) == {"a": 2, "b": 1, "c": 3}
    assert mirror.host_prefix([], {}) == {}


def test_a_chain_held_whole_on_device_starts_no_host_run_past_its_end() -> None:
    """300 blocks (past the small integers CPython shares, so a depth and the chain's
    length are equal without being one object): "d" holds every block on device, so its
    host run would start past the chain's end; "h" has its first 10 in host memory."""
    chain = list(range(1000, 1300))
    mirror = mirror_with(ev("d", tuple(chain)), off("h", tuple(chain[:10])))
    assert mirror.tiered_prefix(chain) == {"d": (300, 0), "h": (0, 10)}


def test_a_host_run_starts_deep_in_a_long_chain_while_another_is_open() -> None:
    """All 300 blocks are in "h"'s host memory, so its run is open when the walk reaches
    block 260, where "b"'s device run ends and its host run of 20 blocks starts."""
    chain = list(range(1000, 1300))
    mirror = mirror_with(
        off("h", tuple(chain)), ev("b", tuple(chain[:260])), off("b", tuple(chain[260:280]))
    )
    assert mirror.tiered_prefix(chain) == {"h": (0, 300), "b": (260, 20)}


def test_without_offloading_the_host_lookup_is_empty() -> None:
    mirror = mirror_with(ev("a", (1, 2)))
    assert mirror.host_prefix([1, 2, 3], {"a": 2}) == {}
    assert mirror.host_entries() == 0


def test_host_tier_entries_expire_and_are_pruned_like_device_ones() -> None:
    clock = FakeClock()
    mirror = mirror_with(ev("a", (1,)), clock=clock)
    clock.advance(5)
    mirror.apply(off("a", (2, 3)))
    clock.advance(6)  # the device block is 11 s old, the host blocks 6 s
    assert mirror.tiered_prefix([1, 2, 3]) == {}, "the host run starts after the device's"
    assert mirror.host_prefix([2, 3], {}) == {"a": 2}
    clock.advance(5)
    assert mirror.host_prefix([2, 3], {}) == {}
    assert mirror.prune() == 3
    assert len(mirror) == 0


def test_epochs_clears_and_drops_reach_the_host_tier() -> None:
    mirror = mirror_with(ev("a", (1,)), off("a", (2,)), off("b", (1,)))
    mirror.apply(ev("a", (7,), epoch=2))  # a restart: both tiers of "a" are gone
    assert mirror.tiered_prefix([1, 2]) == {"b": (0, 1)}
    mirror.apply(ev("b", cleared=True))
    assert mirror.tiered_prefix([1, 2]) == {}
    mirror.apply(off("c", (1, 2)))
    assert mirror.replicas() == {"a", "c"}, "a replica with only host blocks is known"
    assert mirror.drop_replica("c") == 2
    assert mirror.host_entries() == 0


def test_snapshots_carry_the_host_tier() -> None:
    clock = FakeClock()
    mirror = mirror_with(off("gone", (1,)), clock=clock)
    mirror.load_snapshot(
        {
            "a": ReplicaSnapshot(1, [(1, 0.0)], offloaded=[(2, 1.0), (3, TTL_S + 1)]),
            "h": ReplicaSnapshot(1, [], offloaded=[(1, 0.0)]),
        }
    )
    assert mirror.replicas() == {"a", "h"}
    assert mirror.tiered_prefix([1, 2, 3]) == {"a": (1, 1), "h": (0, 1)}


_small_hashes = st.lists(st.integers(0, 7), max_size=5).map(tuple)
_tier_events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        _small_hashes,
        _small_hashes,
        _small_hashes,
        _small_hashes,
        st.booleans(),
    ),
    max_size=30,
)


@given(_tier_events, st.lists(st.integers(0, 7), max_size=8))
def test_tiered_lookups_match_a_naive_model_of_the_two_tiers(
    events: list[
        tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], bool]
    ],
    chain: list[int],
) -> None:
    mirror = HintMirror(TTL_S, FakeClock())
    device: dict[str, set[int]] = {}
    host: dict[str, set[int]] = {}
    for replica, stored, removed, offloaded, dropped, cleared in events:
        mirror.apply(BlockEvent(replica, 1, stored, removed, cleared, offloaded, dropped))
        on, off_ = device.setdefault(replica, set()), host.setdefault(replica, set())
        if cleared:
            on.clear()
            off_.clear()
        on -= set(removed) | set(offloaded)
        off_ |= set(offloaded)
        off_ -= set(dropped) | set(stored)
        on |= set(stored)
    expected = {}
    for replica in device:
        d = 0
        while d < len(chain) and chain[d] in device[replica]:
            d += 1
        h = 0
        while d + h < len(chain) and chain[d + h] in host[replica]:
            h += 1
        if d or h:
            expected[replica] = (d, h)
    assert mirror.tiered_prefix(chain) == expected


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"replica_id": ""}, "replica_id", id="empty-replica"),
        pytest.param({"epoch": -1}, "epoch", id="negative-epoch"),
        pytest.param({"epoch": True}, "epoch", id="bool-epoch"),
        pytest.param({"stored": (-1,)}, "stored", id="negative-hash"),
        pytest.param({"removed": (2**64,)}, "removed", id="hash-too-large"),
        pytest.param({"stored": [1]}, "stored", id="list-not-tuple"),
    ],
)
def test_invalid_block_events_are_refused(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"replica_id": "a", "epoch": 1, "stored": (), "removed": ()}
    fields.update(kwargs)
    with pytest.raises(InvalidBlockEventError, match=message):
        BlockEvent(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl_s", [0, -1.0, float("nan")])
def test_ttl_must_be_positive(ttl_s: float) -> None:
    with pytest.raises(HintsError, match="ttl_s"):
        HintMirror(ttl_s)


# --- against a reference model -------------------------------------------------------------


@dataclass
class Reference:
    """The obvious, slow implementation of the mirror's semantics."""

    ttl_s: float
    epochs: dict[str, int] = field(default_factory=dict)
    seen: dict[str, dict[int, float]] = field(default_factory=dict)

    def apply(self, event: BlockEvent, now: float) -> None:
        known = self.epochs.get(event.replica_id)
        if known is not None and event.epoch < known:
            return
        blocks = self.seen.setdefault(event.replica_id, {})
        if (known is not None and event.epoch > known) or event.cleared:
            blocks.clear()
        self.epochs[event.replica_id] = event.epoch
        for block in event.removed:
            blocks.pop(block, None)
        for block in event.stored:
            blocks[block] = now

    def longest_prefix(self, chain: list[int], now: float) -> dict[str, int]:
        out = {}
        for replica, blocks in self.seen.items():
            count = 0
            for block in chain:
                if block not in blocks or now - blocks[block] > self.ttl_s:
                    break
                count += 1
            if count:
                out[replica] = count
        return out

    def prune(self, now: float) -> None:
        for blocks in self.seen.values():
            for block in [b for b, t in blocks.items() if now - t > self.ttl_s]:
                del blocks[block]

    def entries(self) -> int:
        return sum(len(blocks) for blocks in self.seen.values())

    def replicas(self) -> set[str]:
        return {replica for replica, blocks in self.seen.items() if blocks}


# A small hash domain makes replicas share blocks and chains hit gaps often.
hashes = st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, MAX_BLOCK_HASH]), max_size=6).map(tuple)
events = st.builds(
    BlockEvent,
    replica_id=st.sampled_from(["a", "b", "c"]),
    epoch=st.integers(0, 3),
    stored=hashes,
    removed=hashes,
    cleared=st.booleans(),
)
operations = st.lists(
    st.one_of(
        events,
        st.tuples(st.just("advance"), st.floats(0, TTL_S * 0.7)),
        st.tuples(st.just("drop"), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("prune"), st.sampled_from([None, 1, 3])),
    ),
    max_size=40,
)
chains = st.lists(
    st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, MAX_BLOCK_HASH]), max_size=7),
    min_size=1,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(ops=operations, probe_chains=chains)
def test_mirror_matches_the_reference_model(
    ops: list[BlockEvent | tuple[str, object]], probe_chains: list[list[int]]
) -> None:
    clock = FakeClock()
    mirror = HintMirror(TTL_S, clock)
    reference = Reference(TTL_S)
    for op in ops:
        if isinstance(op, BlockEvent):
            mirror.apply(op)
            reference.apply(op, clock.now)
        elif op[0] == "advance":
            assert isinstance(op[1], float)
            clock.advance(op[1])
        elif op[0] == "drop":
            assert isinstance(op[1], str)
            mirror.drop_replica(op[1])
            reference.seen.pop(op[1], None)
        else:
            budget = op[1]
            assert budget is None or isinstance(budget, int)
            mirror.prune(budget)
            if budget is None:
                reference.prune(clock.now)
        for chain in probe_chains:
            assert mirror.longest_prefix(chain) == reference.longest_prefix(chain, clock.now)
    mirror.prune()
    reference.prune(clock.now)
    assert len(mirror) == reference.entries()
    assert mirror.replicas() == reference.replicas()
