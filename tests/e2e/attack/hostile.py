"""Hostile values and the gRPC requests built from them, as hypothesis strategies.

Every strategy mixes hand-picked hostile values (separators, escapes, control characters,
look-alikes of the victim tenant, sizes right at and past each limit) with random ones. No value
ever names the victim tenant, as the services resolve tenants (stripped, blank meaning the
default one): an attack that reaches the victim's data must do so through a bug, not by asking.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.message import Message
from hypothesis import strategies as st

from pml.v1 import common_pb2, ingest_pb2, knowledge_pb2, planner_pb2, scorer_pb2, search_pb2
from pml_common import input_rules

#: The tenant every attack must leave alone, registered before the attacks start.
VICTIM = "attack-victim"
#: Written in every description of the victim's catalog and nowhere else: a reply to another
#: tenant that carries it has read across tenants.
VICTIM_MARK = "vault-7f3a-secret"
VICTIM_TOOLS = ("vault:open", "vault:read_secret", "fs:read_file")
VICTIM_CAPABILITY = "vault-open-and-read"
VICTIM_DOCUMENT = "vault-manual"

#: Sizes at and past the limits of `pml_common.input_rules` and the services, and one past the
#: gRPC message limit (8 MiB), which only the transport refuses (RESOURCE_EXHAUSTED).
SIZES = (
    input_rules.MAX_EVENT_ID_CHARS + 1,
    input_rules.MAX_ID_CHARS,
    input_rules.MAX_ID_CHARS + 1,
    20_001,
    input_rules.MAX_INTENT_CHARS,
    input_rules.MAX_INTENT_CHARS + 1,
    9 * 1024 * 1024,
)
_CONTROLS = ("\x00", "\x01", "\x08", "\x1b", "\x7f", "\x85", "\x9f", "\u2028", "\u2029", "\n")
_SEPARATORS = (":", "::", "%", "%3A", "%25", "/", "\\", "..", "*", "$", "'", '"', "`", "{", "}")
_ODD_UNICODE = (
    "\u202eevil",  # right-to-left override
    "\u200b",  # zero-width space (not whitespace to str.strip)
    "\ufeff",  # byte-order mark
    "\u3000",  # ideographic space (whitespace to str.strip)
    "ﬁle",  # ligature that NFKC folds to "file"
    "İ",  # lower-cases to two code points
    "🙂",
    "ａｔｔａｃｋ",  # fullwidth
)
_INJECTIONS = (
    "' OR '1'='1",
    "MATCH (n) DETACH DELETE n",
    "$tenant",
    "{tenant_id: $tenant}",
    "*:*",
    "../../etc/passwd",
    "null",
    "default",
    "DEFAULT",
)
#: Near misses of the victim: each is another tenant (or refused), never the victim itself.
_VICTIM_LOOKALIKES = (
    VICTIM.upper(),
    VICTIM[:-1],
    VICTIM + "\x00",
    VICTIM + ":",
    VICTIM + "%3A",
    VICTIM + "*",
    VICTIM.replace("-", "\u2010"),  # hyphen look-alike
    VICTIM.replace("a", "ａ"),  # fullwidth a
    "\u200b" + VICTIM,
    f"{VICTIM}:x",
)

T = TypeVar("T")


def weighted(*choices: tuple[int, st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """One of `choices`, each `(weight, strategy)` drawn `weight` times as often as a weight 1
    (`st.one_of` counts a strategy passed twice only once)."""
    return st.sampled_from([s for n, s in choices for _ in range(n)]).flatmap(lambda s: s)


sane = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12)
_random_text = st.text(max_size=40)
oversized = st.sampled_from(SIZES).map(lambda n: "x" * n)
#: Stream entries have no transport limit; past every field's limit is enough for them.
oversized_for_events = st.sampled_from(SIZES[:-1]).map(lambda n: "x" * n)


def _resolved_tenant(value: str) -> str | None:
    """The tenant a request naming `value` acts on (None when refused)."""
    try:
        return input_rules.tenant(value) or "default"
    except input_rules.InputError:
        return None


def _glued(parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Two hostile parts with random text between: separators inside, not only alone."""
    return st.tuples(parts, _random_text, parts).map("".join)


_specials = st.sampled_from(("", " ", "\t", *_CONTROLS, *_SEPARATORS, *_ODD_UNICODE, *_INJECTIONS))


def tenants_with(big: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Hostile tenants, never the victim, with `big` for the oversized ones."""
    return st.one_of(
        _specials,
        st.sampled_from(_VICTIM_LOOKALIKES),
        _random_text,
        _glued(_specials),
        big,
    ).filter(lambda t: _resolved_tenant(t) != VICTIM)


def ids_with(big: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Hostile node ids (tool-shaped or not), the victim's own among them."""
    return st.one_of(
        st.sampled_from(
            (
                "",
                " ",
                ":",
                "a:",
                ":b",
                "a:b",
                " a:b",
                "a :b",
                "a: b",
                "a:b ",
                "a:b:c",
                "a::b",
                "a\u2028:b",
                "%3A:x",
                "a:" + "b" * (input_rules.MAX_ID_CHARS - 2),
                "a:" + "b" * (input_rules.MAX_ID_CHARS - 1),
                *VICTIM_TOOLS,
                VICTIM_CAPABILITY,
                VICTIM_DOCUMENT,
                VICTIM_TOOLS[0] + "\x00",
                " " + VICTIM_CAPABILITY,
                VICTIM_CAPABILITY + "\u3000",
            )
        ),
        st.tuples(st.one_of(sane, _specials), st.one_of(sane, _specials)).map(":".join),
        _specials,
        _random_text,
        big,
    )


def texts_with(big: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Queries, intents, names, descriptions."""
    return st.one_of(
        st.sampled_from(("", " ", "\n\t", "read a file", "open the vault", "🙂" * 50)),
        _specials,
        _random_text,
        big,
    )


tenants = tenants_with(oversized)
ids = ids_with(oversized)
texts = texts_with(oversized)


# --- JSON --------------------------------------------------------------------------------------

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

#: Nesting depths around `MAX_SCHEMA_DEPTH`, around pydantic's and the JSON decoders' own
#: limits, and far past them.
DEPTHS = (
    input_rules.MAX_SCHEMA_DEPTH,
    input_rules.MAX_SCHEMA_DEPTH + 1,
    199,
    256,
    1_000,
    100_000,
)


def nested_json(depth: int, kind: str) -> str:
    """`depth` nested objects (`{"a":{"a":…}}`) or arrays, as text."""
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


nested = st.builds(nested_json, st.sampled_from(DEPTHS), st.sampled_from(("object", "array")))

schemas_json: st.SearchStrategy[str] = st.one_of(
    st.just(""),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(json.dumps),
    json_values.map(json.dumps),  # arrays, scalars: not objects
    nested,
    st.sampled_from(('{"a":', "NaN", "{'a': 1}", '{"type": "object"}')),
    st.just('{"d": "' + "x" * 100_001 + '"}'),
    _random_text,
)


# --- requests ----------------------------------------------------------------------------------

#: Tenants the attacks share, so reads meet what writes stored ("" is the default tenant).
ATTACKERS = ("attack-a", "attack-b", "")
_int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_queries = st.sampled_from(("read a file", "open the vault", "list the folder then write"))
_known_tools = st.sampled_from(("a:b", "fs:read_file", "vault:open", "x-1:y_2"))


def _tool(id_: str, server: str, name: str, description: str, schema: str) -> common_pb2.Tool:
    return common_pb2.Tool(
        id=id_, server=server, name=name, description=description, input_schema_json=schema
    )


_well_formed_tool = st.builds(
    lambda server, name, description, schema: _tool(
        f"{server}:{name}", server, name, description, schema
    ),
    sane,
    sane,
    st.one_of(_random_text, _queries),
    st.sampled_from(("", '{"type": "object", "properties": {"path": {}}}')),
)
_hostile_tool = st.builds(_tool, ids, st.one_of(st.just(""), ids), texts, texts, schemas_json)


def _capability(
    id_: str, name: str, description: str, members: list[str], children: list[str]
) -> common_pb2.Capability:
    return common_pb2.Capability(
        id=id_, name=name, description=description, tools=members, capabilities=children
    )


_well_formed_capability = st.builds(
    _capability, sane, sane, _queries, st.lists(_known_tools, max_size=3), st.just([])
)
_hostile_capability = st.builds(
    _capability,
    st.one_of(sane, ids),
    st.one_of(sane, texts),
    texts,
    st.lists(st.one_of(ids, _known_tools), max_size=4),
    st.lists(st.one_of(sane, ids), max_size=3),
)

#: A request field as (usual values, hostile values).
Field = tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]

TENANT: Field = (st.sampled_from(ATTACKERS), tenants)
TEXT: Field = (_queries, texts)
COUNT: Field = (st.integers(0, 20), st.one_of(st.sampled_from((100, 101, 1000, -1)), _int32))
ID: Field = (_known_tools, ids)
CONTEXT: Field = (
    st.lists(_known_tools, max_size=2),
    st.lists(st.one_of(ids, _known_tools), max_size=5),
)
METHOD: Field = (
    st.just(""),
    st.one_of(
        st.sampled_from(("drdsp", "legacy", "discovery", "search", "graph-first", "vector")),
        texts,
    ),
)
TOOLS: Field = (
    st.lists(_well_formed_tool, min_size=1, max_size=3),
    st.lists(st.one_of(_well_formed_tool, _hostile_tool), max_size=4),
)
CAPABILITIES: Field = (
    st.lists(_well_formed_capability, min_size=1, max_size=2),
    st.lists(st.one_of(_well_formed_capability, _hostile_capability), max_size=3),
)

#: A request is (method path, message); the path names its service.
Request = tuple[str, Message]


def _request(
    rpc: str, build: Callable[..., Message], /, **fields: Field
) -> st.SearchStrategy[Request]:
    """Requests for `rpc`: usual values but one hostile field (twice as often, so attacks get
    past the first check), or hostile values in every field."""
    usual = {name: field[0] for name, field in fields.items()}
    hostile = {name: field[1] for name, field in fields.items()}
    one_bad = st.sampled_from(sorted(fields)).flatmap(
        lambda name: st.builds(build, **{**usual, name: hostile[name]})
    )
    return weighted((2, one_bad), (1, st.builds(build, **hostile))).map(lambda m: (rpc, m))


_SEARCH = "/pml.v1.SearchService/"
search_reads: st.SearchStrategy[Request] = st.one_of(
    _request(
        _SEARCH + "Search",
        search_pb2.SearchRequest,
        tenant_id=TENANT,
        query=TEXT,
        limit=COUNT,
        kinds=(
            st.sampled_from(([], [1], [2], [1, 2])),
            st.lists(st.one_of(st.sampled_from((0, 3)), _int32), max_size=4),
        ),
        min_semantic_score=(st.sampled_from((0.0, 0.5)), st.floats(width=64)),  # NaN, inf
        retriever=(st.sampled_from(("", "hybrid", "dense", "lexical")), texts),
    ),
    _request(
        _SEARCH + "SearchTools",
        search_pb2.SearchToolsRequest,
        tenant_id=TENANT,
        query=TEXT,
        limit=COUNT,
        context_tools=CONTEXT,
        include_related=(st.booleans(), st.booleans()),
    ),
    _request(_SEARCH + "GetNode", search_pb2.GetNodeRequest, tenant_id=TENANT, id=ID),
)

_documents: Field = (
    # Two documents, each always the same: submitted again once ingested, it is skipped
    # (which keeps the ingestion workers' load, and the suite's time, bounded).
    st.sampled_from(
        (
            [ingest_pb2.Document(id="vault-notes", text="# Vault\n\nThe vault opens with a key.")],
            [ingest_pb2.Document(id="plain", text="plain words", format="text")],
        )
    ),
    st.lists(
        st.builds(
            ingest_pb2.Document,
            id=st.one_of(sane, ids),
            title=texts,
            text=texts,
            format=st.one_of(st.sampled_from(("", "markdown", "text", "MARKDOWN", "pdf")), texts),
        ),
        max_size=3,
    ),
)
_INGEST = "/pml.v1.IngestService/"

writes: st.SearchStrategy[Request] = st.one_of(
    _request(
        _SEARCH + "RegisterTools", search_pb2.RegisterToolsRequest, tenant_id=TENANT, tools=TOOLS
    ),
    _request(
        _SEARCH + "RegisterCapabilities",
        search_pb2.RegisterCapabilitiesRequest,
        tenant_id=TENANT,
        capabilities=CAPABILITIES,
    ),
    _request(
        _SEARCH + "DeleteTenant",
        search_pb2.DeleteTenantRequest,
        tenant_id=(st.sampled_from(ATTACKERS[:2]), tenants),
    ),
    _request(_INGEST + "Submit", ingest_pb2.SubmitRequest, tenant_id=TENANT, documents=_documents),
    _request(
        _INGEST + "DeleteDocument",
        ingest_pb2.DeleteDocumentRequest,
        tenant_id=TENANT,
        document_id=(sane, st.one_of(ids, texts)),
    ),
)

#: Lengths around the embedders' dimensions (384 and 512) and elsewhere.
_EMBEDDING_SIZES = (0, 1, 383, 384, 385, 511, 512, 513)
_embeddings = st.sampled_from(_EMBEDDING_SIZES).flatmap(
    lambda n: st.one_of(
        st.lists(st.floats(-1, 1, width=32), min_size=n, max_size=n),
        st.lists(st.floats(width=32), min_size=n, max_size=n),  # NaN, infinities
        st.just([0.0] * n),
    )
)


def _score_request(
    tenant: str, text: str | None, values: list[float] | None, top_k: int, level: int | None
) -> scorer_pb2.ScoreRequest:
    """A ScoreRequest with its intent as text, else as an embedding, else none at all."""
    request = scorer_pb2.ScoreRequest(tenant_id=tenant, top_k=top_k)
    if text is not None:
        request.text = text
    elif values is not None:
        request.embedding.values.extend(values)
    if level is not None:
        request.level = level
    return request


_SCORE: dict[str, Field] = {
    "tenant": TENANT,
    "text": (_queries, st.one_of(st.none(), texts)),
    "values": (st.none(), _embeddings),
    "top_k": COUNT,
    "level": (st.none(), st.one_of(st.sampled_from((0, 1, 100, 101, -1)), _int32)),
}
_SCORER = "/pml.v1.ScorerService/"
_PLANNER = "/pml.v1.PlannerService/"
other_services: st.SearchStrategy[Request] = st.one_of(
    _request(
        "/pml.v1.KnowledgeService/Ask",
        knowledge_pb2.AskRequest,
        tenant_id=TENANT,
        question=TEXT,
        k=COUNT,
        method=METHOD,
    ),
    _request(_SCORER + "ScoreTools", _score_request, **_SCORE),
    _request(_SCORER + "ScoreCapabilities", _score_request, **_SCORE),
    _request(
        _SCORER + "TopByLevel", scorer_pb2.TopByLevelRequest, tenant_id=TENANT, intent=TEXT, k=COUNT
    ),
    _request(
        _SCORER + "PredictPathSuccess",
        scorer_pb2.PredictPathSuccessRequest,
        tenant_id=TENANT,
        intent=TEXT,
        path=CONTEXT,
    ),
    _request(_SCORER + "ModelInfo", scorer_pb2.ModelInfoRequest, tenant_id=TENANT),
    _request(
        _PLANNER + "PredictNext",
        planner_pb2.PredictNextRequest,
        tenant_id=TENANT,
        intent=TEXT,
        context_tools=CONTEXT,
        method=METHOD,
    ),
    _request(
        _INGEST + "GetStatus",
        ingest_pb2.GetStatusRequest,
        tenant_id=TENANT,
        document_ids=(st.lists(sane, max_size=2), st.lists(st.one_of(ids, texts), max_size=4)),
    ),
    _request(
        _PLANNER + "SuggestDag",
        planner_pb2.SuggestDagRequest,
        tenant_id=TENANT,
        intent=TEXT,
        method=METHOD,
    ),
    _request(_PLANNER + "PlannerInfo", planner_pb2.PlannerInfoRequest, tenant_id=TENANT),
)
