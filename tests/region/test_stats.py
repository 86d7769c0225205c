"""ReplicaStats: what a replica reports, across Ray's dict and into the cost model's view."""

from __future__ import annotations

import json

from firstlight.engine.protocol import EngineStats
from firstlight.region import ReplicaStats
from firstlight.routing import ReplicaView

ENGINE = EngineStats(
    running=3,
    waiting=2,
    kv_cache_usage=0.8,
    prefix_cache_queries=1000,
    prefix_cache_hits=600,
    pending_prefill_tokens=512,
    prefill_tokens_per_s=860.0,
    inter_token_latency_ms=41.0,
    simulated=True,
    spec_draft_tokens=7,
    spec_accepted_tokens=5,
    step_ms=37.0,
)


def test_an_engine_snapshot_crosses_the_wire_unchanged() -> None:
    stats = ReplicaStats.of_engine(ENGINE, at=12.5, inflight=4, accepting=False, epoch=99)
    wire = json.loads(json.dumps(stats.to_wire()))  # plain data, as Ray carries it
    assert ReplicaStats.from_wire(wire) == stats
    assert (stats.running, stats.waiting, stats.step_ms, stats.epoch) == (3, 2, 37.0, 99)


def test_unknown_keys_are_ignored_and_missing_ones_default() -> None:
    stats = ReplicaStats.from_wire({"running": 2, "added_by_a_newer_replica": [1, 2]})
    assert stats == ReplicaStats(running=2)


def test_the_view_carries_what_the_cost_model_reads() -> None:
    stats = ReplicaStats.of_engine(ENGINE, at=12.5)
    assert stats.view("r1", "east", None) == ReplicaView(
        replica_id="r1",
        region="east",
        queue_len=5,
        running=3,
        waiting=2,
        pending_prefill_tokens=512,
        kv_cache_usage=0.8,
        prefill_tokens_per_s=860.0,
        step_ms=37.0,
        stats_at=12.5,
    )
    assert stats.view("r1", "east", 9).queue_len == 9  # Ray's fresher count wins


def test_rates_not_measured_yet_leave_the_view_to_the_policy_default() -> None:
    view = ReplicaStats(prefill_tokens_per_s=0.0, step_ms=None).view("r", "east", 0)
    assert (view.prefill_tokens_per_s, view.step_ms) == (None, None)


def test_a_replica_that_does_not_say_it_is_simulated_is_taken_as_real() -> None:
    """A replica of a version that predates the flag reports no ``simulated``: its
    numbers are measured ones (only the ``sim`` engine says otherwise)."""
    older = ReplicaStats.from_wire({"running": 2, "waiting": 1})
    assert older.simulated is False
    assert ReplicaStats.of_engine(ENGINE, at=1.0).simulated is True


def test_a_snapshot_built_without_an_epoch_has_the_records_own_default() -> None:
    """The simulator builds its replicas' snapshots without the serving options; they
    read as a replica of another version whose wire dict leaves them out (epoch 0: no
    replica start time known)."""
    stats = ReplicaStats.of_engine(ENGINE, at=12.5)
    serving = {"inflight", "accepting", "epoch", "data_address", "port_streams"}
    engine_only = {k: v for k, v in stats.to_wire().items() if k not in serving}
    assert ReplicaStats.from_wire(engine_only) == stats
    assert (stats.epoch, stats.inflight, stats.accepting) == (0, 0, True)
