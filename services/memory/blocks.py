"""Memory blocks: short named texts of a namespace (`persona`, `user`, `project`, …) that the agent
edits itself and every turn's system prompt shows, after the standing instructions.

    blocks = Blocks(documents, max_chars=2000, max_blocks=8)
    result = await blocks.edit("team-a", "user", Edit("append", "Prefers metric units."),
                               Provenance(session_id="s-1", seq=7, model="gpt", by="agent"))
    await blocks.revert("team-a", "user", 1, by="alice")

Every change is a new version, kept with where it came from (the session, the message seq and the
model of the turn that asked, or the person), so any version can be restored (`revert` writes a
new version with the old text: history only grows). A namespace's policy (`set_policy`) says
whether the agent's edits apply at once (`apply`, the default) or wait as drafts for a person
(`draft`: `approve` applies one to the block as it is then, `reject` drops it).

**Per-user blocks.** A block named in `PER_USER` (`user`) is kept per person when the call knows
its person (`user`, the subject of the principal the turn runs for): that person's sessions show
and edit their own, never another's nor the namespace's block of that name (written before a
person was known: a namespace without sign-in). Every other block is the namespace's.

    await blocks.edit("team-a", "user", Edit("append", "Ada."), Provenance(by="agent"), user="user:3f9a")

Stored as documents (ports.DocumentStore): the head of a block (its text and version), each
version, each draft and the policy; a per-user block under the key `name@<digest of the user>`
(a name has no `@`), its documents carrying the user for erasure (`erase_user_blocks`). A version is written before the head that names it, so a
crash between the two leaves an unreferenced version, never a head without its history.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import re
import time
import uuid
import weakref
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from agentmesh import error_reasons as reasons
from agentmesh.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from agentmesh.ids import validate_namespace
from agentmesh.memory.ports import DocumentStore

__all__ = ["ORDER", "PER_USER", "Block", "BlockDraft", "BlockVersion", "Blocks", "Edit", "EditResult", "Provenance",
           "erase_user_blocks"]

HEAD, VERSION, DRAFT, POLICY = "block", "block_version", "block_draft", "block_policy"
# The fixed order of the system prompt: these first, then any other block by name.
ORDER = ("persona", "user", "project")
# Blocks about the person chatting: each person their own once the call knows who they are.
PER_USER = ("user",)
POLICIES = ("apply", "draft")
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
MAX_USER_CHARS = 256  # a subject, as erasure bounds it
MAX_DRAFTS = 50  # per namespace: an agent that keeps proposing waits for a person to catch up


@dataclass(frozen=True)
class Provenance:
    session_id: str = ""
    seq: int = 0
    model: str = ""
    by: str = ""  # "agent", or the person's principal


@dataclass(frozen=True)
class Edit:
    change: str  # "append" | "replace"
    text: str  # append: the text added; replace: the new text
    old: str = ""  # replace: the exact text replaced


@dataclass(frozen=True)
class BlockVersion:
    version: int
    text: str
    created_at: float
    change: str
    provenance: Provenance
    reverted_to: int = 0


@dataclass(frozen=True)
class BlockDraft:
    id: str
    name: str
    change: str
    text: str
    old: str
    proposed: str
    created_at: float
    provenance: Provenance
    user: str = ""  # a per-user block's person; "" for the namespace's


@dataclass(frozen=True)
class Block:
    namespace: str
    name: str
    text: str = ""
    version: int = 0
    updated_at: float = 0.0
    max_chars: int = 0
    versions: tuple[BlockVersion, ...] = ()
    drafts: tuple[BlockDraft, ...] = ()
    user: str = ""  # whose it is, for a per-user block


@dataclass(frozen=True)
class EditResult:
    block: Block
    applied: bool
    draft: BlockDraft | None = None


def _version_key(key: str, version: int) -> str:
    return f"{key}/{version:08d}"


def _digest(user: str) -> str:
    return hashlib.sha256(user.encode()).hexdigest()[:24]


def _key(name: str, user: str) -> str:
    """Where block `name` is kept for a call of `user` ("" when none is known)."""
    return f"{name}@{_digest(user)}" if user and name in PER_USER else name


def _provenance(p: dict[str, Any] | None) -> Provenance:
    p = p or {}
    return Provenance(str(p.get("session_id", "")), int(p.get("seq", 0)), str(p.get("model", "")), str(p.get("by", "")))


def _draft(p: dict[str, Any]) -> BlockDraft:
    return BlockDraft(p["id"], p["name"], p["change"], p["text"], p.get("old", ""), p.get("proposed", ""),
                      float(p.get("created_at", 0.0)), _provenance(p.get("provenance")), str(p.get("user", "")))


def _owner(name: str, user: str) -> str:
    """Whose block `name` is for a call of `user`: theirs if it is kept per user, else nobody's."""
    return user if user and name in PER_USER else ""


def prompt_order(names: list[str]) -> list[str]:
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


class Blocks:
    def __init__(self, documents: DocumentStore, *, max_chars: int, max_blocks: int,
                 clock: Callable[[], float] = time.time):
        self._documents = documents
        self.max_chars = max_chars
        self.max_blocks = max_blocks
        self._clock = clock
        # Edits of one namespace take turns in this process: an edit reads the head it replaces.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, namespace: str) -> asyncio.Lock:
        return self._locks.setdefault(namespace, asyncio.Lock())

    @staticmethod
    def _name(name: str) -> str:
        if not _NAME.match(name or ""):
            raise InvalidArgument(
                f"block name {name[:40]!r} is malformed: use a lower-case word of up to 32 characters "
                f"(a-z, 0-9, '_', '-'), e.g. {', '.join(ORDER)}", field="name")
        return name

    # ------------------------------------------------------------ reads

    async def policy(self, namespace: str) -> str:
        namespace = validate_namespace(namespace)
        found = await self._documents.get_document(POLICY, namespace, "edits")
        return str(found.get("edits", "apply")) if found else "apply"

    async def _heads(self, namespace: str, user: str) -> dict[str, dict[str, Any]]:
        """name -> head of the blocks a call of `user` sees: the namespace's, where `user` is
        known its own per-user blocks in place of the namespace's of those names."""
        mine = f"@{_digest(user)}" if user else None
        heads: dict[str, dict[str, Any]] = {}
        for key, body in await self._documents.list_documents(HEAD, namespace):
            name, _, owner = key.partition("@")
            ours = not owner and not (mine is not None and name in PER_USER)
            if ours or (owner and mine is not None and key.endswith(mine)):
                heads[name] = body
        return heads

    async def list_everyones(self, namespace: str) -> builtins.list[Block]:
        """Every block of the namespace with its text: its own and each person's per-user blocks
        (each with its `user`), for an admin and an export."""
        namespace = validate_namespace(namespace)
        heads = await self._documents.list_documents(HEAD, namespace)
        blocks = [self._head(namespace, key.partition("@")[0], body, str(body.get("user", ""))) for key, body in heads]
        order = {name: n for n, name in enumerate(prompt_order(sorted({b.name for b in blocks})))}
        return sorted(blocks, key=lambda b: (order[b.name], b.user))

    async def list(self, namespace: str, user: str = "") -> list[Block]:
        """The blocks with any text a call of `user` sees, in the system prompt's order."""
        namespace = validate_namespace(namespace)
        heads = await self._heads(namespace, user)
        return [self._head(namespace, name, heads[name], _owner(name, user)) for name in prompt_order(list(heads))]

    async def drafts(self, namespace: str, name: str = "", user: str = "",
                     everyones: bool = False) -> builtins.list[BlockDraft]:
        """The drafts of the blocks a call of `user` sees (another person's wait unseen), or with
        `everyones` every person's too (an admin's list)."""
        namespace = validate_namespace(namespace)
        found = [_draft(body) for _, body in await self._documents.list_documents(DRAFT, namespace)]
        return sorted((d for d in found if (not name or d.name == name)
                       and (everyones or d.user == _owner(d.name, user))),
                      key=lambda d: (d.created_at, d.id))

    async def get(self, namespace: str, name: str, user: str = "") -> Block:
        """One block with every version (newest first) and its drafts; NOT_FOUND when it was
        never written and has no draft."""
        namespace, name = validate_namespace(namespace), self._name(name)
        key = _key(name, user)
        head = await self._documents.get_document(HEAD, namespace, key)
        versions = [
            BlockVersion(int(b["version"]), b["text"], float(b["created_at"]), b["change"],
                         _provenance(b.get("provenance")), int(b.get("reverted_to", 0)))
            for k, b in await self._documents.list_documents(VERSION, namespace) if k.startswith(key + "/")
        ]
        drafts = await self.drafts(namespace, name, user)
        if head is None and not versions and not drafts:
            raise NotFound(f"namespace {namespace!r} has no block {name!r}; its blocks are listed by ListBlocks")
        block = self._head(namespace, name, head or {}, _owner(name, user))
        versions.sort(key=lambda v: -v.version)
        return replace(block, versions=tuple(versions), drafts=tuple(drafts))

    def _head(self, namespace: str, name: str, body: dict[str, Any], user: str = "") -> Block:
        return Block(namespace, name, body.get("text", ""), int(body.get("version", 0)),
                     float(body.get("updated_at", 0.0)), self.max_chars, user=user)

    # ------------------------------------------------------------ writes

    def _apply(self, namespace: str, name: str, current: str, edit: Edit) -> str:
        """The block's text after `edit`; refuses what cannot apply, naming why."""
        if edit.change == "append":
            added = edit.text.strip()
            if not added:
                raise InvalidArgument("text is empty: say what to add to the block", field="text")
            result = f"{current.rstrip()}\n{added}" if current.strip() else added
        elif edit.change == "replace":
            if not edit.old:
                raise InvalidArgument("old is empty: quote the exact text of the block to replace", field="old")
            count = current.count(edit.old)
            if count == 0:
                raise FailedPrecondition(
                    f"block {name!r} does not contain the text to replace; read the block in the system prompt "
                    "and quote it exactly", reason=reasons.BLOCK_TEXT_NOT_FOUND)
            if count > 1:
                raise FailedPrecondition(
                    f"block {name!r} contains the text to replace {count} times; quote more of it so that it "
                    "is found once", reason=reasons.BLOCK_TEXT_NOT_FOUND)
            result = current.replace(edit.old, edit.text, 1).strip()
        else:
            raise InvalidArgument(f"change {edit.change[:20]!r} is unknown: use append or replace", field="change")
        if len(result) > self.max_chars:
            raise FailedPrecondition(
                f"block {name!r} would hold {len(result)} characters; the limit is {self.max_chars} (every turn "
                "carries it): replace older lines with a shorter summary instead", reason=reasons.BLOCK_FULL)
        return result

    async def edit(self, namespace: str, name: str, edit: Edit, provenance: Provenance,
                   user: str = "") -> EditResult:
        namespace, name = validate_namespace(namespace), self._name(name)
        user = _owner(name, user)
        async with self._lock(namespace):
            head = await self._head_or_room(namespace, name, user, "edit")
            current = (head or {}).get("text", "")
            proposed = self._apply(namespace, name, current, edit)
            if await self.policy(namespace) == "draft":
                return EditResult(await self.get_head(namespace, name, user), False,
                                  await self._put_draft(namespace, name, edit, proposed, provenance, user))
            block = await self._commit(namespace, name, head, proposed, edit.change, provenance, user=user)
            return EditResult(block, True)

    async def get_head(self, namespace: str, name: str, user: str = "") -> Block:
        user = _owner(name, user)
        return self._head(namespace, name, await self._documents.get_document(HEAD, namespace, _key(name, user)) or {},
                          user)

    async def _put_draft(self, namespace: str, name: str, edit: Edit, proposed: str,
                         provenance: Provenance, user: str) -> BlockDraft:
        if len(await self._documents.list_documents(DRAFT, namespace)) >= MAX_DRAFTS:
            raise FailedPrecondition(
                f"namespace {namespace!r} has {MAX_DRAFTS} block edits waiting for a person; approve or reject "
                "them first (agentmesh memory blocks list)", reason=reasons.BLOCK_FULL)
        draft = BlockDraft(f"bd-{uuid.uuid4().hex[:16]}", name, edit.change, edit.text, edit.old, proposed,
                           self._clock(), provenance, user)
        await self._documents.put_document(DRAFT, namespace, draft.id, asdict(draft))
        return draft

    async def _commit(self, namespace: str, name: str, head: dict[str, Any] | None, text: str, change: str,
                      provenance: Provenance, reverted_to: int = 0, user: str = "") -> Block:
        version = int((head or {}).get("version", 0)) + 1
        now = self._clock()
        key = _key(name, user)
        record = {**asdict(BlockVersion(version, text, now, change, provenance, reverted_to)), "user": user}
        # The version first: the head that names it is the commit point.
        await self._documents.put_document(VERSION, namespace, _version_key(key, version), record)
        await self._documents.put_document(HEAD, namespace, key,
                                           {"text": text, "version": version, "updated_at": now, "user": user})
        return Block(namespace, name, text, version, now, self.max_chars, user=user)

    async def revert(self, namespace: str, name: str, version: int, by: str, user: str = "") -> Block:
        """A new version with `version`'s text."""
        namespace, name = validate_namespace(namespace), self._name(name)
        if version < 1:
            raise InvalidArgument(f"version must be 1 or more, got {version}", field="version")
        user = _owner(name, user)
        async with self._lock(namespace):
            old = await self._documents.get_document(VERSION, namespace, _version_key(_key(name, user), version))
            if old is None:
                raise NotFound(f"block {name!r} of namespace {namespace!r} has no version {version}; GetBlock "
                               "lists its versions", reason=reasons.BLOCK_VERSION_NOT_FOUND)
            head = await self._documents.get_document(HEAD, namespace, _key(name, user))
            return await self._commit(namespace, name, head, old["text"], "revert", Provenance(by=by), version, user)

    @staticmethod
    def check_owner(name: str, user: str) -> str:
        """`user` named for block `name`: refused unless the block is kept per person."""
        if len(user) > MAX_USER_CHARS:
            raise InvalidArgument(f"user names a person by their subject (e.g. 'user:3f9a…'), at most "
                                  f"{MAX_USER_CHARS} characters", field="user")
        if user and name not in PER_USER:
            raise InvalidArgument(f"block {name!r} is the namespace's, not a person's: only "
                                  f"{', '.join(PER_USER)} is kept per person; leave user empty", field="user")
        return user

    def _fits(self, name: str, text: str) -> str:
        if len(text) > self.max_chars:
            raise FailedPrecondition(
                f"block {name!r} would hold {len(text)} characters; the limit is {self.max_chars} (every turn "
                "carries it): write a shorter text", reason=reasons.BLOCK_FULL)
        return text

    async def _head_or_room(self, namespace: str, name: str, user: str, verb: str) -> dict[str, Any] | None:
        """The block's head, or None for a new block when the namespace has room for one more."""
        head = await self._documents.get_document(HEAD, namespace, _key(name, user))
        if head is None:
            names = set(await self._heads(namespace, user))
            if len(names) >= self.max_blocks:
                raise FailedPrecondition(
                    f"namespace {namespace!r} has {len(names)} blocks, the most it may have; {verb} one of "
                    f"{', '.join(prompt_order(sorted(names)))}", reason=reasons.BLOCK_FULL)
        return head

    async def set(self, namespace: str, name: str, text: str, by: str, user: str = "") -> Block:
        """A person writes the block's whole text: a new version (change "set"), at once, whatever
        the namespace's draft policy (a person is who drafts wait for)."""
        namespace, name = validate_namespace(namespace), self._name(name)
        user, text = _owner(name, user), self._fits(name, text.strip())
        async with self._lock(namespace):
            head = await self._head_or_room(namespace, name, user, "write")
            return await self._commit(namespace, name, head, text, "set", Provenance(by=by or "a person"), user=user)

    async def restore(self, block: Block, replace: bool = False) -> Block:
        """Writes a block as exported — each version with its provenance and time, then the head
        at the newest — refusing one that exists unless `replace` (which removes it, its history
        and drafts first)."""
        namespace, name = validate_namespace(block.namespace), self._name(block.name)
        user = self.check_owner(name, block.user)
        numbers = [v.version for v in block.versions]
        if not block.versions or min(numbers) < 1 or len(set(numbers)) != len(numbers):
            raise InvalidArgument(f"block {name!r} has no versions, or versions numbered below 1 or twice: a "
                                  "restored block brings its history, numbered from 1", field="versions")
        for v in block.versions:
            self._fits(name, v.text)
        key = _key(name, user)
        async with self._lock(namespace):
            old = [k for k, _ in await self._documents.list_documents(VERSION, namespace) if k.startswith(key + "/")]
            head = await self._documents.get_document(HEAD, namespace, key)
            if (head is not None or old) and not replace:
                whose = f" of {user}" if user else ""
                raise AlreadyExists(f"namespace {namespace!r} already has block {name!r}{whose}; restore with "
                                    "replace to write over it")
            if head is not None:
                await self._documents.delete_document(HEAD, namespace, key)
            for k in old:
                await self._documents.delete_document(VERSION, namespace, k)
            for d in await self.drafts(namespace, name, user):
                await self._documents.delete_document(DRAFT, namespace, d.id)
            for v in sorted(block.versions, key=lambda v: v.version):
                await self._documents.put_document(VERSION, namespace, _version_key(key, v.version),
                                                   {**asdict(v), "user": user})
            last = max(block.versions, key=lambda v: v.version)
            await self._documents.put_document(HEAD, namespace, key, {"text": last.text, "version": last.version,
                                                                      "updated_at": last.created_at, "user": user})
            return Block(namespace, name, last.text, last.version, last.created_at, self.max_chars, user=user)

    async def _take_draft(self, namespace: str, draft_id: str, user: str) -> BlockDraft:
        found = await self._documents.get_document(DRAFT, namespace, draft_id) if draft_id else None
        if found is not None and str(found.get("user", "")) not in ("", user):
            found = None  # another person's block: theirs to decide, and not to be known of
        if found is None:
            raise NotFound(f"namespace {namespace!r} has no block draft {draft_id[:40]!r}; ListBlocks lists the "
                           "drafts waiting", reason=reasons.BLOCK_DRAFT_NOT_FOUND)
        return _draft(found)

    async def approve(self, namespace: str, draft_id: str, by: str, user: str = "") -> Block:
        """Applies the draft's edit to the block as it reads now (it may have changed since)."""
        namespace = validate_namespace(namespace)
        async with self._lock(namespace):
            draft = await self._take_draft(namespace, draft_id, user)
            head = await self._documents.get_document(HEAD, namespace, _key(draft.name, draft.user))
            text = self._apply(namespace, draft.name, (head or {}).get("text", ""),
                               Edit(draft.change, draft.text, draft.old))
            provenance = Provenance(draft.provenance.session_id, draft.provenance.seq, draft.provenance.model,
                                    f"{draft.provenance.by or 'agent'}, approved by {by or 'a person'}")
            block = await self._commit(namespace, draft.name, head, text, draft.change, provenance, user=draft.user)
            await self._documents.delete_document(DRAFT, namespace, draft.id)
            return block

    async def reject(self, namespace: str, draft_id: str, user: str = "") -> Block:
        namespace = validate_namespace(namespace)
        async with self._lock(namespace):
            draft = await self._take_draft(namespace, draft_id, user)
            await self._documents.delete_document(DRAFT, namespace, draft.id)
            return await self.get_head(namespace, draft.name, draft.user)

    async def set_policy(self, namespace: str, edits: str) -> str:
        namespace = validate_namespace(namespace)
        if edits not in POLICIES:
            raise InvalidArgument(f"edits {edits[:20]!r} is unknown: use apply (edits apply at once) or draft "
                                  "(they wait for a person)", field="edits")
        await self._documents.put_document(POLICY, namespace, "edits", {"edits": edits})
        return edits



async def erase_user_blocks(documents: DocumentStore, namespace: str, user: str) -> int:
    """Removes every per-user block of `user` in the namespace — drafts, versions, then heads (a
    head last: while it stands, what is left of the block is still found by it); the number of
    documents removed. A pass cut short is finished by the next."""
    removed = 0
    for kind in (DRAFT, VERSION, HEAD):
        for key, body in await documents.list_documents(kind, namespace):
            if user and body.get("user") == user:
                removed += bool(await documents.delete_document(kind, namespace, key))
    return removed
