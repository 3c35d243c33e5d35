"""Runs host calls of jaxmg_cuda's CUDA path (``run_cuda_on_host``) in a process of its own.

Used by ``tests/native/test_cuda_host_calls.py``: the CUDA libraries are opened once per
process, so every library choice (the emulator in ``fake_cuda.cc``, or the real CUDA
libraries on a GPU machine) gets a fresh process.

    python run_host_calls.py CASES.pkl RESULTS.pkl LIBRARY_DIR|-

``CASES.pkl`` holds a list of keyword dicts for ``run_cuda_on_host``; ``RESULTS.pkl`` receives
the list of result dicts, plus, with the emulator, its bookkeeping after the calls. ``-``
uses the real libraries. With ``JAXMG_HOST_CALL_PIDS_FROM_STDIN=1`` the process first prints
its pid and reads the job's pids (one line, space separated) from stdin: one position of a
multi-process call.
"""

import ctypes
import os
import pickle
import sys

from jaxmg_cuda import _jaxmg_cuda


def emulator_state(library_dir):
    lib = ctypes.CDLL(os.path.join(library_dir, "libcudart.so.13"))
    for name in (
        "fakecuda_live_allocations",
        "fakecuda_open_ipc",
        "fakecuda_queued_ops",
        "fakecuda_library_busy",
    ):
        getattr(lib, name).restype = ctypes.c_long
    lib.fakecuda_solver_calls.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(1 << 16)
    count = lib.fakecuda_violations(buf, len(buf))
    return {
        "violations": count,
        "violation_text": buf.value.decode(errors="replace"),
        "live_allocations": lib.fakecuda_live_allocations(),
        "open_ipc": lib.fakecuda_open_ipc(),
        "queued_ops": lib.fakecuda_queued_ops(),
        "library_busy": lib.fakecuda_library_busy(),
        "solver_calls": lib.fakecuda_solver_calls(),
    }


def main(cases_path, results_path, library_dir):
    with open(cases_path, "rb") as f:
        cases = pickle.load(f)
    if library_dir != "-":
        _jaxmg_cuda.set_cuda_library_dirs([library_dir])
    loaded = _jaxmg_cuda.load_cuda_libraries()
    if loaded:
        raise SystemExit(f"could not load the CUDA libraries: {loaded}")
    pids = None
    if os.environ.get("JAXMG_HOST_CALL_PIDS_FROM_STDIN") == "1":
        print(os.getpid(), flush=True)
        pids = [int(p) for p in sys.stdin.readline().split()]
    results = []
    for case in cases:
        if pids is not None:
            case = dict(case, pids=pids)
        results.append(_jaxmg_cuda.run_cuda_on_host(**case))
    state = emulator_state(library_dir) if library_dir != "-" else None
    with open(results_path, "wb") as f:
        pickle.dump({"results": results, "emulator": state}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
