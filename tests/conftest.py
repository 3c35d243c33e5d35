"""Shared pytest configuration for the jaxmg monorepo.

The number of simulated CPU devices is fixed once per process, before the JAX backend starts,
so each device count runs in its own pytest process: ``nox -s tests`` runs the suite for 1, 2,
3, 4 and 8 devices; by hand, ``pytest tests --num-cpu-devices 3``.

Strict JAX settings, as in JAX's own suite: x64 on, strict dtype promotion, rank promotion
raising. They are set in ``pytest_configure`` (never at import) and only for the test process.

Not every test runs in every device count's process: single-precision cases of a dtype grid
(``dtype_sweep``), the rest of a grid whose core runs everywhere (``grid_sweep``) and tests
independent of the device count (``once_per_suite``) run with 4 devices only, the count
``nox -s compat`` runs on the newest jax (in double precision, the files ``COMPAT_TESTS`` in
noxfile.py names).
"""

import os

import hypothesis
import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--num-cpu-devices",
        type=int,
        default=int(os.environ.get("JAXMG_TEST_DEVICES", "4")),
        help="number of simulated CPU devices for this pytest process (default 4)",
    )


# XLA's CPU backend compiles the suite's programs without LLVM optimization unless
# JAXMG_TEST_XLA_OPTIMIZE=1 (``nox -s tests`` sets it for its 1-device run, which compiles as
# users' programs are). Compiling hundreds of small programs per device count is most of the
# suite's time, and takes half as long: the HLO, its shardings and collectives are the same
# (tests that read compiled HLO see the same ops), and jaxmg's native code is built by its own
# build, not by XLA.
FAST_COMPILE = "--xla_backend_optimization_level=0"
# And with XLA:CPU's elemental fusion emitters, not the MLIR ones jaxlib 0.10 takes by default:
# 40% of the compile time (six shapes of a backend-"jax" potrs program on 4 devices: 1.3 s
# against 3.4 s; backend "mg"'s 0.18 s against 0.46 s), for the same HLO. jaxlib 0.12 has
# only the MLIR emitters and aborts on the flag: it is passed where a probe process takes it.
ELEMENTAL_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_takes(flag):
    """Whether this jaxlib's XLA starts with ``flag`` (it aborts on a flag it does not know)."""
    import subprocess
    import sys

    probe = [sys.executable, "-c", "import jax; jax.devices('cpu')"]
    env = {**os.environ, "XLA_FLAGS": flag}
    return subprocess.run(probe, env=env, capture_output=True, timeout=300).returncode == 0


def pytest_configure(config):
    if os.environ.get("JAXMG_TEST_XLA_OPTIMIZE") != "1":
        # Read when the backend starts (below); the examples' processes inherit it.
        flags = [FAST_COMPILE] + ([ELEMENTAL_EMITTERS] if _xla_takes(ELEMENTAL_EMITTERS) else [])
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()

    import jax

    jax.config.update("jax_num_cpu_devices", config.getoption("--num-cpu-devices"))
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    config.addinivalue_line("markers", "gpu: needs at least one NVIDIA GPU")
    config.addinivalue_line(
        "markers",
        "grid_sweep: a case of a grid that runs whole with --num-cpu-devices=4 (the other "
        "counts run the cases the marker leaves out)",
    )
    config.addinivalue_line(
        "markers",
        "dtype_sweep: a single-precision case of a dtype grid; runs only with "
        "--num-cpu-devices=4 (every count runs the double-precision cases)",
    )
    hypothesis.settings.register_profile(
        "deterministic",
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        max_examples=int(os.environ.get("JAXMG_HYPOTHESIS_EXAMPLES", "25")),
    )
    hypothesis.settings.load_profile("deterministic")


def pytest_report_header(config):
    import jax

    return f"jax {jax.__version__}: {jax.device_count()} {jax.default_backend()} device(s)"


def _gpu_devices():
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


@pytest.fixture
def gpu_devices():
    """The visible GPUs; skips without one, fails instead when JAXMG_REQUIRE_GPU=1."""
    devices = _gpu_devices()
    if not devices:
        message = "no GPU visible to JAX (set JAXMG_REQUIRE_GPU=1 to make this a failure)"
        if os.environ.get("JAXMG_REQUIRE_GPU") == "1":
            pytest.fail("JAXMG_REQUIRE_GPU=1 but " + message)
        pytest.skip(message)
    return devices


def pytest_runtest_setup(item):
    if item.get_closest_marker("dtype_sweep") and _device_count(item.config) != 4:
        pytest.skip(
            "float32 and complex64 run with --num-cpu-devices=4; other counts run the "
            "float64 and complex128 cases (the same code for the same element sizes)"
        )
    if item.get_closest_marker("grid_sweep") and _device_count(item.config) != 4:
        pytest.skip("a case of a grid that runs whole with --num-cpu-devices=4")


def _device_count(config) -> int:
    return config.getoption("--num-cpu-devices")


@pytest.fixture(scope="session")
def once_per_suite(request):
    """For tests that do not depend on the simulated device count: they run only in the
    4-device pytest process (the default), not again in the 1, 2, 3 and 8-device ones.

    Use it (``@pytest.mark.usefixtures("once_per_suite")``, or a module's ``pytestmark``) for
    pure layout and plan arithmetic, checks of arguments that need no mesh, tests on a device
    count of their own (``devices[:1]``, a fixed 2 x 2 grid), and tests that start processes
    configuring their own devices (examples, imports, benchmarks). 4 devices, the count ``nox
    -s compat`` runs its files (``COMPAT_TESTS``) with on the newest jax."""
    if _device_count(request.config) != 4:
        pytest.skip("independent of the device count: runs with --num-cpu-devices=4")


FAKE_CUDA = os.path.join(os.path.dirname(__file__), "native", "fake_cuda")
#: jaxmg-cuda's native sources: the emulator includes their vendor declarations from there.
CSRC = os.path.join(os.path.dirname(__file__), "..", "packages", "jaxmg-cuda", "csrc")
#: The names jaxmg opens the CUDA libraries by, all served by the emulator.
FAKE_CUDA_NAMES = (
    "libcudart.so.13",
    "libcusolverMg.so.12",
    "libcuda.so.1",
    "libcusolverMp.so.0",
    "libnccl.so.2",
)


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory):
    """The folder of the emulator of the CUDA runtime, driver, cuSolverMg, NCCL and cuSOLVERMp
    (tests/native/fake_cuda), compiled once per run, as ``libfakecuda.so`` and under every name
    jaxmg opens; skips without a C++ compiler."""
    import shutil
    import subprocess

    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the CUDA emulator")
    folder = tmp_path_factory.mktemp("fake_cuda")
    library = folder / "libfakecuda.so"
    sources = [os.path.join(FAKE_CUDA, name) for name in ("fake_cuda.cc", "fake_cusolvermp.cc")]
    subprocess.run(
        [compiler, "-std=c++17", "-O1", "-g", "-shared", "-fPIC", "-Wl,-soname,libfakecuda.so"]
        + ["-I", CSRC, "-o", str(library), *sources, "-lpthread", "-ldl"],
        check=True,
        timeout=300,
    )
    for name in FAKE_CUDA_NAMES:
        (folder / name).symlink_to(library.name)
    return folder


@pytest.fixture
def cpu_devices():
    """The simulated CPU devices of this pytest process (see --num-cpu-devices)."""
    import jax

    return jax.devices("cpu")


def _mapping_budget():
    """How many memory mappings this process may hold before JAX's compiled programs are
    dropped: MAX_MAPPINGS, or half of Linux's limit (``vm.max_map_count``) where that is lower;
    ``None`` where /proc does not tell (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return min(MAX_MAPPINGS, int(limit.read()) // 2)
    except OSError:
        return None


def _mappings():
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


# Beyond this many mappings, JAX's compiled programs are dropped after the test.
MAX_MAPPINGS = int(os.environ.get("JAXMG_TEST_MAX_MAPPINGS", "4096"))


@pytest.fixture(scope="session")
def _budget():
    return _mapping_budget()


@pytest.fixture(autouse=True)
def _bounded_compiled_code(_budget):
    """Drops JAX's compiled programs after a test once they hold MAX_MAPPINGS mappings.

    XLA:CPU maps each compiled program's code in mappings of its own, freed only with the
    program (a backend-"jax" ``potrs`` holds about 230), and JAX keeps every program a test
    compiled. The whole 4-device suite in one process reached Linux's default limit of 65530
    mappings (``vm.max_map_count``), where the next compile aborted the process; and calls
    slow down as programs pile up: test_lstsq_against_numpy's case took 46 s on 2 devices
    late in the suite, 6 s alone, and the 2-device suite took 840 s, 568 s with the programs
    dropped beyond 6000 mappings, 550 s beyond 2500."""
    yield
    if _budget is not None and _mappings() > _budget:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
