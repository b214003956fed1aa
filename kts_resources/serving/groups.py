"""The group coordinator of `kts serve`: Kafka's classic consumer-group protocol (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, and the generation checks of OffsetCommit), as one node that
coordinates every group. Membership lives here, in memory; committed offsets live in the metadata
store (kts_resources/metadata/group_offsets.py), so a restarted `kts serve` loses only the
membership, and clients rejoin (their heartbeat gets UNKNOWN_MEMBER_ID) and resume from the offsets.

The rules are Kafka's GroupCoordinator's (classic groups):
- A group is Empty, PreparingRebalance, CompletingRebalance or Stable. A new member, a member whose
  protocols changed, a JoinGroup from the leader, a member leaving or expiring starts a rebalance.
- JoinGroup ≥ v4 without a member id gets MEMBER_ID_REQUIRED and a member id (KIP-394); the member
  joins with it, and until it does (or its session timeout passes) the rebalance waits for it.
- A rebalance completes when every member has rejoined, or when the largest rebalance timeout
  passes (members that did not rejoin are removed): the generation goes up, the protocol every
  member supports with the most first-choice votes is chosen, the leader (kept if still a member)
  gets every member's metadata, and every member its JoinGroup answer.
- The leader's SyncGroup carries the assignment; every member's SyncGroup of that generation gets
  its own part. A member that does not send SyncGroup within the rebalance timeout is removed.
- Heartbeats keep a member alive for its session timeout (as do its JoinGroup and SyncGroup);
  during a rebalance they answer REBALANCE_IN_PROGRESS, so members rejoin.
- OffsetCommit of a member: its generation must be the group's (ILLEGAL_GENERATION), the group not
  completing a rebalance (REBALANCE_IN_PROGRESS); a simple commit (no member, generation −1) is
  taken only for a group without members.
- An empty group's first rebalance waits group.initial.rebalance.delay.ms for more members.
Not served: static membership (a group.instance.id is taken as a dynamic member).

The coordinator is a state machine with an injected clock: the server calls it from its event loop
and calls :meth:`GroupCoordinator.expire` periodically; JoinGroup and SyncGroup answer through a
callback, since their answers wait for other members.
"""

from __future__ import annotations

import enum
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

# Kafka's error codes (org.apache.kafka.common.protocol.Errors) of the group APIs.
NONE = 0
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_NOT_AVAILABLE = 15
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79

# The broker's defaults: group.min.session.timeout.ms, group.max.session.timeout.ms.
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 1_800_000
# group.initial.rebalance.delay.ms: an empty group's first rebalance waits this long (again for each
# member that joins meanwhile, up to the rebalance timeout), so members started together share the
# first generation rather than each forcing a rebalance of its own.
INITIAL_REBALANCE_DELAY_MS = 3_000


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass
class JoinResult:
    error: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, bytes]] = field(default_factory=list)  # the leader's only: (member id, metadata)


@dataclass
class SyncResult:
    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


JoinReply = Callable[[JoinResult], None]
SyncReply = Callable[[SyncResult], None]


@dataclass
class Member:
    member_id: str
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]  # (name, metadata), in the member's order of preference
    expires_at: float = 0.0
    join_reply: JoinReply | None = None  # awaiting the rebalance's end
    sync_reply: SyncReply | None = None  # awaiting the leader's assignment
    awaiting_sync: bool = False  # joined this generation, no SyncGroup yet
    assignment: bytes = b""

    def metadata(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in joining order
    pending: dict[str, float] = field(default_factory=dict)  # KIP-394: member id given out → when it lapses
    rebalance_deadline: float | None = None
    initial_join_until: float | None = None  # an empty group's first rebalance: the delay's limit
    sync_deadline: float | None = None

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        names = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*names) if names else set()

    def accepts(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        return protocol_type == self.protocol_type and bool({name for name, _ in protocols} & self.candidate_protocols())

    def select_protocol(self) -> str:
        """The protocol every member supports that most members list first among those (ties: the
        first member's preference), as Kafka's vote."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next(name for name, _ in member.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        first = next(iter(self.members.values()))
        order = [name for name, _ in first.protocols if name in candidates]
        return max(order, key=lambda name: (votes.get(name, 0), -order.index(name)))


class GroupCoordinator:
    """Every group's membership, generations and assignments (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, min_session_timeout_ms: int = MIN_SESSION_TIMEOUT_MS,
                 max_session_timeout_ms: int = MAX_SESSION_TIMEOUT_MS,
                 initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS) -> None:
        self.clock = clock
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.min_session_timeout_ms, self.max_session_timeout_ms = min_session_timeout_ms, max_session_timeout_ms
        self.groups: dict[str, Group] = {}

    # --- JoinGroup ---

    def join(self, group_id: str, member_id: str, *, client_id: str, session_timeout_ms: int, rebalance_timeout_ms: int,
             protocol_type: str, protocols: list[tuple[str, bytes]], require_known_member_id: bool, reply: JoinReply) -> None:
        """JoinGroup: ``reply`` is called once, at once for an error or a member id to rejoin with,
        otherwise when the rebalance completes."""
        if not group_id:
            return reply(JoinResult(INVALID_GROUP_ID, member_id=member_id))
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return reply(JoinResult(INVALID_SESSION_TIMEOUT, member_id=member_id))
        group = self.groups.get(group_id)
        if group is None:
            if member_id:  # a member of a group this coordinator does not know (restarted): join anew
                return reply(JoinResult(UNKNOWN_MEMBER_ID, member_id=member_id))
            group = self.groups[group_id] = Group(group_id)
        if not group.accepts(protocol_type, protocols):
            return reply(JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id=member_id))
        now = self.clock()
        if not member_id or member_id in group.pending:
            if not member_id:
                member_id = f"{client_id}-{uuid.uuid4()}"
                if require_known_member_id:
                    group.pending[member_id] = now + session_timeout_ms / 1000
                    return reply(JoinResult(MEMBER_ID_REQUIRED, member_id=member_id))
            group.pending.pop(member_id, None)
            member = Member(member_id, client_id, session_timeout_ms, rebalance_timeout_ms, protocols, join_reply=reply)
            self._touch(member, now)
            if not group.members:
                group.protocol_type = protocol_type
            group.members[member_id] = member
            if group.leader is None:
                group.leader = member_id
            self._prepare_rebalance(group)
            self._try_complete_join(group)
            return
        member = group.members.get(member_id)
        if member is None:
            return reply(JoinResult(UNKNOWN_MEMBER_ID, member_id=member_id))
        self._touch(member, now)
        changed = member.protocols != protocols
        member.session_timeout_ms, member.rebalance_timeout_ms, member.protocols = session_timeout_ms, rebalance_timeout_ms, protocols
        if group.state == GroupState.PREPARING_REBALANCE:
            member.join_reply = reply
            self._try_complete_join(group)
        elif not changed and (group.state == GroupState.COMPLETING_REBALANCE
                              or (group.state == GroupState.STABLE and member_id != group.leader)):
            # A member that lost its JoinGroup answer: the current generation's, again.
            reply(self._join_result(group, member))
        else:  # the leader rejoining a stable group, or a member's protocols changed
            member.join_reply = reply
            self._prepare_rebalance(group)
            self._try_complete_join(group)

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members = ([(m.member_id, m.metadata(group.protocol_name)) for m in group.members.values()]
                   if member.member_id == group.leader else [])
        return JoinResult(NONE, group.generation_id, group.protocol_type, group.protocol_name, group.leader or "",
                          member.member_id, members)

    def _prepare_rebalance(self, group: Group) -> None:
        now = self.clock()
        if group.state == GroupState.PREPARING_REBALANCE:
            if group.initial_join_until is not None:  # another member within the initial delay: wait again
                group.rebalance_deadline = min(now + self.initial_rebalance_delay_ms / 1000, group.initial_join_until)
            return
        if group.state == GroupState.COMPLETING_REBALANCE:  # the assignment being made is void
            for member in group.members.values():
                self._answer_sync(member, SyncResult(REBALANCE_IN_PROGRESS))
        timeout_ms = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        if group.state == GroupState.EMPTY and self.initial_rebalance_delay_ms > 0:
            group.initial_join_until = now + timeout_ms / 1000
            group.rebalance_deadline = min(now + self.initial_rebalance_delay_ms / 1000, group.initial_join_until)
        else:
            group.rebalance_deadline = now + timeout_ms / 1000
        group.state = GroupState.PREPARING_REBALANCE
        group.sync_deadline = None

    def _try_complete_join(self, group: Group) -> None:
        if (group.state == GroupState.PREPARING_REBALANCE and group.initial_join_until is None and not group.pending
                and all(m.join_reply is not None for m in group.members.values())):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        for member in [m for m in group.members.values() if m.join_reply is None]:
            self._remove(group, member.member_id)  # did not rejoin within the rebalance timeout
        group.generation_id += 1
        group.rebalance_deadline = group.initial_join_until = None
        if not group.members:
            group.state, group.protocol_type, group.protocol_name, group.leader = GroupState.EMPTY, None, None, None
            return
        group.protocol_name = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        now = self.clock()
        group.sync_deadline = now + max(m.rebalance_timeout_ms for m in group.members.values()) / 1000
        for member in group.members.values():
            reply, member.join_reply = member.join_reply, None
            member.awaiting_sync, member.assignment = True, b""
            self._touch(member, now)
            reply(self._join_result(group, member))

    # --- SyncGroup ---

    def sync(self, group_id: str, generation_id: int, member_id: str, *, protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes], reply: SyncReply) -> None:
        """SyncGroup: ``reply`` is called once, when the member's assignment is known (or at once for an error)."""
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            return reply(SyncResult(UNKNOWN_MEMBER_ID))
        if generation_id != group.generation_id:
            return reply(SyncResult(ILLEGAL_GENERATION))
        if (protocol_type is not None and protocol_type != group.protocol_type) or \
                (protocol_name is not None and protocol_name != group.protocol_name):
            return reply(SyncResult(INCONSISTENT_GROUP_PROTOCOL))
        if group.state == GroupState.PREPARING_REBALANCE:
            return reply(SyncResult(REBALANCE_IN_PROGRESS))
        self._touch(member, self.clock())
        member.awaiting_sync = False
        if not any(m.awaiting_sync for m in group.members.values()):
            group.sync_deadline = None
        if group.state == GroupState.STABLE:
            return reply(SyncResult(NONE, group.protocol_type, group.protocol_name, member.assignment))
        member.sync_reply = reply  # CompletingRebalance: until the leader's assignment
        if member_id == group.leader:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.state = GroupState.STABLE
            for m in group.members.values():
                self._answer_sync(m, SyncResult(NONE, group.protocol_type, group.protocol_name, m.assignment))

    @staticmethod
    def _answer_sync(member: Member, result: SyncResult) -> None:
        reply, member.sync_reply = member.sync_reply, None
        if reply is not None:
            reply(result)

    # --- Heartbeat, LeaveGroup ---

    def heartbeat(self, group_id: str, generation_id: int, member_id: str) -> int:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            return UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ILLEGAL_GENERATION
        self._touch(member, self.clock())
        return REBALANCE_IN_PROGRESS if group.state == GroupState.PREPARING_REBALANCE else NONE

    def leave(self, group_id: str, member_ids: list[str]) -> tuple[int, list[int]]:
        """LeaveGroup: the group's error and each member's."""
        group = self.groups.get(group_id)
        if group is None:
            return UNKNOWN_MEMBER_ID, [UNKNOWN_MEMBER_ID] * len(member_ids)
        errors = []
        for member_id in member_ids:
            if group.pending.pop(member_id, None) is not None:
                errors.append(NONE)
            elif member_id in group.members:
                self._remove(group, member_id)
                errors.append(NONE)
            else:
                errors.append(UNKNOWN_MEMBER_ID)
        self._after_departures(group)
        return NONE, errors

    def _remove(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        if member.join_reply is not None:
            reply, member.join_reply = member.join_reply, None
            reply(JoinResult(UNKNOWN_MEMBER_ID, member_id=member_id))
        self._answer_sync(member, SyncResult(UNKNOWN_MEMBER_ID))
        if group.leader == member_id:
            group.leader = next(iter(group.members), None)

    def _after_departures(self, group: Group) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        self._try_complete_join(group)

    # --- OffsetCommit's generation check ---

    def check_commit(self, group_id: str, generation_id: int, member_id: str) -> int:
        """Whether an OffsetCommit may be stored: NONE, or the error every partition of it gets."""
        group = self.groups.get(group_id)
        if generation_id < 0 and (group is None or group.state == GroupState.EMPTY):
            return NONE  # a simple commit (an admin, or a consumer that assigns itself): no member consumes
        if generation_id < 0 and not member_id:
            return UNKNOWN_MEMBER_ID  # a simple commit while members consume: refused
        if group is None:
            return ILLEGAL_GENERATION  # a generation this coordinator never gave (it restarted): rejoin
        member = group.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ILLEGAL_GENERATION
        if group.state == GroupState.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        self._touch(member, self.clock())
        return NONE

    # --- time ---

    def expire(self) -> None:
        """Remove the members whose session timed out, the member ids (KIP-394) never used in time,
        the members that did not rejoin or sync within the rebalance timeout; complete rebalances
        whose timeout passed."""
        now = self.clock()
        for group in list(self.groups.values()):
            lapsed = [member_id for member_id, deadline in group.pending.items() if deadline <= now]
            for member_id in lapsed:
                del group.pending[member_id]
            dead = [m.member_id for m in group.members.values()
                    if m.expires_at <= now and m.join_reply is None and m.sync_reply is None]
            if group.sync_deadline is not None and group.sync_deadline <= now:
                dead += [m.member_id for m in group.members.values() if m.awaiting_sync and m.member_id not in dead]
                group.sync_deadline = None
            for member_id in dead:
                self._remove(group, member_id)
            if dead or lapsed:
                self._after_departures(group)
            if (group.state == GroupState.PREPARING_REBALANCE and group.rebalance_deadline is not None
                    and group.rebalance_deadline <= now):
                self._complete_join(group)  # a member id still pending joins later, as a new member

    @staticmethod
    def _touch(member: Member, now: float) -> None:
        member.expires_at = now + member.session_timeout_ms / 1000
