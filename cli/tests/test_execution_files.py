from pathlib import Path

import pytest

from pml_cli.execution_files import ExecutionFileError, load_executions

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "execution.json"


def test_example_execution_fills_the_envelope() -> None:
    (event,) = load_executions(EXAMPLE, "acme")
    assert event.type == "ExecutionCompleted"
    assert event.version == 1
    assert event.event_id
    assert event.tenant_id == "default"  # the file names its tenant
    assert [s.success for s in event.steps] == [True, True, False]


def test_jsonl_and_default_tenant(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(
        '{"intent": "a", "steps": [{"node_id": "x:y", "success": true}], "outcome": "success"}\n'
        '{"intent": "b", "steps": [{"node_id": "x:z", "success": false}], "outcome": "failure"}\n'
    )
    events = load_executions(path, "acme")
    assert [e.tenant_id for e in events] == ["acme", "acme"]
    assert events[0].event_id != events[1].event_id


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"intent": "a", "steps": [], "outcome": "success"}', "steps"),
        (
            '{"intent": "a", "steps": [{"node_id": "x:y", "success": true}], "outcome": "meh"}',
            "outcome",
        ),
        (
            '{"intent": "a", "steps": [{"node_id": "x:y", "success": true}], "outcome": "success", "version": 9}',
            "unsupported version 9",
        ),
        ("[1]", "expected a JSON object"),
    ],
)
def test_bad_executions_are_explained(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ExecutionFileError, match=message):
        load_executions(path, "acme")
