"""The `pml` command: run the system, load catalogs, search, publish events, evaluate, benchmark."""

# A command imports what it uses when it runs, not here: `pml --help` and `pml search` would
# otherwise pay for the stores' drivers, the event bus and the evaluation code (seconds).
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from pml_common.settings import Settings

if TYPE_CHECKING:
    import grpc  # type: ignore[import-untyped, unused-ignore]

    from pml_cli.local_stack import LocalStack
    from pml_cli.run_record import RunRecord

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
catalog_app = typer.Typer(no_args_is_help=True, help="Manage the tool catalog.")
publish_app = typer.Typer(no_args_is_help=True, help="Publish events as an executor would.")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate on a data set in the exchange format.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks printing JSON.")
config_app = typer.Typer(no_args_is_help=True, help="Configuration reference.")
plan_app = typer.Typer(no_args_is_help=True, help="Next steps and workflows from the planner.")
app.add_typer(catalog_app, name="catalog")
app.add_typer(publish_app, name="publish")
app.add_typer(eval_app, name="eval")
app.add_typer(bench_app, name="bench")
app.add_typer(config_app, name="config")
app.add_typer(plan_app, name="plan")

err = Console(stderr=True)
out = Console()

DEMO_CATALOG = Path(__file__).parent / "demo" / "catalog.jsonl"
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="Tenant (default: settings).")]
PLAN_METHOD_HELP = (
    "drdsp | legacy | discovery | search | blend; none: the tenant's best by its prequential "
    "figures (pml plan info), DR-DSP until they are enough"
)
IdPrefixOption = Annotated[
    str,
    typer.Option(
        help="Keep queries whose id starts with one of these comma-separated prefixes "
        "(e.g. etom-L3,etom-L4)."
    ),
]


def _emit(result: dict[str, Any], as_json: bool) -> None:
    """A command's result: one JSON object on stdout, or aligned `key: value` lines."""
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    width = max((len(k) for k in result), default=0)
    for key, value in result.items():
        out.print(f"{key:>{width}}: {value}")


#: Errors a user causes with bad input or settings, by module: reported as a message. Looked up
#: only among modules already imported, since an error of a module nobody imported cannot occur.
USER_ERRORS = (
    ("pml_cli.eval_data", "EvalError", ""),
    ("pml_cli.catalog_files", "CatalogFileError", ""),
    ("pml_cli.execution_files", "ExecutionFileError", ""),
    ("pml_cli.ingest_files", "IngestFileError", ""),
    ("pml_common.grpc_security", "SecurityConfigError", "security settings: "),
)


@contextmanager
def _reported() -> Iterator[None]:
    """The failures a user can cause or meet: a message and an exit code, not a traceback."""
    try:
        yield
    except Exception as exc:
        grpc_module = sys.modules.get("grpc")
        if grpc_module is not None and isinstance(exc, grpc_module.RpcError):
            rpc_failure(exc)
        for module_name, class_name, prefix in USER_ERRORS:
            module = sys.modules.get(module_name)
            if module is not None and isinstance(exc, getattr(module, class_name)):
                fail(f"{prefix}{exc}")
        raise


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def rpc_failure(exc: grpc.RpcError) -> NoReturn:
    import grpc  # type: ignore[import-untyped, unused-ignore]

    code = exc.code()
    detail = exc.details()
    if code == grpc.StatusCode.UNAVAILABLE:
        fail(f"the service is unavailable: {detail}; is `make run` running?", 3)
    fail(f"{code.name}: {detail}", 2)


#: Commands that make one call and print: their logs need no tracing ids, and the tracing
#: SDK that `configure_logging` imports would be a good part of their start-up.
QUICK_COMMANDS = ("search", "plan", "ask", "config")


@app.callback()
def _quiet_logs(ctx: typer.Context) -> None:
    """Library logs go to stderr, warnings and up, so command output stays clean."""
    if ctx.invoked_subcommand in QUICK_COMMANDS:
        import logging

        import structlog

        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )
        return
    from pml_common.telemetry import configure_logging

    configure_logging("pml-cli", Settings(log_level="WARNING", log_format="console"))


@app.command()
def run(
    state_dir: Annotated[
        Path, typer.Option(help="Where data and logs go.", envvar="PML_RUN_STATE_DIR")
    ] = Path(".pml"),
    demo: Annotated[bool, typer.Option(help="Load the demo catalog.")] = True,
) -> None:
    """Start Redis, Neo4j and every service on loopback; Ctrl-C stops them all."""
    from pml_cli.local_stack import LocalStack, interrupt_on_signals
    from pml_cli.run_record import RunRecord
    from pml_common.local_runtime import LocalRuntimeError

    state_dir = state_dir.resolve()
    settings = Settings()
    if "PML_QDRANT_PATH" not in os.environ:  # the vector store lives with the other state
        settings = settings.model_copy(update={"qdrant_path": str(state_dir / "qdrant")})
    record = RunRecord(state_dir)
    _clear_previous_run(record, state_dir)
    stack = LocalStack(state_dir, settings, on_start=lambda p: record.add(p.name, p.pid, p.url))
    interrupts = interrupt_on_signals()
    record.begin()
    try:
        with err.status("starting Redis and Neo4j…"):
            stack.start_stores()
        with err.status("starting services…"):
            stack.start_services()
        if demo:
            from pml_cli import client
            from pml_cli.catalog_files import load_catalog

            tools = load_catalog(DEMO_CATALOG)
            with err.status(f"loading the demo catalog ({len(tools)} tools)…"):
                client.register_tools(settings, settings.default_tenant, tools)
        _print_welcome(settings, stack)
        while all(p.alive() for p in stack.processes):
            time.sleep(1.0)
        dead = [p.name for p in stack.processes if not p.alive()]
        fail(f"{', '.join(dead)} stopped unexpectedly; see {state_dir}/logs/")
    except LocalRuntimeError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        err.print("stopping… (Ctrl-C again to kill instead of waiting)")
    finally:
        interrupts.stop_now()
        stack.stop(interrupts.hurry)
        record.end()
        if interrupts.hurry():
            err.print("stopped: what had not stopped in time was killed")


def _clear_previous_run(record: RunRecord, state_dir: Path) -> None:
    """A run still going on this state folder: say so and stop; children a killed run left:
    stop them, so they do not hold the ports this run needs."""
    from pml_cli.run_record import stop_leftovers

    previous = record.previous()
    if previous.owner is not None:
        fail(
            f"PML is already running from {state_dir} (pid {previous.owner.pid}): "
            f"stop it with Ctrl-C in its terminal, or `kill {previous.owner.pid}`"
        )
    if previous.children:
        names = ", ".join(f"{c.name} (pid {c.pid})" for c in previous.children)
        err.print(f"a previous run ended without stopping; stopping what it left: {names}")
        with err.status("stopping the previous run's processes…"):
            stop_leftovers(previous.children)


def _print_welcome(settings: Settings, stack: LocalStack) -> None:
    """The addresses and logs, and commands that work as printed: in this shell or a new one,
    from this folder (uv need not be on the PATH), with the settings this run was given."""
    out.print("[bold green]PML is running.[/]")
    for proc in stack.processes:
        out.print(f"  {proc.name:<16} {proc.url}   log: {proc.log_path}", soft_wrap=True)
    out.print("\nTry, from this folder:")
    for command in welcome_commands(settings):
        out.print(f"  {command}", soft_wrap=True, markup=False, highlight=False)
    out.print("Ctrl-C stops everything.")


#: Settings a client command needs; printed with the commands when this run changed them.
CLIENT_SETTINGS = ("PML_SEARCH_ADDR", "PML_PLANNER_ADDR", "PML_REDIS_URL", "PML_DEFAULT_TENANT")


def welcome_commands(settings: Settings) -> list[str]:
    """The commands `pml run` suggests, each runnable as printed by a shell in this folder."""
    pml = _pml_path()
    prefix = " ".join(
        f"{name}={shlex.quote(os.environ[name])}" for name in CLIENT_SETTINGS if name in os.environ
    )
    pml = f"{prefix} {pml}" if prefix else pml
    commands = [
        f'{pml} search "read a file"',
        f'{pml} search "take a screenshot" --context playwright:playwright_navigate',
        f'{pml} plan next "take a screenshot of a web page"',
        f"{pml} publish execution docs/examples/execution.json",
    ]
    if shutil.which("grpcurl"):
        commands.append(
            f'grpcurl -plaintext -d \'{{"query": "commit my changes"}}\' '
            f"{settings.search_addr} pml.v1.SearchService/Search"
        )
    return commands


def _pml_path() -> str:
    """The `pml` script of this environment (uv need not be on the PATH to run it), relative
    to the current folder when it is inside it: `.venv/bin/pml`."""
    script = Path(sys.executable).parent / "pml"
    try:
        return shlex.quote(str(script.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(script))


@catalog_app.command("load")
def catalog_load(
    file: Annotated[Path, typer.Argument(help="catalog.jsonl, or an MCP tools/list JSON.")],
    server: Annotated[str | None, typer.Option(help="Server name for tools/list files.")] = None,
    tenant: TenantOpt = None,
) -> None:
    """Register every tool of FILE with the search service."""
    from pml_cli import client
    from pml_cli.catalog_files import load_catalog

    settings = Settings()
    with _reported():
        tools = load_catalog(file, server)
        registered = client.register_tools(settings, tenant or settings.default_tenant, tools)
    out.print(f"registered {registered} tools from {file}")


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What the agent wants to do.")],
    context: Annotated[
        list[str] | None, typer.Option("--context", help="A tool already used (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(help="How many results.")] = 10,
    tenant: TenantOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Unified search, or hybrid search with context tools when --context is given."""
    from pml_cli import client

    settings = Settings()
    with _reported():
        rows = client.search(settings, tenant or settings.default_tenant, query, limit, context)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    client.print_results(out, rows)


@app.command(no_args_is_help=True)
def ingest(
    target: Annotated[
        str,
        typer.Argument(
            help="A .md/.txt file, a folder of them or a corpus.jsonl to ingest; or `status` "
            "(per-pass state of documents); or `delete` followed by document ids."
        ),
    ],
    ids: Annotated[
        list[str] | None, typer.Argument(help="With `delete`: the ids of the documents.")
    ] = None,
    document: Annotated[
        list[str] | None, typer.Option("--document", help="With `status`: a document id.")
    ] = None,
    wait: Annotated[bool, typer.Option(help="Follow the documents through every pass.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to follow them at most.")] = 3600,
    tenant: TenantOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Ingest documents into the knowledge graph (`pml ingest PATH`), show their status
    (`pml ingest status [--document ID ...]`) or delete them (`pml ingest delete ID ...`)."""
    from pml_cli import ingest_client
    from pml_cli.ingest_files import load_documents

    settings = Settings()
    tenant = tenant or settings.default_tenant
    with _reported():
        if target == "status":
            found = ingest_client.statuses(settings, tenant, document)
            if as_json:
                sys.stdout.write(json.dumps(ingest_client.status_rows(found)) + "\n")
            else:
                ingest_client.print_status(out, found)
            return
        if target == "delete":
            if not ids:
                fail("give the id of the document(s) to delete: pml ingest delete ID ...")
            for doc_id in ids:
                ingest_client.delete(settings, tenant, doc_id)
            out.print(f"deleting {len(ids)} document(s): {', '.join(ids)}")
            return
        if ids:
            fail(f"unexpected argument(s) after {target}: {' '.join(ids)}")
        docs = load_documents(Path(target))
        doc_ids, unchanged = ingest_client.submit(settings, tenant, docs, err)
        result: dict[str, Any] = {"documents": len(doc_ids), "unchanged": unchanged}
        if wait:
            counts = ingest_client.wait(settings, tenant, doc_ids, err, timeout)
            result.update(counts)
    _emit(result, as_json)
    if result.get("failed") or result.get("in progress"):
        raise typer.Exit(1)


@app.command(no_args_is_help=True)
def ask(
    question: Annotated[str, typer.Argument(help="A question about the ingested documents.")],
    k: Annotated[int, typer.Option(help="Evidence chunks to return (1-50).")] = 8,
    method: Annotated[
        str,
        typer.Option(
            help="graph-ppr (the default: graph-first with propagation from the question) "
            "| graph-first (the seeds' sections and one bridge hop) | vector (plain vector search)"
        ),
    ] = "graph-ppr",
    tenant: TenantOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Ask the knowledge graph: mode, paths with each edge's evidence, ranked evidence chunks."""
    from pml_cli import ask_client, client

    settings = Settings()
    with _reported():
        stub = ask_client.knowledge_stub(settings)
        reply = ask_client.ask(stub, tenant or settings.default_tenant, question, k, method)
    if as_json:
        sys.stdout.write(json.dumps(client.as_dict(reply)) + "\n")
    else:
        ask_client.print_answer(out, question, reply)


@publish_app.command("execution")
def publish_execution(
    file: Annotated[Path, typer.Argument(help="One ExecutionCompleted JSON, or JSONL of many.")],
    tenant: TenantOpt = None,
) -> None:
    """Publish ExecutionCompleted events on their Redis stream."""
    import asyncio

    from pml_cli import client
    from pml_cli.execution_files import load_executions

    settings = Settings()
    with _reported():
        events = load_executions(file, tenant or settings.default_tenant)
    ids = asyncio.run(client.publish_events(settings, events))
    out.print(f"published {len(ids)} ExecutionCompleted event(s): {', '.join(ids[:5])}")


@eval_app.command("tools")
def eval_tools(
    data: Annotated[Path, typer.Option(help="Folder with catalog.jsonl and queries.jsonl.")],
    method: Annotated[
        str,
        typer.Option(
            help="One or several, comma-separated: cosine | unified | hybrid | dense | lexical | "
            "hybrid-fused; with --folds also shgat (learned), knn and popular (supervised "
            "baselines from the training folds)."
        ),
    ] = "unified",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    max_queries: Annotated[
        int | None, typer.Option(min=1, help="Evaluate the first N only.")
    ] = None,
    folds: Annotated[
        int | None,
        typer.Option(help="K-fold: learn from K-1 folds' queries as executions, test on one."),
    ] = None,
    min_relevant: Annotated[
        int, typer.Option(min=1, help="Keep queries with at least this many relevant tools.")
    ] = 1,
    split: Annotated[
        str,
        typer.Option(
            help="With --folds: query (default; paraphrases of a test task may be in training) "
            "or workflow (queries grouped by gold tool set: no test set seen in training)."
        ),
    ] = "query",
    seed: Annotated[int, typer.Option(help="With --folds: seed of the split.")] = 0,
    per_query: Annotated[
        Path | None, typer.Option(help="Write one JSON line per (method, query) to this file.")
    ] = None,
    id_prefix: IdPrefixOption = "",
) -> None:
    """Tool retrieval metrics of one or several methods on DATA, through the running system."""
    from pml_cli.eval_data import QuerySelection
    from pml_cli.eval_folds import evaluate_folds
    from pml_cli.eval_tools import EvalError, evaluate_tools

    settings = Settings()
    with _reported():
        selection = QuerySelection(
            id_prefixes=_prefixes(id_prefix),
            min_relevant=min_relevant,
            max_queries=max_queries,
        )
        if folds is not None:
            result = evaluate_folds(
                settings,
                data,
                method,
                folds,
                selection,
                err,
                split,
                seed,
                per_query,
            )
        elif min_relevant != 1 or split != "query":
            raise EvalError("--min-relevant and --split need --folds")
        else:
            result = evaluate_tools(settings, data, method, selection, err, per_query)
    _emit(result, as_json)


@eval_app.command("synthetic")
def eval_synthetic(
    folds: Annotated[int, typer.Option(help="Number of folds.")] = 5,
    steps: Annotated[int, typer.Option(help="Training steps per fold.")] = 300,
    seed: Annotated[int, typer.Option(help="Seed of the hierarchy, intents and split.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """SHGAT against cosine on a synthetic two-level hierarchy, K-fold, in-process."""
    from pml_cli.eval_synthetic import evaluate_synthetic

    result = evaluate_synthetic(folds, steps, seed, Settings().shgat_key_dim, err)
    _emit(result, as_json)


@eval_app.command("knowledge")
def eval_knowledge(
    data: Annotated[Path, typer.Option(help="Folder with corpus.jsonl and questions.jsonl.")],
    method: Annotated[
        str,
        typer.Option(
            help="graph-ppr (Ask's default) | graph-first | vector, or several: "
            "vector,graph-first,graph-ppr"
        ),
    ] = "graph-ppr",
    max_questions: Annotated[int | None, typer.Option(help="Evaluate the first N only.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    per_query: Annotated[
        Path | None,
        typer.Option(
            help="Also write each answer as a JSON line to this file: the supporting "
            "documents' ranks and the seeds with how each was linked."
        ),
    ] = None,
) -> None:
    """Ingest DATA's corpus through the pipeline, ask every question: recall@2/@5,
    all_evidence@8."""
    from pml_cli.eval_knowledge import evaluate_knowledge

    with _reported():
        result = evaluate_knowledge(Settings(), data, method, max_questions, err, per_query)
    _emit(result, as_json)


@plan_app.command("next")
def plan_next(
    intent: Annotated[str, typer.Argument(help="What the agent wants to do.")],
    context: Annotated[
        list[str] | None,
        typer.Option("--context", help="A tool already used, in order (repeatable)."),
    ] = None,
    method: Annotated[str, typer.Option(help=PLAN_METHOD_HELP)] = "",
    tenant: TenantOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The next tool for INTENT after the --context tools, with the ranked candidates."""
    from pml_cli import client

    settings = Settings()
    _check_plan_method(method)
    with _reported():
        reply = client.predict_next(
            settings, tenant or settings.default_tenant, intent, context, method
        )
    if as_json:
        sys.stdout.write(json.dumps(client.as_dict(reply)) + "\n")
    else:
        client.print_next(out, reply)


@plan_app.command("dag")
def plan_dag(
    intent: Annotated[str, typer.Argument(help="What the agent wants to do.")],
    method: Annotated[str, typer.Option(help=PLAN_METHOD_HELP)] = "",
    tenant: TenantOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """A whole workflow for INTENT: nodes, dependency edges and an execution order."""
    from pml_cli import client

    settings = Settings()
    _check_plan_method(method)
    with _reported():
        reply = client.suggest_dag(settings, tenant or settings.default_tenant, intent, method)
    if as_json:
        sys.stdout.write(json.dumps(client.as_dict(reply)) + "\n")
    else:
        client.print_dag(out, reply)


@plan_app.command("info")
def plan_info(
    tenant: TenantOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """How each method would have predicted the tenant's executions (prequential figures), and
    the methods a request naming none gets."""
    from pml_cli import client

    settings = Settings()
    with _reported():
        reply = client.planner_info(settings, tenant or settings.default_tenant)
    if as_json:
        sys.stdout.write(json.dumps(client.as_dict(reply)) + "\n")
    else:
        client.print_planner_info(out, reply)


def _check_plan_method(method: str) -> None:
    from pml_cli import client

    if method and method not in client.PLAN_METHODS:
        fail(f"unknown method {method!r}; choose one of {', '.join(client.PLAN_METHODS)}")


@eval_app.command("plan")
def eval_plan(
    data: Annotated[Path, typer.Option(help="Folder with catalog.jsonl and queries.jsonl.")],
    folds: Annotated[int, typer.Option(help="K-fold: learn from K-1 folds, test on one.")] = 5,
    method: Annotated[
        str,
        typer.Option(
            help="drdsp | legacy | discovery | search | blend | default (no method named: the "
            "planner's choice by its prequential figures) | knn (the nearest training "
            "intent's sequence), or several: drdsp,legacy,knn"
        ),
    ] = "drdsp",
    min_steps: Annotated[int, typer.Option(help="Keep queries with at least this many steps.")] = 2,
    max_queries: Annotated[int | None, typer.Option(help="Evaluate the first N only.")] = None,
    split: Annotated[
        str,
        typer.Option(
            help="query (default; paraphrases of a test task may be in training) or workflow "
            "(queries grouped by gold tool set: no test set seen in training)."
        ),
    ] = "query",
    seed: Annotated[int, typer.Option(help="Seed of the split.")] = 0,
    per_query: Annotated[
        Path | None, typer.Option(help="Write one JSON line per (method, query) to this file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    id_prefix: IdPrefixOption = "",
) -> None:
    """Next-step hits and DAG node/edge F1 against each query's `sequence`, K-fold."""
    from pml_cli.eval_plan import evaluate_plan

    with _reported():
        result = evaluate_plan(
            Settings(),
            data,
            method,
            folds,
            min_steps,
            max_queries,
            err,
            split,
            seed,
            per_query,
            _prefixes(id_prefix),
        )
    _emit(result, as_json)


def _prefixes(spec: str) -> tuple[str, ...]:
    """`--id-prefix a,b` as its non-empty prefixes."""
    return tuple(p.strip() for p in spec.split(",") if p.strip())


@eval_app.command("make-workflows")
def eval_make_workflows(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder to write the set into.")],
    seed: Annotated[int, typer.Option(help="Seed of the synthetic intents.")] = 0,
    source: Annotated[
        Path | None,
        typer.Option("--from", help="Derive from this set's multi-tool queries instead."),
    ] = None,
) -> None:
    """Write a workflow set with `sequence`: synthetic, or --from a set's multi-tool queries."""
    from pml_cli.workflow_sets import sequences_from_relevant, write_synthetic_workflows

    try:
        with _reported():
            if source is not None:
                summary = sequences_from_relevant(source, out_dir)
            else:
                summary = write_synthetic_workflows(out_dir, seed)
    except OSError as exc:
        fail(f"{out_dir}: cannot write: {exc.strerror}")
    for key, value in summary.items():
        out.print(f"{key:>13}: {value}")


@eval_app.command("make-variant")
def eval_make_variant(
    source: Annotated[Path, typer.Option("--from", help="The tool set to start from.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder to write the variant into.")],
    descriptions: Annotated[
        Path | None,
        typer.Option(help="JSON object: tool id → the description it gets in the variant."),
    ] = None,
    queries: Annotated[
        Path | None,
        typer.Option(
            help="JSON object: query id → the request it becomes; the variant holds these "
            "queries only."
        ),
    ] = None,
) -> None:
    """Write a tool set worded otherwise (tools described, or requests put, in another
    language or words), so that what the wording changes is measured by `pml eval tools`."""
    from pml_cli.eval_data import variant

    try:
        with _reported():
            summary = variant(source, out_dir, descriptions, queries)
    except OSError as exc:
        fail(f"{out_dir}: cannot write: {exc.strerror}")
    for key, value in summary.items():
        out.print(f"{key:>11}: {value}")


@bench_app.command("search")
def bench_search(
    tools: Annotated[int, typer.Option(help="Catalog size.")] = 10_000,
    requests: Annotated[int, typer.Option(help="Measured requests.")] = 2000,
    clients: Annotated[int, typer.Option(help="Concurrent gRPC clients.")] = 4,
    neighbour_tools: Annotated[
        int,
        typer.Option(
            min=0,
            max=50_000,
            help="Instead: the searches alone, then while another tenant registers this many "
            "new tools in one request, then until its event is consumed, side by side.",
        ),
    ] = 0,
    repeats: Annotated[
        int,
        typer.Option(
            min=1,
            max=20,
            help="Measure the gRPC searches this many times on the one registered catalog; "
            "p50, p99 and qps are then the medians of the repeats.",
        ),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Search latency over gRPC with concurrent clients, and the same ranking in-process."""
    from pml_cli.bench_search import bench_search as run_bench
    from pml_cli.bench_search import bench_search_beside_registration

    if neighbour_tools and repeats > 1:
        fail("--repeats measures the searches alone; it cannot be used with --neighbour-tools")
    if neighbour_tools:
        result = bench_search_beside_registration(
            Settings(), tools, neighbour_tools, requests, clients, err
        )
    else:
        result = run_bench(Settings(), tools, requests, clients, err, repeats)
    _emit(result, as_json)


@bench_app.command("scorer")
def bench_scorer(
    capabilities: Annotated[
        int, typer.Option(help="Capabilities in the scored hierarchy.")
    ] = 100_000,
    requests: Annotated[int, typer.Option(help="Measured ScoreCapabilities calls.")] = 1000,
    rounds: Annotated[int, typer.Option(help="Executions → served model measurements.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """SHGAT scoring latency, training step cost, and executions-to-serving time."""
    from pml_cli.bench_scorer import bench_scorer as run_bench

    with _reported():
        result = run_bench(Settings(), capabilities, requests, rounds, err)
    _emit(result, as_json)


@bench_app.command("planner")
def bench_planner(
    hyperedges: Annotated[int, typer.Option(help="Hyperedges in the random hypergraph.")] = 10_000,
    queries: Annotated[int, typer.Option(help="Measured queries of each kind.")] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """DR-DSP query latency, and incremental update cost against a full recompute."""
    from pml_cli.bench_planner import bench_planner as run_bench

    result = run_bench(hyperedges, queries, err)
    _emit(result, as_json)


@bench_app.command("bus")
def bench_bus(
    events: Annotated[int, typer.Option(min=1, help="Distinct events published.")] = 100_000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Events/s through a consumer group: the project's bus against raw redis-py, same run."""
    from pml_cli.bench_bus import bench_bus as run_bench
    from pml_common.local_runtime import LocalRuntimeError

    try:
        result = run_bench(events, err)
    except LocalRuntimeError as exc:
        fail(str(exc))
    _emit(result, as_json)


@bench_app.command("knowledge")
def bench_knowledge(
    data: Annotated[Path, typer.Option(help="Knowledge set (corpus.jsonl, questions.jsonl).")] = (
        Path("../shared/data/knowledge-musique")
    ),
    documents: Annotated[int | None, typer.Option(help="Ingest the first N only.")] = None,
    rounds: Annotated[int, typer.Option(help="Times every question is asked.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Ingestion documents/s per pass and end to end, and Ask latency, on a private system."""
    from pml_cli.bench_knowledge import bench_knowledge as run_bench
    from pml_common.local_runtime import LocalRuntimeError

    try:
        with _reported():
            result = run_bench(data, documents, rounds, err)
    except (LocalRuntimeError, ValueError, RuntimeError) as exc:
        fail(str(exc))
    _emit(result, as_json)


@bench_app.command("memory")
def bench_memory(
    tools: Annotated[int, typer.Option(min=1, help="Tools of the large tenant.")] = 10_000,
    tenants: Annotated[int, typer.Option(min=0, help="Small tenants added after it.")] = 20,
    tenant_tools: Annotated[int, typer.Option(min=1, help="Tools of each small tenant.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Memory (RSS of each service, Redis's dataset) held per tenant and per `--tools` tools, on
    a private system."""
    from pml_cli.bench_memory import bench_memory as run_bench
    from pml_common.local_runtime import LocalRuntimeError

    try:
        result = run_bench(tools, tenants, tenant_tools, err)
    except (LocalRuntimeError, TimeoutError) as exc:
        fail(str(exc))
    _emit(result, as_json)


@bench_app.command("soak")
def bench_soak(
    minutes: Annotated[
        float, typer.Option(min=0.1, help="Length of the load; faults at fixed shares of it.")
    ] = 10.0,
    clients: Annotated[int, typer.Option(min=1, help="Concurrent Search clients.")] = 4,
    search_rate: Annotated[
        float, typer.Option(min=0.1, help="Searches per second, all clients together.")
    ] = 20.0,
    event_rate: Annotated[
        float, typer.Option(min=0.1, help="ExecutionCompleted events published per second.")
    ] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Mixed load on a private system while a consumer is SIGKILLed, Redis restarted and Neo4j
    stopped: rates held, errors by code, events lost and effects counted twice (exit 1 when an
    event was lost, counted twice or still queued after the drain)."""
    from pml_cli.bench_soak import SoakPlan
    from pml_cli.bench_soak import bench_soak as run_bench
    from pml_common.local_runtime import LocalRuntimeError

    try:
        result = run_bench(SoakPlan(minutes, clients, search_rate, event_rate), err)
    except (LocalRuntimeError, TimeoutError) as exc:
        fail(str(exc))
    _emit(result, as_json)
    if not result["passed"]:
        fail("events lost, counted twice or still queued: see `lost`, `double_effects`, `drained`")


@bench_app.command("cli")
def bench_cli(
    runs: Annotated[int, typer.Option(min=1, help="Measured runs of each command.")] = 9,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Wall time of `pml --help` and `pml search` (needs `make run`), each a fresh process."""
    from pml_cli.bench_cli import bench_cli as run_bench

    _emit(run_bench(runs, err), as_json)


@config_app.command("docs")
def config_docs() -> None:
    """Print the configuration reference (Markdown) generated from the settings module."""
    from pml_cli.config_docs import render

    sys.stdout.write(render())
