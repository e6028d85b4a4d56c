"""What a `--ray local` cluster leaves when its command is SIGKILLed: nothing, within seconds.

Ray starts its workers in process groups of their own, so a kill of the command's process
group does not reach them, and a worker still starting up when its raylet died lived on
for half a minute or more (under init). `reaping(marker)` starts a watcher before Ray does:
a small process in a session of its own, holding the read end of a pipe whose write
end only this process has. When this process ends, however it ends, the pipe reads EOF and
the watcher kills every process of this user whose environment holds `marker` (set here,
so that Ray's processes, its workers included, inherit it), then exits."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

MARKER = "VIT_DEPLOY_RAY_LOCAL"  # the environment variable Ray's processes inherit
SWEEP_S = 3.0  # how long the watcher keeps killing (a dying raylet may still fork)

WATCHER = r"""
import os, signal, sys, time
sys.stdin.buffer.read()  # EOF: the command is gone
needle = sys.argv[1].encode()
me = os.getpid()
end = time.monotonic() + float(sys.argv[2])
while True:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass
    if time.monotonic() > end:
        break
    time.sleep(0.2)
"""


@contextlib.contextmanager
def reaping() -> Iterator[None]:
    """While inside: the environment marks what starts from here (Ray's cluster), and a
    watcher kills what it marks once this process is gone. Linux only (/proc); elsewhere a
    no-op."""
    if not sys.platform.startswith("linux"):
        yield
        return
    token = secrets.token_hex(8)
    os.environ[MARKER] = token
    watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", WATCHER,
                                f"{MARKER}={token}", str(SWEEP_S)],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True,
                               env={k: v for k, v in os.environ.items() if k != MARKER})
    try:
        yield
    finally:
        os.environ.pop(MARKER, None)
        with contextlib.suppress(OSError):
            watcher.stdin.close()  # the watcher sweeps (after ray.shutdown: nothing left)
        with contextlib.suppress(subprocess.TimeoutExpired):
            watcher.wait(timeout=SWEEP_S + 2)
