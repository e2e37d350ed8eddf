"""The open-file limit (`ulimit -n`) a run needs, checked before any rank starts.

Every rank process holds a socket to each other rank of its group and to the rendezvous store, and the
tool holds pipes to each rank it starts. Below the need, gloo fails mid-run: measured on CPU with
`dispatch --backend alltoall`, EP 2 needed 27 descriptors, EP 4 31, EP 8 40, EP 16 56 (about 24 + 2 per
rank); at `ulimit -n 20` a run printed hundreds of lines of c10d errors and hung until its timeout, and at
32 with EP 8 it wrote a FAIL record blaming the backend. The need below keeps twice that margin per rank.
A soft limit under the need is raised to the hard limit where that suffices (what `ulimit -n` would do);
else the run is refused with one line.
"""
from __future__ import annotations

import resource

FD_BASE = 32
FD_PER_RANK = 4


def open_files_needed(ranks: int) -> int:
    return FD_BASE + FD_PER_RANK * max(ranks, 1)


def open_files_problem(ranks: int) -> str:
    """'' when this process (and the ranks it starts, which inherit the limit) may open the files and sockets
    `ranks` ranks need, after raising the soft limit where the hard one allows; else one line."""
    need = open_files_needed(ranks)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return ""
    if hard == resource.RLIM_INFINITY or hard >= need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return ""
        except (ValueError, OSError):
            pass
    return (f"the open-file limit (ulimit -n) is {soft}: {ranks} ranks need about {need} files and sockets; "
            f"raise it (ulimit -n {max(need, 1024)}) and run again")
