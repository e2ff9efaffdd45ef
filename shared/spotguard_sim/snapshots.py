"""Lists at a resourceVersion: ``resourceVersionMatch`` as kube-apiserver reads it.

https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-get-and-list
- ``resourceVersionMatch`` needs a ``resourceVersion`` (400 otherwise), is not
  allowed with ``continue`` (400), and ``Exact`` is not allowed with ``"0"`` (400);
- ``NotOlderThan``: at least that fresh; a resourceVersion the store has not reached
  is "Too large resource version" (504 Timeout, as the apiserver answers after
  waiting for it);
- ``Exact``: the collection as it was at that resourceVersion, rebuilt from the
  store's watch history (undoing the later changes); older than the history is
  410 Gone ("The resourceVersion for the provided list is too old"), as upstream
  answers for a compacted revision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotguard_sim import errors, selectors

if TYPE_CHECKING:
    from spotguard_sim.store import Entry, Store

MATCHES = ("Exact", "NotOlderThan")


def check(query: dict[str, str], current: int) -> tuple[str, int] | None:
    """Validate the list's resourceVersion parameters; (match, rv) for an Exact list."""
    match = query.get("resourceVersionMatch")
    rv_text = query.get("resourceVersion")
    if not match:
        return None
    if match not in MATCHES:
        raise errors.BadRequest(f'resourceVersionMatch: Unsupported value: "{match}": supported '
                                'values: "Exact", "NotOlderThan"')
    if not rv_text:
        raise errors.BadRequest("resourceVersionMatch is forbidden unless resourceVersion is provided")
    if query.get("continue"):
        raise errors.BadRequest("resourceVersionMatch is forbidden when continue is provided")
    if match == "Exact" and rv_text == "0":
        raise errors.BadRequest('resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
    try:
        rv = int(rv_text)
    except ValueError:
        raise errors.BadRequest(f"invalid resource version {rv_text!r}") from None
    if rv > current:
        # apiserver pkg/storage/errors.go NewTooLargeResourceVersionError
        raise errors.timeout(f"Too large resource version: {rv}, current: {current}", 1,
                             causes=[{"reason": "ResourceVersionTooLarge",
                                      "message": "Too large resource version"}])
    return (match, rv) if match == "Exact" and rv < current else None


def entries_at(store: Store, resource: str, namespace: str | None, *, label_selector: str | None,
               field_selector: str | None, rv: int) -> list[Entry]:
    """The matching entries as they were at ``rv``, in (namespace, name) order."""
    predicate = selectors.object_filter(label_selector, field_selector, resource)
    with store.lock:
        history = store._history
        oldest = history[0].rv if history else store._rv + 1
        if rv < oldest - 1:
            raise errors.Gone("The resourceVersion for the provided list is too old.")
        store.check_not_compacted(rv, "The resourceVersion for the provided list is too old.")
        state: dict[tuple[str, str], Any] = {
            (e.obj["metadata"].get("namespace") or "", e.obj["metadata"]["name"]): e
            for e in store._select(resource, namespace, None, None)
        }
        for event in reversed(history):
            if event.rv <= rv:
                break
            if event.resource != resource or (namespace and event.namespace != namespace):
                continue
            key = (event.namespace, event.entry.obj["metadata"]["name"])
            if event.type == "ADDED":
                state.pop(key, None)
            elif event.old is not None:
                state[key] = event.old
            else:
                state.pop(key, None)
    found = [state[k] for k in sorted(state)]
    return [e for e in found if predicate is None or predicate(e.obj)]
