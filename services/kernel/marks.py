"""NodeMarks: taint, cordon, label, condition and annotation on a node, by owner, crash-safe.

Each owner (`quarantine`, `falco`, `maintenance`, ...) applies and releases its marks
through one `NodeMarks`. Before changing anything it writes a write-ahead intent to its KV
bucket (`MarkIntent`, key `marks.<node>`) holding the prior state read from the node. Then
ONE node PATCH (resourceVersion checked, re-read on 409) adds or removes the taints, the
cordon, the labels, the owner's annotations and the owner's entry in the annotation
`nodeward.io/marks` together; then the condition (status subresource) and the Event; then
the intent's phase. A SIGKILL anywhere leaves an intent that the next run finishes:

- `applying`: the PATCH is redone from the recorded entry (never re-planned from a node
  that may already carry our marks);
- `releasing`: a missing mark means "my release went through", never an operator's act;
  the release PATCH removes taints and uncordons at once, so there is no
  "taint gone, still cordoned" state;
- `applied`: only here may a missing mark be an operator's act (`operator_act`), which the
  owner audits and then respects (`respect`).

A node is uncordoned on release only if this owner's cordon was nodeward's (the node was
schedulable before the first nodeward owner cordoned it) and no other owner still holds one.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import structlog
from nats.js.kv import KeyValue

from nodeward.bus.kv import TypedKV
from nodeward.failpoints import Failpoints
from nodeward.kube import Cluster
from nodeward.kube.base import Obj
from nodeward.kube.nodes import taints_of
from schemas.state.marks import (
    ConditionSpec,
    EventSpec,
    MarkEntry,
    MarkIntent,
    MarkSpec,
    marks_key,
)

MARKS_ANNOTATION = "nodeward.io/marks"


class Unread(enum.Enum):
    """An intent not read yet (`NodeMarks.put_on(read=...)`)."""

    UNREAD = "unread"


UNREAD = Unread.UNREAD


# pure planning ---------------------------------------------------------------------------
def unschedulable(node: Obj) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def _taint_id(taint: Mapping[str, Any]) -> str:
    return f"{taint.get('key')}:{taint.get('effect')}"


def _annotations(node: Obj) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def _labels(node: Obj) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def entries(node: Obj) -> dict[str, MarkEntry]:
    """Every owner's entry in the node's `nodeward.io/marks` annotation (bad ones ignored)."""
    raw = _annotations(node).get(MARKS_ANNOTATION)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    out: dict[str, MarkEntry] = {}
    for owner, entry in value.items():
        try:
            out[str(owner)] = MarkEntry.model_validate(entry)
        except ValueError:
            continue
    return out


def still_holding(node: Obj, owner: str) -> list[str]:
    """What keeps `node` out of service once `owner` let go, one phrase each: another
    nodeward owner's marks, a cordon nobody of nodeward holds (an operator's), foreign taints
    with NoSchedule or NoExecute."""
    others = {o: e for o, e in entries(node).items() if o != owner}
    out = []
    for name, entry in sorted(others.items()):
        held = [*entry.taints, *(["cordon"] if entry.cordon else [])]
        if held:
            out.append(f"nodeward's {name} ({', '.join(held)}; incident {entry.incident})")
    if unschedulable(node) and not any(e.cordon for e in others.values()):
        out.append("a cordon not placed by nodeward (an operator's)")
    ours = {t for e in entries(node).values() for t in e.taints}
    foreign = [
        _taint_id(t)
        for t in taints_of(node)
        if _taint_id(t) not in ours and t.get("effect") in ("NoSchedule", "NoExecute")
    ]
    if foreign:
        out.append(f"taints not placed by nodeward ({', '.join(sorted(foreign))})")
    return out


def _encode(all_entries: Mapping[str, MarkEntry]) -> str | None:
    if not all_entries:
        return None
    return json.dumps(
        {o: e.model_dump(mode="json") for o, e in sorted(all_entries.items())},
        separators=(",", ":"),
    )


def plan(node: Obj, owner: str, incident: str, spec: MarkSpec) -> MarkEntry:
    """What `owner` will own on `node`, decided from the node before any change.

    A taint already there belongs to whoever put it there, unless another nodeward owner
    lists it (then it is shared). A node already unschedulable was cordoned before us,
    unless other nodeward owners hold the cordon: then we inherit what they recorded.
    """
    others = {o: e for o, e in entries(node).items() if o != owner}
    present = {_taint_id(t) for t in taints_of(node)}
    shared = {t for e in others.values() for t in e.taints}
    taints = [t for t in spec.taints if t not in present or t in shared]
    holders = [e for e in others.values() if e.cordon]
    if not unschedulable(node):
        prior = False
    elif holders:
        prior = all(e.prior_unschedulable for e in holders)
    else:
        prior = True
    labels = _labels(node)
    prior_labels: dict[str, str | None] = {}
    for key in spec.labels:
        inherited = next((e.labels[key] for e in others.values() if key in e.labels), None)
        prior_labels[key] = inherited if inherited is not None else labels.get(key)
    return MarkEntry(
        incident=incident,
        taints=taints,
        cordon=spec.cordon,
        prior_unschedulable=prior,
        labels=prior_labels,
        annotations=sorted(spec.annotations),
    )


def supersede(old: MarkEntry, new: MarkEntry, *, operator_released: bool) -> MarkEntry:
    """A new incident on a node the owner still holds: what the node had before the older
    incident stays the prior state; marks the owner still holds stay its own."""
    kept = reduced(old) if operator_released else old
    taints = [*kept.taints, *(t for t in new.taints if t not in kept.taints)]
    return new.model_copy(
        update={
            "taints": taints,
            "prior_unschedulable": kept.prior_unschedulable
            if kept.cordon
            else new.prior_unschedulable,
            "labels": {**new.labels, **old.labels},
            "annotations": sorted({*old.annotations, *new.annotations}),
        }
    )


def _split(taint: str) -> dict[str, Any]:
    key, _, effect = taint.rpartition(":")
    new: dict[str, Any] = {"key": key, "effect": effect}
    if effect == "NoExecute":
        new["timeAdded"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return new


def apply_patch(node: Obj, owner: str, entry: MarkEntry, spec: MarkSpec) -> Obj | None:
    """The one PATCH that puts `entry`'s marks on `node` (None if they are all there)."""
    taints = taints_of(node)
    present = {_taint_id(t) for t in taints}
    missing = [_split(t) for t in entry.taints if t not in present]
    patch: dict[str, Any] = {}
    spec_part: dict[str, Any] = {}
    if missing:
        spec_part["taints"] = [*taints, *missing]
    if entry.cordon and not unschedulable(node):
        spec_part["unschedulable"] = True
    labels = _labels(node)
    new_labels = {k: v for k, v in spec.labels.items() if labels.get(k) != v}
    notes = _annotations(node)
    new_notes: dict[str, str | None] = {
        k: v for k, v in spec.annotations.items() if notes.get(k) != v
    }
    all_entries = entries(node)
    before = dict(all_entries)
    if not unschedulable(node):
        # Another owner's cordon on a schedulable node was lifted by an operator (e.g. after
        # a maintenance): its claim is void and must not keep our cordon on at release.
        for o, e in all_entries.items():
            if o != owner and e.cordon:
                all_entries[o] = e.model_copy(update={"cordon": False})
    all_entries[owner] = entry
    if all_entries != before:
        new_notes[MARKS_ANNOTATION] = _encode(all_entries)
    metadata: dict[str, Any] = {}
    if new_labels:
        metadata["labels"] = new_labels
    if new_notes:
        metadata["annotations"] = new_notes
    if spec_part:
        patch["spec"] = spec_part
    if metadata:
        patch["metadata"] = metadata
    return patch or None


def release_patch(
    node: Obj, owner: str, entry: MarkEntry, spec: MarkSpec
) -> tuple[Obj | None, dict[str, Any]]:
    """The one PATCH that takes `owner`'s marks off `node`, and what it does.

    None when the node no longer carries `owner`'s entry: the release already went through
    (the entry leaves in the same PATCH as the marks). Taints shared with another owner
    stay; the cordon is lifted only if nodeward put it there and no other owner holds one.
    """
    all_entries = entries(node)
    if owner not in all_entries:
        return None, {"removed_taints": [], "uncordoned": False, "kept_cordon": unschedulable(node)}
    others = {o: e for o, e in all_entries.items() if o != owner}
    shared = {t for e in others.values() for t in e.taints}
    mine = set(entry.taints) - shared
    taints = taints_of(node)
    kept = [t for t in taints if _taint_id(t) not in mine]
    removed = sorted(_taint_id(t) for t in taints if _taint_id(t) in mine)
    uncordon = (
        entry.cordon
        and not entry.prior_unschedulable
        and not any(e.cordon for e in others.values())
        and unschedulable(node)
    )
    spec_part: dict[str, Any] = {}
    if removed:
        spec_part["taints"] = kept or None
    if uncordon:
        spec_part["unschedulable"] = None
    held_labels = {k for e in others.values() for k in e.labels}
    targets = spec.release_labels if spec.release_labels is not None else entry.labels
    labels = _labels(node)
    new_labels = {k: v for k, v in targets.items() if k not in held_labels and labels.get(k) != v}
    notes = _annotations(node)
    new_notes: dict[str, str | None] = {k: None for k in entry.annotations if k in notes}
    del all_entries[owner]
    new_notes[MARKS_ANNOTATION] = _encode(all_entries)
    patch: dict[str, Any] = {"metadata": {"annotations": new_notes}}
    if new_labels:
        patch["metadata"]["labels"] = new_labels
    if spec_part:
        patch["spec"] = spec_part
    details = {
        "removed_taints": removed,
        "uncordoned": uncordon,
        "kept_cordon": unschedulable(node) and not uncordon,
    }
    return patch, details


def operator_act(node: Obj, owner: str, entry: MarkEntry) -> str | None:
    """What an operator did to an applied mark (None: the marks are as we left them)."""
    if owner not in entries(node):
        return f"removed nodeward's {MARKS_ANNOTATION} entry of {owner} from"
    if entry.cordon and not unschedulable(node):
        return "uncordoned"
    present = {_taint_id(t) for t in taints_of(node)}
    gone = [t for t in entry.taints if t not in present]
    if gone:
        return f"removed taint {', '.join(gone)} from"
    return None


def reduced(entry: MarkEntry) -> MarkEntry:
    """An entry after an operator took the node back: no taint, no cordon, no annotation."""
    return entry.model_copy(update={"taints": [], "cordon": False, "annotations": []})


def respect_patch(node: Obj, owner: str, entry: MarkEntry) -> Obj | None:
    """Drop our taints, our annotations and our claim on the cordon; leave the cordon as is."""
    all_entries = entries(node)
    others = {o: e for o, e in all_entries.items() if o != owner}
    shared = {t for e in others.values() for t in e.taints}
    mine = set(entry.taints) - shared
    taints = taints_of(node)
    kept = [t for t in taints if _taint_id(t) not in mine]
    notes = _annotations(node)
    new_notes: dict[str, str | None] = {k: None for k in entry.annotations if k in notes}
    after = reduced(entry)
    if all_entries.get(owner) != after:
        all_entries[owner] = after
        new_notes[MARKS_ANNOTATION] = _encode(all_entries)
    patch: dict[str, Any] = {}
    if len(kept) != len(taints):
        patch["spec"] = {"taints": kept or None}
    if new_notes:
        patch["metadata"] = {"annotations": new_notes}
    return patch or None


def held(intent: MarkIntent) -> MarkEntry:
    """What the owner still holds: its entry, or less once an operator took the node back."""
    return reduced(intent.entry) if intent.operator_released else intent.entry


# the effectful part ----------------------------------------------------------------------
class NodeMarks:
    """One owner's marks on nodes; every KV and API write is a failpoint `marks.<step>`."""

    def __init__(
        self,
        cluster: Cluster,
        kv: KeyValue,
        owner: str,
        *,
        failpoints: Failpoints | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster = cluster
        self.store: TypedKV[MarkIntent] = TypedKV(kv, MarkIntent)
        self.owner = owner
        self.failpoints = failpoints if failpoints is not None else Failpoints.from_env()
        self.clock = clock
        self.log = structlog.get_logger().bind(owner=owner)

    def _fail(self, point: str) -> None:
        self.failpoints.hit(f"marks.{point}")

    async def intent(self, node: str) -> MarkIntent | None:
        current = await self.store.get(marks_key(node))
        return current.value if current else None

    async def _intend(
        self, act: str, node: str, incident: str, spec: MarkSpec, entry: MarkEntry, **rest: Any
    ) -> MarkIntent:
        """This owner's new intent for `node` (`rest`: its phase and what else it records),
        saved before the act (`<act>.intent`) begins."""
        intent = MarkIntent(
            owner=self.owner, node=node, incident=incident, spec=spec, entry=entry, **rest
        )
        return await self._save(intent, f"{act}.intent")

    async def _save(self, intent: MarkIntent, point: str) -> MarkIntent:
        intent = intent.model_copy(update={"updated_at": self.clock()})
        await self.store.put(marks_key(intent.node), intent)
        self._fail(point)
        return intent

    async def holds(self, node: str) -> bool:
        """True while this owner has (or is putting) marks on `node`."""
        intent = await self.intent(node)
        return intent is not None and intent.phase in ("applying", "applied")

    async def apply(
        self,
        node: str,
        incident: str,
        spec: MarkSpec,
        *,
        annotate: Callable[[MarkEntry], Mapping[str, str]] | None = None,
        obj: Obj | None = None,
    ) -> dict[str, Any]:
        """Put `spec` on `node` for `incident` (`put_on`); what the owner holds after."""
        return self.details(await self.put_on(node, incident, spec, annotate=annotate, obj=obj))

    async def put_on(
        self,
        node: str,
        incident: str,
        spec: MarkSpec,
        *,
        annotate: Callable[[MarkEntry], Mapping[str, str]] | None = None,
        obj: Obj | None = None,
        started_at: datetime | None = None,
        read: MarkIntent | Unread | None = UNREAD,
        settle: bool = True,
    ) -> MarkIntent:
        """Put `spec` on `node` for `incident`; idempotent, and finishes a cut-short attempt.

        An intent already `applying` is continued as recorded: its prior state was read
        before any change. An `applied` one of this incident is not written again (an
        operator's change since is theirs); a new incident supersedes it, keeping the
        prior state the older one recorded. `obj`: the node as the caller just read it,
        planned and patched from without another GET (a 409 reads it afresh).
        `started_at`: when the incident's trigger happened, kept in the intent. `read`:
        the intent as the caller read it just before (`intent`), not read again. Returns
        the intent as it now stands.

        `settle=False`: the marks are put on (PATCH, condition, Event) but the intent is
        left `applying`; the caller audits, then calls `settle`. The intent's `applied`
        is then no write before the audit: a restart in between finds `applying`, whose
        redo is a PATCH that finds every mark there (nothing sent), and audits again
        under the same id (stored once).
        """
        intent = await self.intent(node) if isinstance(read, Unread) else read
        if intent is not None and intent.phase == "releasing":
            await self._finish_release(intent)
            intent = None
        older = intent if intent is not None and intent.phase == "applied" else None
        if older is not None and older.incident == incident:
            return older
        if intent is None or intent.phase == "released" or older is not None:
            if obj is None:
                obj = await self.cluster.nodes.get(node)
            entry = plan(obj, self.owner, incident, spec)
            if older is not None:
                entry = supersede(older.entry, entry, operator_released=older.operator_released)
            if annotate is not None:
                # Annotations that say what was planned (a readable summary for kubectl).
                spec = spec.model_copy(
                    update={"annotations": {**spec.annotations, **annotate(entry)}}
                )
                notes = sorted({*entry.annotations, *spec.annotations})
                entry = entry.model_copy(update={"annotations": notes})
            intent = await self._intend(
                "apply", node, incident, spec, entry, phase="applying", started_at=started_at
            )
        if intent.phase == "applying":
            entry, recorded = intent.entry, intent.spec

            def build(obj: Obj) -> Obj | None:
                return apply_patch(obj, self.owner, entry, recorded)

            written, _ = await self.cluster.nodes.patch_from(node, build, current=obj)
            self._fail("apply.patched")
            await self._condition(node, recorded.condition, "apply.condition", current=written)
            if recorded.event is not None:
                await self._event(written, recorded.event, "apply.event")
            if settle:
                intent = await self.settle(intent)
        return intent

    async def settle(self, intent: MarkIntent) -> MarkIntent:
        """Record an intent whose marks are on (`put_on(settle=False)`) as `applied`: from
        now on a missing mark is an operator's act. Idempotent."""
        if intent.phase != "applying":
            return intent
        return await self._save(
            intent.model_copy(update={"phase": "applied", "event_recorded": True}), "apply.done"
        )

    async def adopt(
        self,
        node: str,
        incident: str,
        spec: MarkSpec,
        entry: MarkEntry,
        *,
        operator_released: bool = False,
    ) -> MarkIntent:
        """Take over marks put on before NodeMarks kept an intent (an upgrade): record them
        as `applied` and write this owner's entry on the node, adding no mark, so that
        they are released (and an operator's act noticed) like any other."""
        intent = await self._intend(
            "adopt",
            node,
            incident,
            spec,
            entry,
            phase="applied",
            operator_released=operator_released,
            event_recorded=True,
        )
        recorded = held(intent)

        def build(obj: Obj) -> Obj | None:
            all_entries = entries(obj)
            if all_entries.get(self.owner) == recorded:
                return None
            all_entries[self.owner] = recorded
            return {"metadata": {"annotations": {MARKS_ANNOTATION: _encode(all_entries)}}}

        await self.cluster.nodes.patch_from(node, build)
        self._fail("adopt.patched")
        return intent

    def details(self, intent: MarkIntent) -> dict[str, Any]:
        entry = held(intent)
        return {
            "owner": self.owner,
            "incident": intent.incident,
            "taints": entry.taints,
            "cordoned": entry.cordon and not entry.prior_unschedulable,
            "prior_unschedulable": entry.prior_unschedulable,
        }

    async def set_annotations(self, node: str, annotations: Mapping[str, str]) -> None:
        """Update the owner's own annotations while it holds the node (e.g. a summary)."""
        intent = await self.intent(node)
        if intent is None or intent.phase not in ("applying", "applied"):
            return
        spec = intent.spec.model_copy(
            update={"annotations": {**intent.spec.annotations, **annotations}}
        )
        await self._save(intent.model_copy(update={"spec": spec}), "annotate.intent")
        if intent.operator_released:
            return
        await self.cluster.nodes.set_annotations(node, dict(annotations))
        self._fail("annotate.patched")

    async def release(self, node: str, *, note: str | None = None) -> dict[str, Any] | None:
        """Take this owner's marks off `node`. None if it holds none (already released)."""
        intent = await self.intent(node)
        if intent is None or intent.phase == "released":
            return None
        if intent.phase != "releasing":
            spec = intent.spec
            if note is not None and spec.release_event is not None:
                event = spec.release_event.model_copy(update={"note": note})
                spec = spec.model_copy(update={"release_event": event})
            intent = await self._save(
                intent.model_copy(update={"phase": "releasing", "spec": spec}), "release.intent"
            )
        return await self._finish_release(intent)

    async def _finish_release(self, intent: MarkIntent) -> dict[str, Any]:
        node, entry, spec = intent.node, held(intent), intent.spec
        details: dict[str, Any] = {}

        def build(obj: Obj) -> Obj | None:
            patch, what = release_patch(obj, self.owner, entry, spec)
            details.update(what)
            return patch

        written, _ = await self.cluster.nodes.patch_from(node, build)
        self._fail("release.patched")
        await self._condition(node, spec.release_condition, "release.condition", current=written)
        if spec.release_event is not None:
            await self._event(written, spec.release_event, "release.event")
        await self._save(intent.model_copy(update={"phase": "released"}), "release.done")
        self.log.info("marks.released", node=node, incident=intent.incident, **details)
        return {"incident": intent.incident, **details}

    async def operator_act(self, node: str, obj: Obj) -> tuple[MarkIntent, str] | None:
        """An operator's change to our applied marks, not yet respected: (intent, what).

        Only an `applied` intent that nodeward has not started to release qualifies: a
        missing mark during `applying` or `releasing` is nodeward's own half-done step.
        """
        intent = await self.intent(node)
        if intent is None or intent.phase != "applied" or intent.operator_released:
            return None
        what = operator_act(obj, self.owner, intent.entry)
        return (intent, what) if what else None

    async def respect(self, node: str) -> dict[str, Any]:
        """The operator took the node back: drop our taints and cordon claim, keep the record
        (a later release still restores labels and condition). Idempotent."""
        intent = await self.intent(node)
        if intent is None or intent.phase != "applied":
            return {}
        if not intent.operator_released:
            intent = await self._save(
                intent.model_copy(update={"operator_released": True}), "respect.intent"
            )
        entry = intent.entry
        removed: list[str] = []

        def build(obj: Obj) -> Obj | None:
            removed[:] = [t for t in entry.taints if t in {_taint_id(x) for x in taints_of(obj)}]
            return respect_patch(obj, self.owner, entry)

        await self.cluster.nodes.patch_from(node, build)
        self._fail("respect.patched")
        return {"removed_taints": removed}

    async def _condition(
        self, node: str, condition: ConditionSpec | None, point: str, *, current: Obj | None = None
    ) -> None:
        if condition is None:
            return
        await self.cluster.nodes.set_condition(
            node,
            condition.type,
            condition.status,
            condition.reason,
            condition.message[:1024],
            current=current,
        )
        self._fail(point)

    async def _event(self, obj: Obj, event: EventSpec, point: str) -> None:
        await self.cluster.events.create(
            obj, reason=event.reason, action=event.action, note=event.note, type_=event.type
        )
        self._fail(point)
