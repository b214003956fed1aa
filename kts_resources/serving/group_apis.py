"""What `kts serve` answers to the consumer-group APIs: FindCoordinator (itself, node 0, for every
group), JoinGroup, SyncGroup, Heartbeat, LeaveGroup (the coordinator in groups.py), OffsetCommit and
OffsetFetch (the metadata store, group_offsets.py), DescribeGroups and ListGroups. Messages are
kafka-python's classes, as for every other API (protocol.py).

The coordinator is touched only from the event loop; the store's reads and writes run in the
server's thread pool. A JoinGroup or SyncGroup waiting for other members ends at a drain (SIGTERM)
with COORDINATOR_NOT_AVAILABLE, so the client looks for a coordinator again rather than hang.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from kafka.protocol.admin import DescribeGroupsResponse, ListGroupsResponse
from kafka.protocol.consumer import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorResponse

from kts_resources.metadata.group_offsets import CommittedOffset, GroupOffsets
from kts_resources.serving import groups as g
from kts_resources.serving.offsets_mirror import OffsetsMirror

log = logging.getLogger(__name__)

NODE_ID = 0
FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP = 10, 11, 14, 12, 13
OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, LIST_GROUPS = 8, 9, 15, 16
GROUP_API_KEYS = frozenset({FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH,
                            DESCRIBE_GROUPS, LIST_GROUPS})
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53  # FindCoordinator of a transaction: kts serve takes no writes
INVALID_REQUEST = 42
OFFSET_METADATA_MAX_BYTES = 4096  # the broker's offset.metadata.max.bytes
EXPIRY_INTERVAL_S = 0.25  # how often session and rebalance timeouts are looked at


class GroupSide:
    """The group APIs' handlers over one coordinator and the store's committed offsets (None: no
    store, so commits answer COORDINATOR_NOT_AVAILABLE), which ``mirror`` copies to the remote tier."""

    def __init__(self, offsets: GroupOffsets | None, pool: Executor, *, advertised: tuple[str, int],
                 draining: asyncio.Event, coordinator: g.GroupCoordinator | None = None,
                 mirror: OffsetsMirror | None = None) -> None:
        self.offsets, self.pool, self.draining, self.mirror = offsets, pool, draining, mirror
        self.host, self.port = advertised
        self.coordinator = coordinator or g.GroupCoordinator()
        self._expiry: asyncio.Task | None = None

    async def answer(self, request):
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().create_task(self._expire_until_drained())
        handler = {FIND_COORDINATOR: self.find_coordinator, JOIN_GROUP: self.join_group, SYNC_GROUP: self.sync_group,
                   HEARTBEAT: self.heartbeat, LEAVE_GROUP: self.leave_group, OFFSET_COMMIT: self.offset_commit,
                   OFFSET_FETCH: self.offset_fetch, DESCRIBE_GROUPS: self.describe_groups,
                   LIST_GROUPS: self.list_groups}[request.API_KEY]
        return await handler(request)

    def close(self, timeout_s: float) -> None:
        """At shutdown: the commits answered so far written to the tier, waiting up to ``timeout_s``."""
        if self.mirror is not None and not self.mirror.flush(timeout_s):
            log.warning("the last consumer group commits were not all written to the remote tier within %.0f s: "
                        "the store has them", timeout_s)

    async def _expire_until_drained(self) -> None:
        while not self.draining.is_set():
            self.coordinator.expire()
            try:
                await asyncio.wait_for(self.draining.wait(), timeout=EXPIRY_INTERVAL_S)
            except asyncio.TimeoutError:
                pass

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _awaited(self, start, drained):
        """The answer ``start(reply)`` gives through its callback, or ``drained`` at a drain."""
        future = asyncio.get_running_loop().create_future()

        def reply(result) -> None:
            if not future.done():  # its connection may be gone (the task cancelled)
                future.set_result(result)

        start(reply)
        if future.done():
            return future.result()
        drain = asyncio.ensure_future(self.draining.wait())
        try:
            await asyncio.wait([future, drain], return_when=asyncio.FIRST_COMPLETED)
        finally:
            drain.cancel()
        return future.result() if future.done() else drained

    # --- FindCoordinator ---

    async def find_coordinator(self, request):
        R = FindCoordinatorResponse
        version = request.API_VERSION

        def answer(key_type: int) -> tuple[int, str | None]:
            if key_type == 0:
                return g.NONE, None
            if key_type == 1:
                return TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "kts serve is read-only: it coordinates no transaction"
            return INVALID_REQUEST, f"kts serve coordinates consumer groups only (key type {key_type})"

        key_type = getattr(request, "key_type", 0) if version >= 1 else 0
        error, message = answer(key_type)
        node, host, port = (NODE_ID, self.host, self.port) if error == g.NONE else (-1, "", -1)
        if version < 4:
            return R(version=version, throttle_time_ms=0, error_code=error, error_message=message, node_id=node,
                     host=host, port=port)
        return R(version=version, throttle_time_ms=0, coordinators=[
            R.Coordinator(key=key, node_id=node, host=host, port=port, error_code=error, error_message=message)
            for key in request.coordinator_keys])

    # --- membership ---

    async def join_group(self, request):
        version = request.API_VERSION
        protocols = [(p.name, bytes(p.metadata)) for p in request.protocols]
        rebalance_timeout_ms = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        result = await self._awaited(lambda reply: self.coordinator.join(
            request.group_id, request.member_id, client_id=request.header.client_id or "",
            session_timeout_ms=request.session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
            protocol_type=request.protocol_type, protocols=protocols, require_known_member_id=version >= 4, reply=reply),
            g.JoinResult(g.COORDINATOR_NOT_AVAILABLE, member_id=request.member_id))
        R = JoinGroupResponse
        # Before v7 the protocol name is no nullable string.
        name = result.protocol_name if result.protocol_name is not None or version >= 7 else ""
        return R(version=version, throttle_time_ms=0, error_code=result.error, generation_id=result.generation_id,
                 protocol_type=result.protocol_type, protocol_name=name, leader=result.leader, skip_assignment=False,
                 member_id=result.member_id, members=[R.JoinGroupResponseMember(member_id=member_id, group_instance_id=None,
                                                                                metadata=metadata)
                                                      for member_id, metadata in result.members])

    async def sync_group(self, request):
        version = request.API_VERSION
        assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
        result = await self._awaited(lambda reply: self.coordinator.sync(
            request.group_id, request.generation_id, request.member_id,
            protocol_type=request.protocol_type if version >= 5 else None,
            protocol_name=request.protocol_name if version >= 5 else None, assignments=assignments, reply=reply),
            g.SyncResult(g.COORDINATOR_NOT_AVAILABLE))
        return SyncGroupResponse(version=version, throttle_time_ms=0, error_code=result.error,
                                 protocol_type=result.protocol_type, protocol_name=result.protocol_name,
                                 assignment=result.assignment)

    async def heartbeat(self, request):
        error = self.coordinator.heartbeat(request.group_id, request.generation_id, request.member_id)
        return HeartbeatResponse(version=request.API_VERSION, throttle_time_ms=0, error_code=error)

    async def leave_group(self, request):
        version = request.API_VERSION
        leaving = [request.member_id] if version < 3 else [m.member_id for m in request.members]
        error, errors = self.coordinator.leave(request.group_id, leaving)
        R = LeaveGroupResponse
        if version < 3:
            return R(version=version, throttle_time_ms=0, error_code=errors[0])
        return R(version=version, throttle_time_ms=0, error_code=error, members=[
            R.MemberResponse(member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=e)
            for m, e in zip(request.members, errors)])

    async def describe_groups(self, request):
        R = DescribeGroupsResponse
        described = []
        for group_id in request.groups:
            group = self.coordinator.groups.get(group_id)
            if group is None:
                described.append(R.DescribedGroup(error_code=g.NONE, error_message=None, group_id=group_id, group_state="Dead",
                                                  protocol_type="", protocol_data="", members=[],
                                                  authorized_operations=None))  # None: not asked (Kafka's INT32_MIN)
                continue
            stable = group.state == g.GroupState.STABLE
            members = [R.DescribedGroup.DescribedGroupMember(
                member_id=m.member_id, group_instance_id=None, client_id=m.client_id, client_host="",
                member_metadata=m.metadata(group.protocol_name) if group.protocol_name else b"",
                member_assignment=m.assignment if stable else b"") for m in group.members.values()]
            described.append(R.DescribedGroup(error_code=g.NONE, error_message=None, group_id=group_id,
                                              group_state=group.state.value, protocol_type=group.protocol_type or "",
                                              protocol_data=group.protocol_name or "", members=members,
                                              authorized_operations=None))  # None: not asked (Kafka's INT32_MIN)
        return R(version=request.API_VERSION, throttle_time_ms=0, groups=described)

    async def list_groups(self, request):
        """The groups with members here, and the groups with committed offsets (Empty)."""
        stored = await self._blocking(self.offsets.all_groups) if self.offsets is not None else {}
        listed = {group_id: ("consumer", "Empty") for group_id in stored}
        listed.update({group.group_id: (group.protocol_type or "consumer", group.state.value)
                       for group in self.coordinator.groups.values()})
        wanted = {s.lower() for s in (getattr(request, "states_filter", None) or [])}
        R = ListGroupsResponse
        return R(version=request.API_VERSION, throttle_time_ms=0, error_code=g.NONE, groups=[
            R.ListedGroup(group_id=group_id, protocol_type=protocol_type, group_state=state, group_type="classic")
            for group_id, (protocol_type, state) in sorted(listed.items()) if not wanted or state.lower() in wanted])

    # --- offsets ---

    async def offset_commit(self, request):
        error = self.coordinator.check_commit(request.group_id, request.generation_id_or_member_epoch, request.member_id)
        if error == g.NONE and self.offsets is None:
            error = g.COORDINATOR_NOT_AVAILABLE
        answers: dict[tuple[str, int], int] = {}
        commits = []
        for topic in request.topics:
            for part in topic.partitions:
                metadata = part.committed_metadata
                if error != g.NONE:
                    answers[(topic.name, part.partition_index)] = error
                elif metadata is not None and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                    answers[(topic.name, part.partition_index)] = g.OFFSET_METADATA_TOO_LARGE
                else:
                    answers[(topic.name, part.partition_index)] = g.NONE
                    epoch = part.committed_leader_epoch if request.API_VERSION >= 6 else -1
                    commits.append(CommittedOffset(topic.name, part.partition_index, part.committed_offset, epoch, metadata))
        if commits:
            try:
                await self._blocking(self.offsets.commit, request.group_id, commits)
            except Exception as e:  # the store unreachable: the client retries the commit
                log.warning("OffsetCommit of group %r: %s", request.group_id, e)
                answers = {key: g.COORDINATOR_NOT_AVAILABLE for key in answers}
            else:
                if self.mirror is not None:
                    self.mirror.committed(request.group_id)
        R = OffsetCommitResponse
        by_topic: dict[str, list] = {}
        for (name, index), code in answers.items():
            by_topic.setdefault(name, []).append(R.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                partition_index=index, error_code=code))
        return R(version=request.API_VERSION, throttle_time_ms=0, topics=[
            R.OffsetCommitResponseTopic(name=name, partitions=parts) for name, parts in by_topic.items()])

    async def offset_fetch(self, request):
        version = request.API_VERSION
        if version >= 8:
            asked = [(group.group_id, None if group.topics is None else [(t.name, t.partition_indexes) for t in group.topics])
                     for group in request.groups]
        else:
            asked = [(request.group_id, None if request.topics is None else
                      [(t.name, t.partition_indexes) for t in request.topics])]
        answers = []
        for group_id, topics in asked:
            try:
                committed = await self._blocking(self.offsets.committed, group_id) if self.offsets is not None else {}
                error = g.NONE if self.offsets is not None else g.COORDINATOR_NOT_AVAILABLE
            except Exception as e:
                log.warning("OffsetFetch of group %r: %s", group_id, e)
                committed, error = {}, g.COORDINATOR_NOT_AVAILABLE
            if topics is None:  # every partition the group committed
                topics = {}
                for topic, partition in sorted(committed):
                    topics.setdefault(topic, []).append(partition)
                topics = list(topics.items())
            answers.append((group_id, error, [(name, [(index, committed.get((name, index))) for index in indexes])
                                              for name, indexes in topics]))
        return self._offset_fetch_response(version, answers)

    @staticmethod
    def _offset_fetch_response(version: int, answers):
        R = OffsetFetchResponse

        def values(offset: CommittedOffset | None) -> dict:
            if offset is None:  # nothing committed: −1, and no error (the consumer applies auto.offset.reset)
                return {"committed_offset": -1, "committed_leader_epoch": -1, "metadata": "", "error_code": g.NONE}
            return {"committed_offset": offset.offset, "committed_leader_epoch": offset.leader_epoch,
                    "metadata": offset.metadata if offset.metadata is not None else "", "error_code": g.NONE}

        if version < 8:
            [(_group_id, error, topics)] = answers
            return R(version=version, throttle_time_ms=0, error_code=error, topics=[
                R.OffsetFetchResponseTopic(name=name, partitions=[
                    R.OffsetFetchResponseTopic.OffsetFetchResponsePartition(partition_index=index, **values(offset))
                    for index, offset in parts]) for name, parts in topics])
        G = R.OffsetFetchResponseGroup
        return R(version=version, throttle_time_ms=0, groups=[G(group_id=group_id, error_code=error, topics=[
            G.OffsetFetchResponseTopics(name=name, partitions=[
                G.OffsetFetchResponseTopics.OffsetFetchResponsePartitions(partition_index=index, **values(offset))
                for index, offset in parts]) for name, parts in topics]) for group_id, error, topics in answers])
