"""However many SIGINT/SIGTERM arrive, the stop sequence of `pml run` / `pml eval` completes:
the first interrupts the command, later ones are noted; one arriving well after the first (a
second Ctrl-C, not an echo of the first from make or uv) asks to kill instead of waiting."""

import subprocess
import sys
import textwrap

_STOPPING = textwrap.dedent(
    """
    import os, signal, time
    from pml_cli.local_stack import ECHO_S, interrupt_on_signals

    interrupts = interrupt_on_signals()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        interrupts.stop_now()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):  # echoes of the first
            os.kill(os.getpid(), sig)
        time.sleep(0.2)
        print("hurry after echoes:", interrupts.hurry(), flush=True)
        time.sleep(ECHO_S)
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C
        time.sleep(0.2)
        print("hurry after a second Ctrl-C:", interrupts.hurry(), flush=True)
        print("noted:", interrupts.noted, flush=True)
        print("stop sequence completed", flush=True)
    """
)


def test_signals_while_stopping_are_noted_not_obeyed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _STOPPING], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "interrupted",
        "hurry after echoes: False",
        "hurry after a second Ctrl-C: True",
        "noted: 4",
        "stop sequence completed",
    ]
