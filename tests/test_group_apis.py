"""The group APIs of `kts serve` on the wire (kts_resources/serving/group_apis.py), in process:
each request built by kafka-python, framed, decoded as the server decodes it, answered, and the
response decoded from its frame. One member's life: MEMBER_ID_REQUIRED, the join, the leader's
assignment, heartbeats, commits of the current generation taken and of a stale one refused, the
offsets fetched back (OffsetFetch before and from v8), and the leave."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from kts_resources.metadata.group_offsets import GroupOffsets
from kts_resources.serving import protocol
from kts_resources.serving.group_apis import GroupSide
from kts_resources.serving.groups import GroupCoordinator

GROUP, TOPIC = "auditors", "orders"


async def over_the_wire(side: GroupSide, request, response_class):
    request.with_header(correlation_id=7, client_id="auditor")
    decoded = protocol.decode_request(bytes(request.encode(header=True, framed=True))[4:])
    response = await side.answer(decoded)
    frame = protocol.frame_response(response, 7)
    return response_class.decode(frame[4:], version=request.API_VERSION, header=True)


async def commit(side, generation: int, member_id: str, offset: int) -> int:
    R = OffsetCommitRequest
    answer = await over_the_wire(side, R[8](group_id=GROUP, generation_id_or_member_epoch=generation, member_id=member_id,
                                      group_instance_id=None, topics=[R.OffsetCommitRequestTopic(name=TOPIC, partitions=[
                                          R.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                              partition_index=0, committed_offset=offset, committed_leader_epoch=4,
                                              committed_metadata="m")])]), OffsetCommitResponse)
    [[partition]] = [t.partitions for t in answer.topics]
    return partition.error_code


async def fetched(side, version: int) -> list[tuple[int, int, int]]:
    """(partition, committed offset, leader epoch) of partitions 0 and 1."""
    R = OffsetFetchRequest
    if version >= 8:
        request = R[version](groups=[R.OffsetFetchRequestGroup(group_id=GROUP, topics=[
            R.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name=TOPIC, partition_indexes=[0, 1])])], require_stable=True)
        [group] = (await over_the_wire(side, request, OffsetFetchResponse)).groups
        topics = group.topics
    else:
        request = R[version](group_id=GROUP, topics=[R.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0, 1])])
        topics = (await over_the_wire(side, request, OffsetFetchResponse)).topics
    return [(p.partition_index, p.committed_offset, p.committed_leader_epoch) for t in topics for p in t.partitions]


def test_one_members_life_through_the_group_apis_with_its_offsets_in_the_store(metadata_store):
    asyncio.run(one_members_life(GroupOffsets(metadata_store.engine)))
    assert GroupOffsets(metadata_store.engine).committed(GROUP)[(TOPIC, 0)].offset == 50


async def one_members_life(offsets: GroupOffsets, mirror=None) -> None:
    side = GroupSide(offsets, ThreadPoolExecutor(2), advertised=("127.0.0.1", 9092), draining=asyncio.Event(),
                     coordinator=GroupCoordinator(initial_rebalance_delay_ms=0), mirror=mirror)
    J = JoinGroupRequest

    async def join(member_id: str):
        return await over_the_wire(side, J[5](group_id=GROUP, session_timeout_ms=10_000, rebalance_timeout_ms=30_000,
                                              member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                              protocols=[J.JoinGroupRequestProtocol(name="range", metadata=b"sub")]),
                                   JoinGroupResponse)

    try:
        required = await join("")
        assert required.error_code == 79 and required.member_id.startswith("auditor-")  # MEMBER_ID_REQUIRED (KIP-394)
        joined = await join(required.member_id)
        me, generation = joined.member_id, joined.generation_id
        assert (joined.error_code, joined.leader, [(m.member_id, m.metadata) for m in joined.members]) == \
            (0, me, [(me, b"sub")])
        S = SyncGroupRequest
        synced = await over_the_wire(side, S[3](group_id=GROUP, generation_id=generation, member_id=me, group_instance_id=None,
                                                assignments=[S.SyncGroupRequestAssignment(member_id=me, assignment=b"p0")]),
                                     SyncGroupResponse)
        assert (synced.error_code, synced.assignment) == (0, b"p0")
        beat = await over_the_wire(side, HeartbeatRequest[3](group_id=GROUP, generation_id=generation, member_id=me,
                                                            group_instance_id=None), HeartbeatResponse)
        assert beat.error_code == 0

        assert await fetched(side, 5) == [(0, -1, -1), (1, -1, -1)]  # nothing committed: −1, no error
        assert await commit(side, generation, me, 42) == 0
        assert await commit(side, generation - 1, me, 99) == 22  # ILLEGAL_GENERATION: a stale generation
        assert await fetched(side, 5) == await fetched(side, 8) == [(0, 42, 4), (1, -1, -1)]

        L = LeaveGroupRequest
        left = await over_the_wire(side, L[4](group_id=GROUP, members=[L.MemberIdentity(member_id=me, group_instance_id=None)]),
                                   LeaveGroupResponse)
        assert (left.error_code, [m.error_code for m in left.members]) == (0, [0])
        assert await commit(side, generation, me, 50) == 25  # UNKNOWN_MEMBER_ID: it left
        assert await commit(side, -1, "", 50) == 0  # a simple commit, the group being empty
    finally:
        side.draining.set()  # ends the coordinator's expiry task
        await asyncio.sleep(0)
