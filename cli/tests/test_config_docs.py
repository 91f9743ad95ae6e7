from pathlib import Path

from pml_cli.config_docs import render
from pml_common.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_setting_is_documented() -> None:
    text = render()
    for name in Settings.model_fields:
        assert f"`PML_{name.upper()}`" in text


def test_committed_reference_is_up_to_date() -> None:
    assert DOC.read_text() == render(), "run `uv run pml config docs > docs/configuration.md`"
