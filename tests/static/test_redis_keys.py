"""Every Redis key of the code base is built by `pml_common.redis_keys`, whose parts are escaped
so that no two (tenant, id) pairs share a key. A key spelled by hand anywhere else (an f-string
`"pml:…:{tenant}:{doc}"`, a `"pml:…"` prefix joined later) could collide across tenants again:
tenant `a:x` with document `y` and tenant `a` with document `x:y` once shared a status key."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_GLOBS = ("libs/*/src/**/*.py", "services/*/src/**/*.py", "cli/src/**/*.py")
KEYS_MODULE = "libs/common/src/pml_common/redis_keys.py"
#: Stream names are keys too, but constants with no outside part: they live with the events.
STREAMS = ("libs/common/src/pml_common/events.py", "pml:events:")


def hand_built_keys(source: str) -> list[int]:
    """Lines of string literals (plain or f-string parts) that start a `pml:` key,
    docstrings aside."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return sorted(
        {
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and node.value.startswith("pml:")
        }
    )


def test_keys_are_built_by_redis_keys_only() -> None:
    found = []
    for pattern in SOURCE_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            relative = path.relative_to(ROOT).as_posix()
            if relative == KEYS_MODULE:
                continue
            source = path.read_text()
            for line in hand_built_keys(source):
                text = source.splitlines()[line - 1]
                if relative == STREAMS[0] and STREAMS[1] in text:
                    continue
                found.append(f"{relative}:{line}: {text.strip()}")
    assert found == [], "build Redis keys with pml_common.redis_keys:\n" + "\n".join(found)


def test_the_check_sees_keys_built_by_hand() -> None:
    source = '''
"""pml:docs may mention keys."""
PREFIX = "pml:ingest:status"


def key(tenant: str, doc: str) -> str:
    """`pml:x:{tenant}` in a docstring is fine."""
    return f"pml:ingest:status:{tenant}:{doc}"


def other(tenant: str) -> str:
    return "pml:planner:" + tenant
'''
    assert hand_built_keys(source) == [3, 8, 12]
