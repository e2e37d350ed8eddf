"""Output paths, checked before any work, and input files named twice (the cli package's second half).

An empty path, a directory, a path under a file, an unwritable place, a FIFO or a full device is refused;
missing folders are made, by the check and by every writer alike; two flags naming one file are refused,
and so is one input file given twice (its records would count twice).
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def real_path(path: str | os.PathLike) -> Path:
    """Where to write PATH: a symlink whose target does not exist yet is that target (kept a link), else PATH."""
    return Path(os.path.realpath(path)) if os.path.islink(path) and not os.path.exists(path) else Path(path)


def held_open(st: os.stat_result, fds=(1, 2)) -> bool:
    """True when this process's stdout or stderr is that file (a shell's `| jq` pipe as /dev/stdout)."""
    def ident(fd):
        try:
            return os.fstat(fd)[1:3]
        except OSError:
            return None
    return st[1:3] in [ident(fd) for fd in fds]


def _special_problem(p: Path, st: os.stat_result) -> str:
    """A target that is no regular file: a FIFO unless it is our own stdout or stderr (below), a socket, a block
    device, or a device that refuses a write (/dev/full)."""
    if stat.S_ISFIFO(st.st_mode) and not held_open(st):
        return ("is a FIFO: records are appended by reopening the output as each result ends, which its reader takes "
                "for the end (none yet: a hang); write to a file and `tail -f` it, or to /dev/stdout")
    if stat.S_ISSOCK(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return f"is a {'socket' if stat.S_ISSOCK(st.st_mode) else 'block device'}, not a file"
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    try:
        os.write(fd, b"")                     # nothing written; fails as a write would (ENOSPC on /dev/full)
    finally:
        os.close(fd)
    return ""


def _file_problem(p: Path) -> str:
    """Append a write of nothing to a regular file (made if missing, then removed again); a full file system.
    The ranks of a torchrun job check one --out at once: another rank may remove the file made here first."""
    existed = p.exists()
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, b"")
        fs = os.fstatvfs(fd)
    finally:
        os.close(fd)
        if not existed:
            p.unlink(missing_ok=True)
    if (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) == 0:
        return "no space left on its device"
    return ""


def output_problem(path: str | None, flag: str, folder: bool = False) -> str:
    """'' when the tool can write PATH (a file, or with `folder` a directory) at the end of its run, made
    with its missing parent folders; else one line naming the flag. Checked before any work, so a bad path
    never costs a run's results. Nothing in an existing file is changed; a symlink is kept and its target
    checked. Devices that take writes (/dev/null, /dev/stdout) are outputs too."""
    if path is None:
        return ""
    if not path.strip():
        return f"{flag}: empty path"
    if not folder and path.endswith(("/", os.sep)):
        return f"{flag} {path}: names a folder (it ends in /): give a file name"
    try:
        why = _path_problem(real_path(path), folder)
    except OSError as e:              # a name too long, a full device, no permission, a loop of links
        why = f"cannot write there ({e.strerror or type(e).__name__})"
    return f"{flag} {path}: {why}" if why else ""


def _path_problem(p: Path, folder: bool) -> str:
    if folder:
        if p.exists() and not p.is_dir():
            return "exists and is not a directory"
    elif p.is_dir():
        return "is a directory"
    elif p.exists() and not p.is_file():
        return _special_problem(p, p.stat())
    anc = p if folder else p.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        return f"{anc} is not a directory"
    if not folder and anc == p.parent:
        return _file_problem(p)
    with tempfile.TemporaryFile(dir=anc):
        pass
    return ""


def _file_key(path):
    """One key for two spellings of one file: its (device, inode), or its resolved path."""
    try:
        return os.stat(path)[1:3]
    except (OSError, ValueError):
        return os.path.realpath(path)


def repeated_input(paths) -> str:
    """'' or one line naming an input file given twice (its records would count twice)."""
    seen: dict = {}
    for p in paths:
        if (first := seen.setdefault(_file_key(p), p)) is not p:
            same = f" (the same file as {first})" if first != p else ""
            return f"{p}{same} is given twice: its records would count twice"
    return ""


def first_output_problem(outputs) -> str:
    """The first problem of several outputs, (path, flag) or (path, flag, folder), or ''; two flags that name
    one file (`--out x --plot x`: the second write would destroy the first) are refused."""
    outputs = [(o[0], o[1], o[2] if len(o) > 2 else False) for o in outputs if o[0] is not None]
    seen: dict = {}
    for path, flag, _ in outputs:
        key = _file_key(path)
        if key in seen and path != os.devnull:
            return f"{seen[key]} and {flag} name the same file {path}: give each its own path"
        seen.setdefault(key, flag)
    return next((m for m in (output_problem(p, f, d) for p, f, d in outputs) if m), "")
