"""Shared memory of the multi-process mode (issue 15): a segment that /dev/shm cannot hold is
an error that says how much was needed, how much there is and what to do, never a SIGBUS at
the first touch of a page, and it leaves nothing behind in /dev/shm."""

import os

import pytest

from jaxmg_cuda import _jaxmg_cuda as native

SHM = "/dev/shm"
pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm (POSIX shared memory)")


def _ours():
    """This process's segments (create_shared_memory names them after its pid): other
    processes, other test runs among them, may hold jaxmg segments meanwhile."""
    prefix = f"jaxmg-{os.geteuid()}-{os.getpid():016x}-"
    return {p for p in os.listdir(SHM) if p.startswith(prefix)}


def test_a_segment_that_fits():
    before = _ours()
    assert native.create_shared_memory(1 << 16) == ""
    assert _ours() == before


def test_a_segment_larger_than_dev_shm_is_an_error():
    """More than /dev/shm can ever hold: tmpfs refuses the reservation at once, without
    allocating anything (a sparse, merely sized file would be accepted)."""
    fs = os.statvfs(SHM)
    if fs.f_blocks == 0:
        pytest.skip("/dev/shm has no size limit")
    free = fs.f_bavail * fs.f_frsize
    bytes_ = free + fs.f_blocks * fs.f_frsize + (1 << 30)
    before = _ours()
    message = native.create_shared_memory(bytes_)
    assert message, "the reservation should have failed"
    assert "No space left on device" in message, message
    # The header comes on top of the operands, so the count named is a little larger.
    needed = int(message.split("cannot reserve ")[1].split(" bytes")[0])
    assert bytes_ < needed < bytes_ + (1 << 16), message
    named_free = int(message.split("/dev/shm has ")[1].split(" bytes free")[0])
    assert abs(named_free - free) < (1 << 30), message  # others may use /dev/shm meanwhile
    assert "--shm-size" in message, message
    assert _ours() == before
