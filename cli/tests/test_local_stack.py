"""The private system of `pml eval` / `pml run` is stopped whatever ends the command."""

import io
import socket
import subprocess
import sys
import textwrap

import pytest
from rich.console import Console

from pml_cli.local_stack import running_system, settings_to_env
from pml_common.local_runtime import free_port
from pml_common.settings import Settings

_TERMINATED = textwrap.dedent(
    """
    import os, signal, time
    from pml_cli.local_stack import interrupt_on_signals

    interrupt_on_signals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    finally:
        print("cleanup ran", flush=True)
    """
)


def test_sigterm_unwinds_so_the_cleanup_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _TERMINATED], capture_output=True, text=True, timeout=30
    )
    assert "cleanup ran" in done.stdout
    assert "KeyboardInterrupt" in done.stderr


def test_a_private_system_shows_each_phase_and_leaves_nothing_running() -> None:
    """`pml eval` with no PML running starts one and stops it; a log shows both phases; the
    private system takes the settings asked of it (the trainer's seed, for evaluations)."""
    nowhere = Settings().model_copy(update={"search_addr": f"127.0.0.1:{free_port()}"})
    log = io.StringIO()
    private = {"train_seed": 7}
    with running_system(nowhere, Console(file=log), ("search",), private) as live:
        assert live.search_addr != nowhere.search_addr
        assert live.train_seed == 7 and settings_to_env(live)["PML_TRAIN_SEED"] == "7"
        search_port = int(live.search_addr.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", search_port), timeout=5):
            pass
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("no PML running: starting a private one")
    assert lines[1:] == ["private PML ready", "stopping the private PML", "private PML stopped"]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", search_port), timeout=1).close()
