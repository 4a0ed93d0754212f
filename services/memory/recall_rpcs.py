# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The memory service's recall RPCs — search over conversations and memory blocks — as a part of
MemoryServicer (server.py) of their own: proto <-> core types, each checked against the caller's
tenants as the rest of the service's RPCs are."""

from __future__ import annotations

from agentmesh.errors import FailedPrecondition
from agentmesh.memory.blocks import PER_USER, Block, BlockDraft, Blocks, BlockVersion, Edit, Provenance
from agentmesh.memory.convert import message_to_proto
from agentmesh.memory.recall import ConversationIndex, ConversationQuery
from agentmesh.memory.retention_rpcs import creator
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.rpc.auth import current_principal
from agentmesh.rpc.errors import translate_errors
from agentmesh.rpc.users import ANONYMOUS
from agentmesh.v1 import learning_pb2

__all__ = ["RecallRpcs", "block_from_proto", "block_to_proto", "block_user"]


def _provenance_to_proto(p: Provenance) -> learning_pb2.BlockProvenance:
    return learning_pb2.BlockProvenance(session_id=p.session_id, seq=p.seq, model=p.model, by=p.by)


def _draft_to_proto(d: BlockDraft) -> learning_pb2.BlockDraft:
    return learning_pb2.BlockDraft(id=d.id, name=d.name, change=d.change, text=d.text, old=d.old,
                                   proposed=d.proposed, created_at=d.created_at,
                                   provenance=_provenance_to_proto(d.provenance), user=d.user)


def block_to_proto(b: Block) -> learning_pb2.MemoryBlock:
    return learning_pb2.MemoryBlock(
        namespace=b.namespace, name=b.name, text=b.text, version=b.version, updated_at=b.updated_at,
        max_chars=b.max_chars,
        versions=[learning_pb2.BlockVersion(version=v.version, text=v.text, created_at=v.created_at, change=v.change,
                                            provenance=_provenance_to_proto(v.provenance), reverted_to=v.reverted_to)
                  for v in b.versions],
        drafts=[_draft_to_proto(d) for d in b.drafts], user=b.user)


def block_from_proto(b: learning_pb2.MemoryBlock) -> Block:
    """A block as an export carries it (RestoreBlock): its versions with their provenance."""
    return Block(b.namespace or "default", b.name, b.text, b.version, b.updated_at, user=b.user, versions=tuple(
        BlockVersion(v.version, v.text, v.created_at, v.change,
                     Provenance(v.provenance.session_id, v.provenance.seq, v.provenance.model, v.provenance.by),
                     v.reverted_to) for v in b.versions))


def block_user() -> str:
    """The person whose per-user blocks a call reads and edits: the subject of the principal it
    runs for (the agent signs a turn's calls for the person chatting); "" when no person is known
    — a service on its own, or the anonymous caller of a home without sign-in."""
    user = creator()
    return "" if user == ANONYMOUS.subject else user


def _person() -> str:
    """Who made a person's change, for the block's history."""
    principal = current_principal.get()
    return principal.subject if principal is not None else "local"


class RecallRpcs:
    """Mixed into MemoryServicer, which sets these."""

    _tenants: TenantGuard
    _blocks: Blocks | None  # None: a servicer built without them (tests of other parts)
    _conversations: ConversationIndex | None

    def _appended(self, session_id: str) -> None:
        """After an append was written: only a mark, the index is written by a background task
        once the call has answered."""
        if self._conversations is not None:
            self._conversations.appended(session_id)

    def _block_store(self) -> Blocks:
        if self._blocks is None:
            raise FailedPrecondition("this memory service keeps no memory blocks")
        return self._blocks

    def _conversation_index(self) -> ConversationIndex:
        if self._conversations is None:
            raise FailedPrecondition("this memory service does not index conversations: AGENTMESH_CONVERSATION_INDEX is false")
        return self._conversations

    # --- recall over conversations ---

    @translate_errors
    async def SearchConversations(self, request, context):
        self._tenants.namespace(request.namespace or "default", "SearchConversations")
        hits = await self._conversation_index().search(request.namespace, ConversationQuery(
            query=request.query, k=request.k, session_id=request.session_id, since=request.since,
            until=request.until, role=request.role, tool=request.tool))
        reply = learning_pb2.SearchConversationsResponse()
        for h in hits:
            out = reply.hits.add(session_id=h.session_id, seq=h.seq, role=h.role, text=h.text,
                                 created_at=h.created_at, score=h.score)
            if h.before is not None:
                out.before.CopyFrom(message_to_proto(h.before))
            if h.after is not None:
                out.after.CopyFrom(message_to_proto(h.after))
        return reply

    # --- memory blocks ---

    def _whose(self, namespace: str, user: str, method: str, **what: str) -> str:
        """The person whose per-user blocks the call addresses: the caller's own; another's only
        for an admin of the namespace, and each such call is an audit line."""
        own = block_user()
        if not user or user == own:
            return own
        Blocks.check_owner(what.get("block", PER_USER[0]), user)
        self._tenants.namespace(namespace, method, role="admin")
        self._tenants.audit("block.other_user", method=f"memory.{method}", namespace=namespace, user=user, **what)
        return user

    @translate_errors
    async def ListBlocks(self, request, context):
        self._tenants.namespace(request.namespace or "default", "ListBlocks")
        if request.all_users:
            self._whose(request.namespace or "default", "*", "ListBlocks")
            blocks = await self._block_store().list_everyones(request.namespace)
            drafts = await self._block_store().drafts(request.namespace, everyones=True)
            return learning_pb2.ListBlocksResponse(
                blocks=[block_to_proto(b) for b in blocks], drafts=[_draft_to_proto(d) for d in drafts],
                edits=await self._block_store().policy(request.namespace))
        blocks = await self._block_store().list(request.namespace, block_user())
        drafts = await self._block_store().drafts(request.namespace, user=block_user())
        return learning_pb2.ListBlocksResponse(
            blocks=[block_to_proto(b) for b in blocks], drafts=[_draft_to_proto(d) for d in drafts],
            edits=await self._block_store().policy(request.namespace))

    @translate_errors
    async def GetBlock(self, request, context):
        self._tenants.namespace(request.namespace or "default", "GetBlock")
        user = self._whose(request.namespace or "default", request.user, "GetBlock", block=request.name)
        return block_to_proto(await self._block_store().get(request.namespace, request.name, user))

    @translate_errors
    async def SetBlock(self, request, context):
        self._tenants.namespace(request.namespace or "default", "SetBlock")
        user = self._whose(request.namespace or "default", request.user, "SetBlock", block=request.name)
        return block_to_proto(await self._block_store().set(request.namespace, request.name, request.text, _person(),
                                                              user))

    @translate_errors
    async def RestoreBlock(self, request, context):
        block = block_from_proto(request.block)
        self._tenants.namespace(block.namespace, "RestoreBlock")
        return block_to_proto(await self._block_store().restore(block, request.replace))

    @translate_errors
    async def EditBlock(self, request, context):
        self._tenants.namespace(request.namespace or "default", "EditBlock")
        p = request.provenance
        principal = current_principal.get()
        # The agent says which turn asked; a person's edit is theirs, whatever the request says.
        by = "agent" if principal is None or principal.via == "agent" else principal.subject
        result = await self._block_store().edit(
            request.namespace, request.name, Edit(request.change, request.text, request.old),
            Provenance(session_id=p.session_id, seq=p.seq, model=p.model, by=by), block_user())
        reply = learning_pb2.EditBlockResponse(block=block_to_proto(result.block), applied=result.applied)
        if result.draft is not None:
            reply.draft.CopyFrom(_draft_to_proto(result.draft))
        return reply

    @translate_errors
    async def RevertBlock(self, request, context):
        self._tenants.namespace(request.namespace or "default", "RevertBlock")
        user = self._whose(request.namespace or "default", request.user, "RevertBlock", block=request.name)
        return block_to_proto(await self._block_store().revert(request.namespace, request.name, request.version, _person(),
                                                                 user))

    @translate_errors
    async def ApproveBlockEdit(self, request, context):
        self._tenants.namespace(request.namespace or "default", "ApproveBlockEdit")
        user = self._whose(request.namespace or "default", request.user, "ApproveBlockEdit", draft=request.draft_id)
        return block_to_proto(await self._block_store().approve(request.namespace, request.draft_id, _person(), user))

    @translate_errors
    async def RejectBlockEdit(self, request, context):
        self._tenants.namespace(request.namespace or "default", "RejectBlockEdit")
        user = self._whose(request.namespace or "default", request.user, "RejectBlockEdit", draft=request.draft_id)
        return block_to_proto(await self._block_store().reject(request.namespace, request.draft_id, user))

    @translate_errors
    async def SetBlockPolicy(self, request, context):
        self._tenants.namespace(request.namespace or "default", "SetBlockPolicy")
        edits = await self._block_store().set_policy(request.namespace, request.edits)
        return learning_pb2.BlockPolicy(namespace=request.namespace or "default", edits=edits)
