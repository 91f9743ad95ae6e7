"""Workflow sets with ordered ground truth (`sequence`) in the evaluation exchange format.

`synthetic_workflows(seed)` builds a hand-written catalog of 61 tools over ten servers
(filesystem, git, github, slack, email, postgres, browser, jira, calendar, sheets) and 26
workflows of 2–5 ordered steps. Workflows share tools, some contain others (commit ⊂ commit and
push) or overlap (edit a config, then commit it), and two goals have two alternative routes
(query results to Slack or by email; a meeting announced by email or on Slack). Each workflow
gets 6–10 intents phrased from templates × task phrasings, chosen by a seeded generator, so one
seed always gives the same files. Tools no workflow uses stay in the catalog as distractors.

`sequences_from_relevant(src, out)` derives a sequence set from any set in the format, e.g.
`tools-metatool`: it keeps the queries with 2+ distinct relevant tools and writes
`sequence` = `relevant` in file order. MetaTool gives no order of use, so next-step figures on
such a set measure co-usage (which tools go together), not order.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pml_cli.eval_data import write_jsonl
from pml_cli.eval_folds import steps_of
from pml_cli.eval_plan import plan_queries, sequence_source
from pml_cli.eval_tools import EvalError, load_queries, load_tool_catalog

# server -> (tool name, description, required input names)
_TOOLS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "filesystem": [
        ("read_file", "Read the complete contents of a text file from disk.", ("path",)),
        (
            "write_file",
            "Create or overwrite a file with the given text content.",
            ("path", "content"),
        ),
        ("list_directory", "List the files and folders inside a directory.", ("path",)),
        (
            "search_files",
            "Find files whose name matches a glob pattern under a folder.",
            ("path", "pattern"),
        ),
        ("move_file", "Move or rename a file or directory.", ("source", "destination")),
        ("create_directory", "Create a directory, including missing parent folders.", ("path",)),
        ("get_file_info", "Get size, permissions and modification time of a file.", ("path",)),
        ("delete_file", "Delete a file from disk.", ("path",)),
    ],
    "git": [
        (
            "git_status",
            "Show the working tree status: staged, unstaged and untracked files.",
            ("repo_path",),
        ),
        (
            "git_diff",
            "Show the line-by-line changes between the working tree and the index or a commit.",
            ("repo_path",),
        ),
        ("git_add", "Stage file contents for the next commit.", ("repo_path", "files")),
        (
            "git_commit",
            "Record the staged changes in the repository with a message.",
            ("repo_path", "message"),
        ),
        ("git_push", "Upload local branch commits to the remote repository.", ("repo_path",)),
        (
            "git_pull",
            "Fetch from the remote and integrate the changes into the current branch.",
            ("repo_path",),
        ),
        (
            "git_create_branch",
            "Create a new branch from the current HEAD and switch to it.",
            ("repo_path", "branch"),
        ),
        ("git_log", "Show the commit history with authors, dates and messages.", ("repo_path",)),
    ],
    "github": [
        (
            "create_pull_request",
            "Open a pull request from a branch into the base branch.",
            ("repo", "head", "base", "title"),
        ),
        (
            "get_pull_request",
            "Get the details, status and changed files of a pull request.",
            ("repo", "number"),
        ),
        ("merge_pull_request", "Merge an open pull request.", ("repo", "number")),
        ("list_issues", "List the issues of a repository, filtered by state or label.", ("repo",)),
        ("create_issue", "Open a new issue in a repository.", ("repo", "title", "body")),
        (
            "comment_on_issue",
            "Add a comment to an issue or pull request.",
            ("repo", "number", "body"),
        ),
        ("search_repositories", "Search GitHub repositories by keyword.", ("query",)),
        ("list_workflow_runs", "List recent CI workflow runs and their conclusions.", ("repo",)),
    ],
    "slack": [
        ("post_message", "Post a message to a Slack channel.", ("channel", "text")),
        ("list_channels", "List the public channels of the workspace.", ()),
        ("read_channel_history", "Read the recent messages of a channel.", ("channel",)),
        (
            "upload_file",
            "Upload a file to a channel with an optional comment.",
            ("channel", "path"),
        ),
        ("add_reaction", "Add an emoji reaction to a message.", ("channel", "timestamp", "emoji")),
        ("search_messages", "Search messages across the workspace.", ("query",)),
    ],
    "email": [
        ("send_email", "Send an email, optionally with attachments.", ("to", "subject", "body")),
        ("search_inbox", "Search the mailbox for messages matching a query.", ("query",)),
        ("read_email", "Read the full content of one email message.", ("message_id",)),
        ("create_draft", "Save an email as a draft without sending it.", ("to", "subject", "body")),
        (
            "download_attachment",
            "Save an attachment of an email to disk.",
            ("message_id", "attachment_id"),
        ),
    ],
    "postgres": [
        ("list_tables", "List the tables of a database schema.", ("schema",)),
        ("describe_table", "Show the columns, types and indexes of a table.", ("table",)),
        ("run_query", "Run a read-only SQL query and return the rows.", ("sql",)),
        ("export_csv", "Export the result of a SQL query to a CSV file.", ("sql", "path")),
        ("create_table", "Create a table with the given columns.", ("table", "columns")),
        ("insert_rows", "Insert rows into a table.", ("table", "rows")),
    ],
    "browser": [
        ("navigate", "Open a URL in the browser.", ("url",)),
        ("screenshot", "Capture a screenshot of the current page or an element.", ("name",)),
        ("click", "Click an element of the page.", ("selector",)),
        ("fill_form", "Type values into the input fields of a form.", ("fields",)),
        ("extract_text", "Extract the visible text or a table from the page.", ("selector",)),
        ("save_pdf", "Print the current page to a PDF file.", ("path",)),
        ("wait_for_selector", "Wait until an element appears on the page.", ("selector",)),
    ],
    "jira": [
        ("create_ticket", "Create a Jira ticket in a project.", ("project", "summary")),
        ("search_tickets", "Search tickets with a JQL query.", ("jql",)),
        ("update_ticket_status", "Move a ticket to another workflow status.", ("ticket", "status")),
        ("add_comment", "Comment on a Jira ticket.", ("ticket", "body")),
        ("assign_ticket", "Assign a ticket to a person.", ("ticket", "assignee")),
    ],
    "calendar": [
        ("list_events", "List calendar events in a time range.", ("start", "end")),
        (
            "find_free_slot",
            "Find a time when all attendees are free.",
            ("attendees", "duration_minutes"),
        ),
        (
            "create_event",
            "Create a calendar event and invite attendees.",
            ("title", "start", "attendees"),
        ),
        ("cancel_event", "Cancel a calendar event and notify attendees.", ("event_id",)),
    ],
    "sheets": [
        ("create_spreadsheet", "Create a new spreadsheet.", ("title",)),
        ("append_rows", "Append rows of values to a sheet.", ("spreadsheet_id", "rows")),
        ("read_range", "Read the values of a cell range.", ("spreadsheet_id", "range")),
        (
            "create_chart",
            "Add a chart built from a range of a sheet.",
            ("spreadsheet_id", "range", "kind"),
        ),
    ],
}


@dataclass(frozen=True)
class Workflow:
    id: str
    goal: str  # workflows sharing a goal are alternative routes to it
    steps: tuple[str, ...]
    tasks: tuple[str, ...]  # imperative phrasings, lower case, no final stop


WORKFLOWS: tuple[Workflow, ...] = (
    Workflow(
        "commit-changes",
        "commit",
        ("git:git_status", "git:git_diff", "git:git_add", "git:git_commit"),
        (
            "commit my local changes",
            "review what changed and commit it",
            "check the diff and make a commit",
        ),
    ),
    Workflow(
        "commit-and-push",
        "publish-code",
        ("git:git_status", "git:git_diff", "git:git_add", "git:git_commit", "git:git_push"),
        (
            "commit my changes and push them to the remote",
            "commit and push my work",
            "save my edits in a commit and upload it to origin",
        ),
    ),
    Workflow(
        "open-pull-request",
        "pull-request",
        ("git:git_create_branch", "git:git_commit", "git:git_push", "github:create_pull_request"),
        (
            "put my work on a new branch and open a pull request",
            "create a feature branch, push it and open a PR",
            "send my changes for review as a pull request",
        ),
    ),
    Workflow(
        "merge-when-green",
        "merge",
        ("github:get_pull_request", "github:list_workflow_runs", "github:merge_pull_request"),
        (
            "merge the pull request once CI passes",
            "check the PR's build and merge it if green",
            "land the pull request after its checks succeed",
        ),
    ),
    Workflow(
        "triage-issues",
        "triage",
        ("github:list_issues", "jira:create_ticket", "jira:assign_ticket"),
        (
            "turn the open GitHub issues into assigned Jira tickets",
            "triage new issues into Jira and assign them",
            "copy open issues to Jira and give each an owner",
        ),
    ),
    Workflow(
        "bug-from-slack",
        "report-bug",
        ("slack:search_messages", "github:create_issue", "slack:post_message"),
        (
            "file a GitHub issue for the bug people reported on Slack and tell them",
            "open an issue from the Slack bug report and reply with the link",
            "track the crash mentioned in Slack as an issue and let the channel know",
        ),
    ),
    Workflow(
        "query-results-to-slack",
        "share-query-results",
        ("postgres:run_query", "postgres:export_csv", "slack:upload_file"),
        (
            "share last week's signups from the database as a CSV on Slack",
            "export the query results to CSV and post the file in the data channel",
            "pull the revenue numbers from Postgres and upload them to Slack",
        ),
    ),
    Workflow(
        "query-results-by-email",
        "share-query-results",
        ("postgres:run_query", "postgres:export_csv", "email:send_email"),
        (
            "email last week's signups from the database as a CSV",
            "export the query results to CSV and mail them to finance",
            "pull the revenue numbers from Postgres and send them by email",
        ),
    ),
    Workflow(
        "explore-schema",
        "explore-data",
        ("postgres:list_tables", "postgres:describe_table", "postgres:run_query"),
        (
            "find out what tables the database has and query the orders table",
            "look at the schema and then sample a table",
            "explore an unfamiliar database and run a first query",
        ),
    ),
    Workflow(
        "page-screenshot",
        "screenshot",
        ("browser:navigate", "browser:screenshot"),
        (
            "take a screenshot of the pricing page",
            "capture the homepage as an image",
            "grab a screenshot of a website",
        ),
    ),
    Workflow(
        "dashboard-screenshot-to-slack",
        "share-screenshot",
        (
            "browser:navigate",
            "browser:wait_for_selector",
            "browser:screenshot",
            "slack:upload_file",
        ),
        (
            "screenshot the dashboard once it has loaded and post it to Slack",
            "share a picture of the metrics dashboard in the team channel",
            "wait for the status page to render, capture it and upload it to Slack",
        ),
    ),
    Workflow(
        "scrape-to-sheet",
        "collect-web-data",
        ("browser:navigate", "browser:extract_text", "sheets:append_rows"),
        (
            "copy the table from a web page into our spreadsheet",
            "scrape competitor prices into the tracking sheet",
            "collect the listed figures from the site and add them to the sheet",
        ),
    ),
    Workflow(
        "page-pdf-by-email",
        "archive-page",
        ("browser:navigate", "browser:save_pdf", "email:send_email"),
        (
            "save the article as a PDF and email it to me",
            "print the invoice page to PDF and send it to accounting",
            "make a PDF of the web page and mail it",
        ),
    ),
    Workflow(
        "submit-web-form",
        "submit-form",
        ("browser:navigate", "browser:fill_form", "browser:click", "browser:screenshot"),
        (
            "fill in the contact form on the site, submit it and keep a screenshot",
            "register for the webinar through its web form and capture the confirmation",
            "complete the online application form and screenshot the result",
        ),
    ),
    Workflow(
        "meeting-by-email",
        "schedule-meeting",
        ("calendar:find_free_slot", "calendar:create_event", "email:send_email"),
        (
            "find a time for the three of us, book it and email the agenda",
            "schedule a meeting with the design team and send the details by email",
            "set up a sync when everyone is free and mail the invitation note",
        ),
    ),
    Workflow(
        "meeting-on-slack",
        "schedule-meeting",
        ("calendar:find_free_slot", "calendar:create_event", "slack:post_message"),
        (
            "find a time for the three of us, book it and announce it on Slack",
            "schedule a meeting with the design team and post the details in the channel",
            "set up a sync when everyone is free and tell the team on Slack",
        ),
    ),
    Workflow(
        "save-email-attachment",
        "save-attachment",
        (
            "email:search_inbox",
            "email:read_email",
            "email:download_attachment",
            "filesystem:move_file",
        ),
        (
            "find the contract someone emailed me and save the attachment in my documents",
            "download the invoice attached to the supplier's email into the invoices folder",
            "get the spreadsheet from yesterday's email and file it on disk",
        ),
    ),
    Workflow(
        "slack-thread-to-ticket",
        "report-bug",
        ("slack:read_channel_history", "jira:create_ticket", "slack:add_reaction"),
        (
            "turn the support channel's latest complaint into a Jira ticket and mark it handled",
            "log the request from the ops channel in Jira and react to it",
            "create a ticket from what was asked in the channel and acknowledge it",
        ),
    ),
    Workflow(
        "edit-config",
        "edit-file",
        ("filesystem:search_files", "filesystem:read_file", "filesystem:write_file"),
        (
            "find the nginx config and change the port",
            "locate the settings file and update the timeout",
            "search for the YAML config and edit a value in it",
        ),
    ),
    Workflow(
        "edit-and-commit-config",
        "edit-and-commit",
        ("filesystem:read_file", "filesystem:write_file", "git:git_add", "git:git_commit"),
        (
            "update the config file and commit the change",
            "edit the README and record it in git",
            "change a setting in the repo and commit it",
        ),
    ),
    Workflow(
        "close-ticket-after-merge",
        "close-ticket",
        ("github:merge_pull_request", "jira:update_ticket_status", "jira:add_comment"),
        (
            "merge the fix and close its Jira ticket with a note",
            "land the PR and mark the ticket done",
            "merge the pull request and resolve the linked ticket with a comment",
        ),
    ),
    Workflow(
        "sales-chart",
        "chart-data",
        (
            "postgres:run_query",
            "sheets:create_spreadsheet",
            "sheets:append_rows",
            "sheets:create_chart",
        ),
        (
            "chart monthly sales from the database in a new spreadsheet",
            "build a spreadsheet with a graph of revenue per region",
            "put the query results in a sheet and plot them",
        ),
    ),
    Workflow(
        "import-csv",
        "load-data",
        ("filesystem:read_file", "postgres:create_table", "postgres:insert_rows"),
        (
            "load the customers CSV into a new database table",
            "import this CSV file into Postgres",
            "create a table from the exported file and fill it",
        ),
    ),
    Workflow(
        "fresh-branch",
        "start-work",
        ("git:git_pull", "git:git_create_branch"),
        (
            "update main and start a new branch",
            "pull the latest code and branch off it",
            "get up to date and create a feature branch",
        ),
    ),
    Workflow(
        "release-notes",
        "release-notes",
        ("git:git_log", "filesystem:write_file", "slack:post_message"),
        (
            "write release notes from the commit history and share them on Slack",
            "draft the changelog from recent commits and announce it",
            "summarise what was committed since the last release and post it",
        ),
    ),
    Workflow(
        "standup-update",
        "status-update",
        ("jira:search_tickets", "slack:post_message"),
        (
            "post my open Jira tickets to the standup channel",
            "share the sprint's in-progress tickets on Slack",
            "tell the team on Slack which tickets I am working on",
        ),
    ),
)

TEMPLATES = (
    "{task}",
    "Please {task}.",
    "Can you {task}?",
    "I need to {task}.",
    "Could you {task} for me?",
    "Help me {task}.",
    "I'd like to {task}.",
    "Go ahead and {task}.",
    "We have to {task} before the end of the day.",
    "Quick one: {task}.",
    "How do I {task}?",
    "Let's {task}.",
)
MIN_INTENTS, MAX_INTENTS = 6, 10


def catalog_rows() -> list[dict[str, Any]]:
    rows = []
    for server, tools in _TOOLS.items():
        for name, description, inputs in tools:
            schema = {
                "type": "object",
                "properties": {i: {"type": "string"} for i in inputs},
                "required": list(inputs),
            }
            rows.append(
                {
                    "id": f"{server}:{name}",
                    "server": server,
                    "name": name,
                    "description": description,
                    "input_schema": schema,
                }
            )
    return rows


def _phrase(template: str, task: str) -> str:
    text = template.format(task=task)
    return text[0].upper() + text[1:]


def query_rows(seed: int) -> list[dict[str, Any]]:
    """6–10 intents per workflow, picked from templates × task phrasings by a seeded generator."""
    rng = random.Random(seed)
    rows = []
    for workflow in WORKFLOWS:
        combos = [(t, task) for task in workflow.tasks for t in TEMPLATES]
        picked = rng.sample(combos, rng.randint(MIN_INTENTS, MAX_INTENTS))
        for number, (template, task) in enumerate(picked):
            rows.append(
                {
                    "id": f"{workflow.id}-{number}",
                    "query": _phrase(template, task),
                    "relevant": list(workflow.steps),
                    "sequence": list(workflow.steps),
                }
            )
    return rows


def write_synthetic_workflows(out: Path, seed: int = 0) -> dict[str, Any]:
    """Write catalog.jsonl and queries.jsonl (with `sequence`) to `out`; a summary."""
    out.mkdir(parents=True, exist_ok=True)
    catalog, queries = catalog_rows(), query_rows(seed)
    write_jsonl(out / "catalog.jsonl", catalog)
    write_jsonl(out / "queries.jsonl", queries)
    return {
        "out": str(out),
        "tools": len(catalog),
        "workflows": len(WORKFLOWS),
        "queries": len(queries),
        "seed": seed,
    }


def sequences_from_relevant(src: Path, out: Path) -> dict[str, Any]:
    """Keep `src`'s queries with 2+ distinct relevant tools, `sequence` = `relevant` in file order.

    The catalog is copied unchanged (after checking it reads). The order is the file's, not an
    order of use, unless the source already had `sequence`, which is then kept.
    """
    if src.resolve() == out.resolve():
        raise EvalError("--from and --out must be different folders")
    load_tool_catalog(src)
    queries = load_queries(src / "queries.jsonl")
    kept = plan_queries(queries, min_steps=2)
    if not kept:
        raise EvalError(f"{src / 'queries.jsonl'}: no query with 2+ relevant tools")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "catalog.jsonl", out / "catalog.jsonl")
    write_jsonl(
        out / "queries.jsonl",
        [
            {"id": q.id, "query": q.query, "relevant": q.relevant, "sequence": steps_of(q)}
            for q in kept
        ],
    )
    return {
        "out": str(out),
        "from": str(src),
        "queries": len(kept),
        "of": len(queries),
        "sequence_from": sequence_source(kept),
        "note": "the source gives no order of use: next-step figures measure co-usage, not order",
    }
