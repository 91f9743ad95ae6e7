import json
from pathlib import Path

import pytest

from pml_cli.catalog_files import CatalogFileError, load_catalog

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tools-metatool"
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_demo_catalog_has_real_servers_and_template_tools() -> None:
    from pml_cli.main import DEMO_CATALOG

    tools = load_catalog(DEMO_CATALOG)
    servers = {t.server for t in tools}
    assert {"filesystem", "git", "fetch", "memory", "playwright"} <= servers
    ids = {t.id for t in tools}
    assert "playwright:playwright_navigate" in ids
    assert "memory:create_entities" in ids


def test_mcp_tools_list_needs_and_uses_server(tmp_path: Path) -> None:
    path = EXAMPLES / "tools-list.json"
    with pytest.raises(CatalogFileError, match="--server"):
        load_catalog(path)
    tools = load_catalog(path, server="time")
    assert [t.id for t in tools] == ["time:get_current_time", "time:convert_time"]
    assert tools[0].input_schema is not None


@pytest.mark.skipif(not DATA.exists(), reason="evaluation data not present")
def test_exchange_format_catalog_loads() -> None:
    tools = load_catalog(DATA / "catalog.jsonl")
    assert len(tools) == 199


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty"),
        ('{"id": "a:b", "server": "a", "name": "b"}\nnot json\n', ":2: not JSON"),
        ('{"id": "no-colon", "server": "a", "name": "b"}\n', ":1: id"),
        (
            '{"id": "a:b", "server": "a", "name": "b"}\n{"id": "a:b", "server": "a", "name": "b"}\n',
            "appears twice",
        ),
        (json.dumps({"something": []}), "no `tools` array"),
    ],
)
def test_bad_catalogs_name_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / ("bad.jsonl" if "\n" in content else "bad.json")
    path.write_text(content)
    with pytest.raises(CatalogFileError, match=message):
        load_catalog(path)
