"""SkyWalker's regional load balancer (published design): selective pushing, the prefix
tree's 0.5 rule, and pushing across regions only when nothing local is free."""

from __future__ import annotations

from firstlight.routing import RequestView
from firstlight_bench.simulator.skywalker import MAX_PEER_QUEUE, PeerStatus, SkyLb


def view(request_id: str, blocks: tuple[int, ...]) -> RequestView:
    return RequestView(request_id, 16 * len(blocks), blocks, 16)


def lb_with(available: set[str], peers: dict[int, PeerStatus] | None = None) -> SkyLb:
    lb = SkyLb(0, 1_000)
    lb.probe({rid: 0 if rid in available else 3 for rid in ("r0", "r1")}, peers or {})
    return lb


def test_only_replicas_with_no_waiting_request_at_the_last_probe_take_requests() -> None:
    lb = lb_with({"r1"})
    assert lb.available == {"r1"}
    assert lb.pick_replica(view("a", (1, 2))) == "r1"
    lb.probe({"r0": 2, "r1": 1}, {})
    assert lb.pick_replica(view("a", (1, 2))) is None


def test_the_prefix_holder_wins_above_half_the_prompt_else_the_least_loaded() -> None:
    lb = lb_with({"r0", "r1"})
    held = view("a", (1, 2, 3, 4))
    lb.enqueue("a", pushed=False)
    lb.dispatched(held, "r1")  # r1 holds 1-4 and has one in flight
    # 3 of 4 blocks matched (> 0.5): the holder, though it is the more loaded.
    assert lb.pick_replica(view("b", (1, 2, 3, 9))) == "r1"
    # 2 of 4 (not > 0.5): the least loaded.
    assert lb.pick_replica(view("c", (1, 2, 8, 9))) == "r0"
    # The holder is not available: the walk ignores it.
    lb.probe({"r0": 0, "r1": 4}, {})
    assert lb.pick_replica(view("b", (1, 2, 3, 9))) == "r0"
    lb.completed("a")
    assert lb.in_flight["r1"] == 0


def test_a_peer_is_eligible_with_a_queue_no_longer_than_ours_and_at_most_ten() -> None:
    peers = {
        1: PeerStatus(queue=0, available_replicas=1),
        2: PeerStatus(queue=0, available_replicas=0),  # nothing free there
    }
    lb = lb_with(set(), peers)
    lb.enqueue("a", pushed=False)
    assert lb.pick_peer(view("a", (1,))) == 1
    # A peer whose queue is longer than ours (1) is not eligible.
    lb.probe({}, {1: PeerStatus(queue=2, available_replicas=1)})
    assert lb.pick_peer(view("a", (1,))) is None
    # Nor one over the threshold, however long our own queue is.
    for i in range(20):
        lb.enqueue(f"x{i}", pushed=False)
    lb.probe({}, {1: PeerStatus(queue=MAX_PEER_QUEUE + 1, available_replicas=1)})
    assert lb.pick_peer(view("a", (1,))) is None
    lb.probe({}, {1: PeerStatus(queue=MAX_PEER_QUEUE, available_replicas=1)})
    assert lb.pick_peer(view("a", (1,))) == 1


def test_a_pushed_request_is_never_pushed_again_and_the_peer_tree_keeps_prefixes() -> None:
    peers = {1: PeerStatus(0, 1), 2: PeerStatus(0, 1)}
    lb = lb_with(set(), peers)
    lb.enqueue("p", pushed=True)
    assert lb.pick_peer(view("p", (1, 2))) is None
    lb.queue.clear()
    lb.enqueue("a", pushed=False)
    lb.forwarded(view("a", (5, 6, 7)), 2)
    assert lb.queue == type(lb.queue)()
    lb.enqueue("b", pushed=False)
    # Same prefix: the peer it went to (though it has one in flight and 1 has none).
    assert lb.pick_peer(view("b", (5, 6, 7))) == 2
    assert lb.pick_peer(view("b", (8, 9))) == 1  # no match: the least loaded peer


def test_an_outage_drains_the_queue_for_the_clients_to_go_elsewhere() -> None:
    lb = lb_with({"r0"})
    lb.enqueue("a", pushed=False)
    lb.enqueue("b", pushed=True)
    assert lb.drain() == ["a", "b"]
    assert not lb.queue
    assert not lb.pushed_in
    assert not lb.available
    assert lb.status() == PeerStatus(0, 0)
