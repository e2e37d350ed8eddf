"""env/nccl.py: which libnccl a process mapped, the version it reports, and the found/needed line a backend is
WAIVED with."""
import pytest

from moebench.env import nccl

MAPS = """\
7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000100000-7f0000200000 r-xp 00000000 08:01 99 /opt/nccl-2.30.7/lib/libnccl.so.2.30.7
7f0000200000-7f0000300000 r--p 00100000 08:01 99 /opt/nccl-2.30.7/lib/libnccl.so.2.30.7
7f0000400000-7f0000500000 r-xp 00000000 08:01 77 /site/nvidia/nccl/lib/libnccl.so.2
7f0000600000-7f0000601000 rw-p 00000000 00:00 0
7f0000700000-7f0000800000 r-xp 00000000 08:01 55 /site/nccl/ep/lib/cu13/libnccl_ep.so
"""


def test_mapped_lists_each_libnccl_once_and_not_libnccl_ep(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    assert nccl.mapped(str(maps)) == ["/opt/nccl-2.30.7/lib/libnccl.so.2.30.7", "/site/nvidia/nccl/lib/libnccl.so.2"]
    assert nccl.mapped(str(tmp_path / "absent")) == []


def test_mapped_reads_past_anonymous_lines_padded_with_spaces(tmp_path):
    """The H200's kernel pads a pathless line with spaces: five fields and no sixth (it stopped the old reader)."""
    padded = "7f0000000000-7f0000001000 rw-p 00000000 00:00 0" + " " * 26 + "\n"
    maps = tmp_path / "maps"
    maps.write_text(padded + "7f0000100000-7f0000200000 r-xp 00000000 08:01 99 /tmp/nccl-build/lib/libnccl.so.2.30.7\n")
    assert nccl.mapped(str(maps)) == ["/tmp/nccl-build/lib/libnccl.so.2.30.7"]


def test_two_libnccl_are_refused_with_both_paths_and_the_way_out():
    found = {"path": "/torch/nvidia/nccl/lib/libnccl.so.2", "version": "2.28.9",
             "also_mapped": ["/tmp/nccl-build/lib/libnccl.so.2.30.7"]}
    why = nccl.too_old(found, who="deepep-v2")
    assert "one libnccl in the process, this one maps 2" in why
    assert "/torch/nvidia/nccl/lib/libnccl.so.2" in why and "/tmp/nccl-build/lib/libnccl.so.2.30.7" in why
    assert "pip install 'nvidia-nccl-cu13>=2.30.4'" in why and "PYTHONPATH" in why


@pytest.mark.parametrize("code, want", [(23007, (2, 30, 7)), (22809, (2, 28, 9)), (2708, (2, 7, 8)),
                                        (21003, (2, 10, 3))])
def test_decode_both_version_codes(code, want):
    assert nccl.decode(code) == want


def test_too_old_names_found_and_needed():
    assert nccl.too_old({"path": "/x/libnccl.so.2", "version": "2.30.7"}) == ""
    assert nccl.too_old({"path": "/x/libnccl.so.2", "version": "2.30.4"}) == ""
    old = nccl.too_old({"path": "/t/libnccl.so.2", "version": "2.28.9"}, who="ncclep")
    assert "ncclep needs libnccl >= 2.30.4" in old and "loaded 2.28.9 from /t/libnccl.so.2" in old
    assert "nvidia-nccl-cu13>=2.30.4" in old and "bench/nccl_build.sh" in old
    assert "no libnccl is mapped" in nccl.too_old({"none": "no libnccl is mapped in this process"})
    assert "cannot read the version" in nccl.too_old({"path": "/x/libnccl.so.2", "version": None})


def test_loaded_in_this_process_is_a_path_and_version_or_says_none():
    found = nccl.loaded()
    assert ("none" in found) != ("path" in found)
    if "path" in found:                      # a CUDA torch maps its own libnccl
        assert found["version"] is None or found["version"].count(".") == 2
