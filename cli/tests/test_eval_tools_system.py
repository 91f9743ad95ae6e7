"""`pml eval tools` against real pieces: the search service as a process on the suite's Redis
and Neo4j (a query it refuses is reported and the run goes on; a long query is cut to the
client's limit), the baselines with the system's embedder, and the trainer's rejected
candidate read from a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path

import redis.asyncio as aioredis
from rich.console import Console

from pml_cli import client
from pml_cli.catalog_files import load_catalog
from pml_cli.eval_data import QuerySelection
from pml_cli.eval_folds import covered, evaluate_folds, wait_for_model
from pml_cli.eval_tools import eval_tenant, evaluate_tools
from pml_common.model_registry import ModelRegistry
from pml_common.settings import Settings
from pml_common.testing import service_process

QUIET = Console(file=io.StringIO())

CATALOG = [
    ("fs", "read_file", "Read the contents of a file from disk."),
    ("fs", "write_file", "Write text to a file on disk."),
    ("git", "commit", "Record staged changes in the repository with a message."),
    ("web", "fetch", "Download a web page by URL."),
]


def write_set(folder: Path, queries: list[dict[str, object]]) -> Path:
    folder.mkdir()
    (folder / "catalog.jsonl").write_text(
        "".join(
            json.dumps({"id": f"{s}:{n}", "server": s, "name": n, "description": d}) + "\n"
            for s, n, d in CATALOG
        )
    )
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    return folder


def test_a_refused_query_is_reported_and_a_long_one_cut(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    data = write_set(
        tmp_path / "set",
        [
            {"id": "L1-1", "query": "read a file from disk", "relevant": ["fs:read_file"]},
            {"id": "L1-2", "query": "   ", "relevant": ["fs:read_file"]},
            {"id": "L2-1", "query": "commit my changes " + "now " * 50, "relevant": ["git:commit"]},
        ],
    )
    per_query = tmp_path / "per-query.jsonl"
    log = tmp_path / "search.log"
    with service_process("pml_search", "PML_SEARCH_PORT", settings_env, log) as search:
        client_side = settings.model_copy(
            update={"search_addr": search.address, "max_query_chars": 60}
        )
        result = evaluate_tools(
            client_side, data, "cosine,unified", QuerySelection(), QUIET, per_query
        )
    assert result["queries"] == 3 and result["truncated"] == 1 and result["split"] is None
    for method in ("cosine", "unified"):
        block = result["methods"][method]
        assert block["queries"] == 3, block  # the refused query counts, as a miss
        assert block["failed"] == 1
        assert block["errors"][0].startswith("L1-2: INVALID_ARGUMENT")
        assert set(block["by_group"]) == {"L1", "L2"}
        assert block["by_group"]["L1"]["queries"] == 2
    lines = [json.loads(line) for line in per_query.read_text().splitlines()]
    assert [(x["method"], x["id"]) for x in lines] == [
        (m, i) for m in ("cosine", "unified") for i in ("L1-1", "L1-2", "L2-1")
    ]
    by_id = {x["id"]: x for x in lines if x["method"] == "cosine"}
    assert by_id["L1-2"]["ranked"] == [] and by_id["L1-2"]["error"].startswith("INVALID_ARGUMENT")
    assert len(by_id["L2-1"]["query"]) == 60 and by_id["L2-1"]["error"] is None
    assert "git:commit" in by_id["L2-1"]["ranked"]
    assert by_id["L1-1"]["ranked"][0] == "fs:read_file"


def test_an_evaluation_tenant_is_deleted_on_failure_and_left_on_interruption(
    settings: Settings, settings_env: dict[str, str], tmp_path: Path
) -> None:
    """An interrupted run must not wait on a deletion that waits on search (a large catalog
    still registering held a bench for minutes): its tenant is left, and named."""
    tools = load_catalog(write_set(tmp_path / "set", []) / "catalog.jsonl")
    output = io.StringIO()
    console = Console(file=output)
    with service_process("pml_search", "PML_SEARCH_PORT", settings_env, tmp_path / "s.log") as s:
        live = settings.model_copy(update={"search_addr": s.address})
        tenants = {}
        for ending in (RuntimeError, KeyboardInterrupt):
            with contextlib.suppress(ending), eval_tenant(live, tools, console) as tenant:
                tenants[ending] = tenant
                assert _tools_found(live, tenant) > 0
                raise ending("the run ends here")
        assert _tools_found(live, tenants[RuntimeError]) == 0
        assert _tools_found(live, tenants[KeyboardInterrupt]) > 0
    assert f"tenants left undeleted: {tenants[KeyboardInterrupt]}" in output.getvalue()


def _tools_found(settings: Settings, tenant: str) -> int:
    return len(client.search(settings, tenant, "read a file from disk", 5, None))


def test_baselines_need_no_service_and_the_split_shows_what_memory_answers(
    tmp_path: Path,
) -> None:
    tasks = [
        (["fs:read_file", "git:commit"], "read the notes then commit them"),
        (["web:fetch", "fs:write_file"], "download the page and save it"),
        (["fs:read_file", "web:fetch"], "open the list of links and fetch each"),
    ]
    queries: list[dict[str, object]] = [
        {"id": f"multi-{t}{p}", "query": f"{text} ({p})", "relevant": tools}
        for t, (tools, text) in enumerate(tasks)
        for p in range(4)
    ]
    data = write_set(tmp_path / "set", queries)
    # No search service at this address: baselines alone must not need one.
    nowhere = Settings(search_addr="127.0.0.1:9", scorer_addr="127.0.0.1:9")
    results = {
        split: evaluate_folds(
            nowhere,
            data,
            "knn,popular",
            3,
            QuerySelection(min_relevant=2),
            QUIET,
            split,
            0,
            tmp_path / f"{split}.jsonl",
        )
        for split in ("query", "workflow")
    }
    assert results["workflow"]["test_gold_seen"] == 0
    assert results["query"]["test_gold_seen"] == 12  # every paraphrase has 3 in training
    for result in results.values():
        assert result["trainer_seed"] is None  # no system started, none seeded
        assert set(result["methods"]) == {"knn", "popular"}
        assert result["methods"]["knn"]["by_group"]["multi"]["queries"] == 12
        lines = (tmp_path / f"{result['split']}.jsonl").read_text().splitlines()
        assert len(lines) == 24
    # Past paraphrases of the same task name its tools: knn remembers them under the query
    # split, and beats popularity there; under the workflow split there is nothing to remember.
    memory, unseen = results["query"]["methods"], results["workflow"]["methods"]
    assert memory["knn"]["ndcg@5"] > 0.9 > unseen["knn"]["ndcg@5"]
    assert memory["knn"]["ndcg@5"] > memory["popular"]["ndcg@5"]


def test_the_trainers_rejected_candidate_is_read_through_model_info(
    settings: Settings, settings_env: dict[str, str], tenant: str, tmp_path: Path
) -> None:
    """A fold whose last candidate the gate turned down ends on it: read from `ModelInfo`,
    with the figures the gate judged it on."""
    figures = {
        "traces_seen": 7.0,
        "holdout_size": 2.0,
        "holdout_candidate_mrr": 2 / 3,
        "holdout_cross_fitted_recall_at_5": 0.25,
    }
    asyncio.run(_reject(settings, tenant, figures))
    with service_process("pml_scorer", "PML_SCORER_PORT", settings_env, tmp_path / "s.log") as s:
        live = settings.model_copy(update={"scorer_addr": s.address})
        # 7 executions learned from and 2 held back to judge it: it accounts for 9.
        ended = wait_for_model(live, tenant, 9)
    assert (ended.admitted, ended.complete) == (False, True)
    # the report keeps what the gate judged it on, rounded
    assert ended.rejected["holdout_candidate_mrr"] == 0.6667
    assert ended.rejected["holdout_cross_fitted_recall_at_5"] == 0.25
    assert covered(ended.rejected) == 9.0
    assert covered({"traces_seen": 4.0}) == 4.0  # a trainer that holds nothing back


async def _reject(settings: Settings, tenant: str, figures: dict[str, float]) -> None:
    redis = aioredis.from_url(settings.redis_url)
    try:
        fence = f"test:fence:{tenant}"
        token = int(await redis.incr(fence))
        registry = ModelRegistry(redis, fencing_key=fence)
        await registry.reject(tenant, b"model", token, {**figures, "accepted": 0.0})
    finally:
        await redis.aclose()
