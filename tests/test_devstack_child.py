"""A driver that starts the stack's processes stops them when it is told to stop, so none is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.processes import wait_for
from tests.support.servers import ROOT

DRIVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from devstack.child import ChildProcess
child = ChildProcess({{}}, Path({log!r}))
try:
    child.spawn([sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.pid, flush=True)
    time.sleep(120)
finally:
    child.stop()
"""


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_driver_sent_sigterm_stops_the_children_it_started_before_it_exits(tmp_path: Path) -> None:
    script = DRIVER.format(root=str(ROOT), log=str(tmp_path / "child.log"))
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as driver:
        assert driver.stdout is not None
        child = int(driver.stdout.readline())
        assert _running(child)
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(30) == 128 + signal.SIGTERM, "it exits as told, through its finally"
    wait_for(lambda: not _running(child), 10, "the child it started is stopped, not left behind")
