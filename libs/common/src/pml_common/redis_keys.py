"""Every Redis key PML builds: one function per key family, one way of joining parts.

A key is `pml:<family>:<part>:<part>…`. Parts come from outside (tenant ids, document ids,
event ids may hold any character but controls, `:` included), so each part is escaped before it
is joined: `%` becomes `%25` and `:` becomes `%3A`. No escaped part holds a `:`, so a key splits
back into exactly its parts, and tenant `a:x` with document `y` can never share a key with
tenant `a` and document `x:y`. Parts without `%` or `:` are unchanged, so the keys of such
tenants are the ones earlier versions wrote.

Stream names are not here: they are constants of `pml_common.events.Streams`.
`tests/static/test_redis_keys.py` fails when a `pml:` key is spelled anywhere else.
"""

from __future__ import annotations

_ROOT = "pml"


def escape(part: str) -> str:
    """`part` without `:` (and so without ambiguity once joined); reversible."""
    return part.replace("%", "%25").replace(":", "%3A")


def unescape(part: str) -> str:
    return part.replace("%3A", ":").replace("%25", "%")


def key(family: str, *parts: str) -> str:
    """`pml:<family>:<escaped part>…`; `family` is a constant of this module's callers here."""
    return ":".join((_ROOT, family, *(escape(p) for p in parts)))


def parts_of(value: str, family: str) -> list[str]:
    """The parts `key(family, *parts)` was built from."""
    prefix = f"{_ROOT}:{family}:"
    if not value.startswith(prefix):
        raise ValueError(f"{value!r} is not a key of family {family!r}")
    return [unescape(p) for p in value[len(prefix) :].split(":")]


# --- the families --------------------------------------------------------------------------


def dedupe(group: str, tenant: str, event_id: str) -> str:
    """Marks an event a consumer group has handled. Ids are unique per tenant only: two tenants
    may send the same `event_id`, and neither must be taken for a repeat of the other."""
    return key("dedupe", group, tenant, event_id)


def ingest_status(tenant: str, document: str) -> str:
    """The passes' state of one document (ingest)."""
    return key("ingest:status", tenant, document)


def ingest_documents(tenant: str) -> str:
    """The ids of a tenant's documents that have a status (ingest)."""
    return key("ingest:documents", tenant)


def latest_document(scope: str, tenant: str, document: str) -> str:
    """When the latest applied request about a document was made (`pml_common.latest_wins`)."""
    return key("latest", scope, "document", tenant, document)


def latest_tenant(scope: str, tenant: str) -> str:
    """When the latest applied deletion of a tenant was made (`pml_common.latest_wins`)."""
    return key("latest", scope, "tenant", tenant)


def planner_suggestions(tenant: str) -> str:
    """Suggestions the planner made, waiting for their outcome (planner)."""
    return key("planner:suggestions", tenant)


def planner_thresholds(tenant: str) -> str:
    """A tenant's adaptive thresholds (planner)."""
    return key("planner:thresholds", tenant)


def planner_prequential(tenant: str) -> str:
    """A tenant's prequential figures of each planning method (planner): sums and counts."""
    return key("planner:prequential", tenant)


def planner_runs(tenant: str) -> str:
    """Digests of the sets of tools a tenant's executions ran, as the planner judged them."""
    return key("planner:runs", tenant)


def planner_judged(tenant: str) -> str:
    """What the executions the planner judged taught, in the order judged: the graph its
    prequential judge plans with (planner, `pml_planner.judged_graph`)."""
    return key("planner:judged", tenant)


def embedding(model: str, kind: str, digest: str) -> str:
    """A cached vector: `kind` is `q` (query) or `p` (passage), `digest` the text's sha256.

    No tenant and no outside text: the model name comes from the configuration and the other
    two parts have fixed shapes, so the parts are joined as they are (the model name holds `:`,
    and escaping it would orphan every vector already cached).
    """
    return ":".join((_ROOT, "emb", model, kind, digest))


def model(tenant: str, part: str) -> str:
    """One of a tenant's model registry keys: `seq`, `current`, `versions`, `records`, `blobs`,
    `rejected` (`pml_common.model_registry`)."""
    return key("model", tenant, part)


def prequential(tenant: str, part: str) -> str:
    """One of a tenant's prequential evaluation keys: `window`, `figures`, `totals`."""
    return key("prequential", tenant, part)


def replay(tenant: str, part: str) -> str:
    """One of a tenant's replay buffer keys: `traces`, `priorities`, `order`, `steps` (trainer)."""
    return key("replay", tenant, part)


def holdout(tenant: str, part: str) -> str:
    """One of a tenant's held-out trace keys: `traces`, `order` (trainer)."""
    return key("holdout", tenant, part)


def replica_groups(stream: str) -> str:
    """The consumer groups of one stream that belong to a single replica (field: group, value:
    when it was created, ms), which `pml_common.stream_retention` removes once the replica is
    gone."""
    return key("bus", "replica-groups", stream)


# Keys of no tenant: hashes whose fields are tenant ids, and the trainer's lock.
#: Executions added to each tenant's replay buffer (field: tenant).
REPLAY_ADDED = key("replay", "added")
#: Executions each tenant's model was trained up to (field: tenant).
REPLAY_TRAINED = key("replay", "trained")
#: Executions routed per tenant by the holdout split (field: tenant).
HOLDOUT_SEEN = key("holdout", "seen")
#: The trainer's lease lock, and the counter its fencing tokens come from.
TRAINER_LOCK = key("trainer", "lock")
TRAINER_FENCING = key("trainer", "fencing")
