import os

import pytest

from pml_cli.bench_memory import difference, rss_mb


def test_rss_is_read_from_proc_and_grows_with_what_the_process_holds() -> None:
    before = rss_mb(os.getpid())
    held = bytearray(64 * 1024 * 1024)  # touched below, so resident
    held[::4096] = b"x" * len(held[::4096])
    after = rss_mb(os.getpid())
    assert before > 0
    assert after - before >= 60
    del held


def test_an_unknown_process_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        rss_mb(2**22 + 1)  # above Linux's pid_max limit


def test_differences_are_per_part_and_divided_by_the_tenants() -> None:
    before = {"rss_mb": {"search": 100.0}, "redis": {"used_mb": 1.0, "stream_entries": 2}}
    after = {"rss_mb": {"search": 130.0}, "redis": {"used_mb": 4.0, "stream_entries": 8}}
    assert difference(after, before, per=3) == {
        "rss_mb": {"search": 10.0},
        "redis": {"used_mb": 1.0, "stream_entries": 2.0},
    }
