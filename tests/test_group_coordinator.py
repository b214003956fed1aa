"""`kts serve`'s group coordinator (kts_resources/serving/groups.py) as Kafka's classic group
protocol has it: member ids (KIP-394), rebalances with generations, the leader's assignment
relayed, heartbeats during a rebalance, session and rebalance timeouts, stale generations refused.
A clock the test moves stands in for time."""

from __future__ import annotations

import pytest

from kts_resources.serving import groups as g

GROUP = "readers"
SESSION_MS, REBALANCE_MS = 10_000, 30_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms / 1000


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coordinator(clock) -> g.GroupCoordinator:
    return g.GroupCoordinator(clock, initial_rebalance_delay_ms=0)  # the delay has a test of its own


class Answers:
    """Collects a JoinGroup's or SyncGroup's answer, given through its callback."""

    def __init__(self) -> None:
        self.got: list = []

    def __call__(self, result) -> None:
        self.got.append(result)

    @property
    def one(self):
        assert len(self.got) == 1, self.got
        return self.got[0]


def join(coordinator, member_id: str = "", *, client: str = "c", protocols=(("range", b"m"),)) -> Answers:
    answers = Answers()
    coordinator.join(GROUP, member_id, client_id=client, session_timeout_ms=SESSION_MS, rebalance_timeout_ms=REBALANCE_MS,
                     protocol_type="consumer", protocols=list(protocols), require_known_member_id=True, reply=answers)
    return answers


def new_member(coordinator, client: str = "c", **kw) -> tuple[str, Answers]:
    """A member id from MEMBER_ID_REQUIRED, then the JoinGroup with it."""
    first = join(coordinator, client=client, **kw).one
    assert first.error == g.MEMBER_ID_REQUIRED and first.member_id.startswith(f"{client}-")
    return first.member_id, join(coordinator, first.member_id, client=client, **kw)


def sync(coordinator, member_id: str, generation: int, assignments: dict | None = None) -> Answers:
    answers = Answers()
    coordinator.sync(GROUP, generation, member_id, protocol_type="consumer", protocol_name="range",
                     assignments=assignments or {}, reply=answers)
    return answers


def stable_pair(coordinator) -> tuple[str, str, int]:
    """Two members, a completed rebalance and the leader's assignment: (leader, follower, generation)."""
    a, a_join = new_member(coordinator, "a")
    generation = a_join.one.generation_id
    sync(coordinator, a, generation, {a: b"all"})
    b, b_join = new_member(coordinator, "b")
    assert coordinator.heartbeat(GROUP, generation, a) == g.REBALANCE_IN_PROGRESS
    a_rejoin = join(coordinator, a, client="a")
    generation = a_rejoin.one.generation_id
    assert b_join.one.generation_id == generation
    sync(coordinator, a, generation, {a: b"p0,p1", b: b"p2,p3"})
    sync(coordinator, b, generation)
    return a, b, generation


def test_a_first_join_without_a_member_id_gets_member_id_required_and_the_rebalance_waits_for_it(coordinator):
    a, a_join = new_member(coordinator, "a")
    sync(coordinator, a, a_join.one.generation_id, {a: b"all"})
    pending = join(coordinator, client="b").one
    assert pending.error == g.MEMBER_ID_REQUIRED
    # a rejoining the stable group as leader starts a rebalance that b's member id holds open.
    a_again = join(coordinator, a, client="a")
    assert a_again.got == []
    b_join = join(coordinator, pending.member_id, client="b")
    [ra], [rb] = a_again.got, b_join.got
    assert ra.generation_id == rb.generation_id == a_join.one.generation_id + 1


def test_the_leader_gets_every_members_metadata_and_the_others_get_their_part_of_its_assignment(coordinator):
    a, a_join = new_member(coordinator, "a", protocols=(("range", b"a-meta"),))
    first = a_join.one
    assert (first.error, first.leader, first.member_id, first.members) == (g.NONE, a, a, [(a, b"a-meta")])
    assert sync(coordinator, a, first.generation_id, {a: b"everything"}).one.assignment == b"everything"
    b, b_join = new_member(coordinator, "b", protocols=(("range", b"b-meta"),))
    a_rejoin = join(coordinator, a, client="a", protocols=(("range", b"a-meta"),))
    leader, follower = a_rejoin.one, b_join.one
    assert leader.leader == follower.leader == a
    assert leader.members == [(a, b"a-meta"), (b, b"b-meta")] and follower.members == []
    waiting = sync(coordinator, b, follower.generation_id)
    assert waiting.got == []  # until the leader's SyncGroup
    assert sync(coordinator, a, leader.generation_id, {a: b"half-a", b: b"half-b"}).one.assignment == b"half-a"
    assert (waiting.one.error, waiting.one.assignment, waiting.one.protocol_name) == (g.NONE, b"half-b", "range")
    assert coordinator.groups[GROUP].state == g.GroupState.STABLE


def test_heartbeats_answer_rebalance_in_progress_while_the_group_rebalances_and_none_once_stable(coordinator):
    a, b, generation = stable_pair(coordinator)
    assert coordinator.heartbeat(GROUP, generation, a) == g.NONE
    new_member(coordinator, "c")
    assert coordinator.heartbeat(GROUP, generation, a) == g.REBALANCE_IN_PROGRESS
    assert coordinator.heartbeat(GROUP, generation, b) == g.REBALANCE_IN_PROGRESS


def test_leave_group_starts_a_rebalance_that_the_remaining_member_completes_alone(coordinator):
    a, b, generation = stable_pair(coordinator)
    assert coordinator.leave(GROUP, [a]) == (g.NONE, [g.NONE])
    assert coordinator.heartbeat(GROUP, generation, b) == g.REBALANCE_IN_PROGRESS
    rejoined = join(coordinator, b, client="b").one
    assert (rejoined.generation_id, rejoined.leader, [m for m, _ in rejoined.members]) == (generation + 1, b, [b])
    assert coordinator.leave(GROUP, [a]) == (g.NONE, [g.UNKNOWN_MEMBER_ID])


def test_a_member_whose_heartbeats_stop_is_expired_after_its_session_timeout_and_the_group_rebalances(coordinator, clock):
    a, b, generation = stable_pair(coordinator)
    clock.advance(SESSION_MS - 1000)
    assert coordinator.heartbeat(GROUP, generation, a) == g.NONE  # a lives on; b says nothing
    clock.advance(1500)
    coordinator.expire()
    group = coordinator.groups[GROUP]
    assert list(group.members) == [a] and group.state == g.GroupState.PREPARING_REBALANCE
    assert coordinator.heartbeat(GROUP, generation, b) == g.UNKNOWN_MEMBER_ID
    assert join(coordinator, a, client="a").one.generation_id == generation + 1


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed_and_the_others_go_on(coordinator, clock):
    a, b, generation = stable_pair(coordinator)
    new_member(coordinator, "c")
    a_rejoin = join(coordinator, a, client="a")
    for _ in range(REBALANCE_MS // 5000):  # b keeps heartbeating but never rejoins
        clock.advance(5000)
        coordinator.heartbeat(GROUP, generation, b)
        coordinator.expire()
    assert a_rejoin.one.generation_id == generation + 1
    assert b not in coordinator.groups[GROUP].members
    assert [m for m, _ in a_rejoin.one.members if m == b] == []


def test_a_member_id_given_out_but_never_used_lapses_after_the_session_timeout(coordinator, clock):
    a, a_join = new_member(coordinator, "a")
    sync(coordinator, a, a_join.one.generation_id, {a: b"x"})
    assert join(coordinator, client="ghost").one.error == g.MEMBER_ID_REQUIRED
    a_rejoin = join(coordinator, a, client="a")
    assert a_rejoin.got == []  # waits for the ghost's JoinGroup
    clock.advance(SESSION_MS + 1)
    coordinator.expire()
    assert a_rejoin.one.error == g.NONE and a_rejoin.one.generation_id == a_join.one.generation_id + 1


def test_stale_generations_are_refused_for_heartbeat_sync_and_offset_commit(coordinator):
    a, b, generation = stable_pair(coordinator)
    assert coordinator.heartbeat(GROUP, generation - 1, a) == g.ILLEGAL_GENERATION
    assert sync(coordinator, a, generation - 1).one.error == g.ILLEGAL_GENERATION
    assert coordinator.check_commit(GROUP, generation - 1, a) == g.ILLEGAL_GENERATION
    assert coordinator.check_commit(GROUP, generation, "stranger") == g.UNKNOWN_MEMBER_ID
    assert coordinator.check_commit(GROUP, generation, a) == g.NONE
    # A group this coordinator never saw (it restarted): the member must rejoin.
    assert coordinator.check_commit("elsewhere", 7, a) == g.ILLEGAL_GENERATION
    assert coordinator.heartbeat("elsewhere", 7, a) == g.UNKNOWN_MEMBER_ID
    assert join(coordinator, a, client="a").got == [] and coordinator.check_commit(GROUP, generation, a) == g.NONE


def test_commits_during_a_rebalance_are_taken_before_the_join_completes_and_refused_while_it_is_completed(coordinator):
    a, b, generation = stable_pair(coordinator)
    join(coordinator, a, client="a")  # the leader rejoins: PreparingRebalance, b not yet back
    assert coordinator.check_commit(GROUP, generation, b) == g.NONE  # b commits what it read before rejoining
    join(coordinator, b, client="b")  # CompletingRebalance: the new assignment is not out yet
    assert coordinator.check_commit(GROUP, generation + 1, b) == g.REBALANCE_IN_PROGRESS


def test_simple_commits_are_taken_only_while_the_group_has_no_member(coordinator):
    assert coordinator.check_commit("standalone", -1, "") == g.NONE
    a, b, generation = stable_pair(coordinator)
    assert coordinator.check_commit(GROUP, -1, "") == g.UNKNOWN_MEMBER_ID
    coordinator.leave(GROUP, [a, b])
    assert coordinator.groups[GROUP].state == g.GroupState.EMPTY
    assert coordinator.check_commit(GROUP, -1, "") == g.NONE


def test_protocols_the_members_do_not_share_and_bad_session_timeouts_are_refused(coordinator):
    new_member(coordinator, "a", protocols=(("range", b""),))
    assert join(coordinator, client="b", protocols=(("sticky", b""),)).one.error == g.INCONSISTENT_GROUP_PROTOCOL
    refused = g.JoinResult
    answers = Answers()
    coordinator.join(GROUP, "", client_id="c", session_timeout_ms=10, rebalance_timeout_ms=10, protocol_type="consumer",
                     protocols=[("range", b"")], require_known_member_id=True, reply=answers)
    assert isinstance(answers.one, refused) and answers.one.error == g.INVALID_SESSION_TIMEOUT


def test_the_protocol_chosen_is_the_one_every_member_supports_that_most_prefer(coordinator):
    a, a_join = new_member(coordinator, "a", protocols=(("roundrobin", b""), ("range", b"")))
    sync(coordinator, a, a_join.one.generation_id, {})
    b, b_join = new_member(coordinator, "b", protocols=(("range", b""), ("sticky", b"")))
    c, c_join = new_member(coordinator, "c", protocols=(("range", b""), ("roundrobin", b"")))
    a_rejoin = join(coordinator, a, client="a", protocols=(("roundrobin", b""), ("range", b"")))
    assert a_rejoin.one.protocol_name == b_join.one.protocol_name == c_join.one.protocol_name == "range"


def test_an_empty_groups_first_rebalance_waits_the_initial_delay_again_for_each_member_that_joins_meanwhile(clock):
    coordinator = g.GroupCoordinator(clock, initial_rebalance_delay_ms=3000)
    a, a_join = new_member(coordinator, "a")
    clock.advance(2000)
    coordinator.expire()
    b, b_join = new_member(coordinator, "b")
    clock.advance(2000)  # 4 s after a, 2 s after b: still waiting
    coordinator.expire()
    assert a_join.got == b_join.got == []
    clock.advance(1001)
    coordinator.expire()
    assert a_join.one.generation_id == b_join.one.generation_id == 1
    assert [m for m, _ in a_join.one.members] == [a, b]
