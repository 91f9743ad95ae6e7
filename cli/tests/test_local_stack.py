"""The private system of `pml eval` / `pml run` is stopped whatever ends the command."""

import subprocess
import sys
import textwrap

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
