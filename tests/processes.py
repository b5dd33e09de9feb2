"""What tests ask of a process by its pid."""

from __future__ import annotations

import psutil


def alive(pid: int) -> bool:
    """Whether process `pid` runs: it exists and is no zombie (exited, waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def exited(pid: int) -> bool:
    """Whether process `pid` has exited: gone, or a zombie."""
    return not alive(pid)


MAIN_THREAD_LEAVES = """\
import ctypes, signal, sys, threading, time
def leave(*_):  # a thread carries on, the main thread ends: Linux shows a zombie that runs
    threading.Thread(target=time.sleep, args=(120,)).start()
    ctypes.CDLL(None).pthread_exit(None)
if sys.argv[1] == "on-sigterm":  # as a slow shutdown would
    signal.signal(signal.SIGTERM, leave)
    print("ready", flush=True)
    time.sleep(120)
print("ready", flush=True)
leave()
"""
"""A program (`python -c MAIN_THREAD_LEAVES MODE ...`) whose main thread ends while another
runs on: at once (MODE "now") or on SIGTERM ("on-sigterm"); it prints "ready" first."""
