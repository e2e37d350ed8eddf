"""Process-tree helpers for the tests that signal a tool and check that its ranks are gone (Linux /proc)."""
import time
from pathlib import Path


def children_of(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def alive(pid: int) -> bool:
    """Running, neither gone nor a zombie."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(cond, timeout_s: float):
    """cond()'s first truthy value within timeout_s (polled every 0.2 s), else its last value."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    return cond()
