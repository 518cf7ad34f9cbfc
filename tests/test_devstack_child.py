"""A driver that starts the stack's processes stops them when it is told to stop, so none is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from devstack.child import lifeline
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


KILLED_DRIVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from devstack.child import ChildProcess
from devstack.redis_server import RedisServer
child = ChildProcess({{}}, Path({log!r}))
child.spawn([sys.executable, "-c", "import time; time.sleep(120)"])
redis_server = RedisServer(Path({redis_dir!r}))
redis_server.start()
assert redis_server.process is not None
print(child.pid, redis_server.process.pid, flush=True)
time.sleep(120)
"""


def test_a_driver_killed_outright_leaves_neither_its_child_nor_its_redis_running(tmp_path: Path) -> None:
    script = KILLED_DRIVER.format(root=str(ROOT), log=str(tmp_path / "child.log"), redis_dir=str(tmp_path / "redis"))
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as driver:
        assert driver.stdout is not None
        started = [int(pid) for pid in driver.stdout.readline().split()]
        assert len(started) == 2 and all(_running(pid) for pid in started)
        driver.kill()  # no finally runs: only the kernel's parent-death signal can stop them
        assert driver.wait(30) == -signal.SIGKILL
    wait_for(lambda: not any(_running(pid) for pid in started), 10, "SIGTERM from their lifeline stops both")


def test_a_program_started_off_the_main_thread_gets_no_lifeline_since_its_thread_may_end_first() -> None:
    found: list[list[str]] = []
    helper = threading.Thread(target=lambda: found.append(lifeline()))
    helper.start()
    helper.join()
    assert found == [[]]
    assert lifeline()[-4:] == [lifeline()[0], "--pdeathsig", "TERM", "--"]
