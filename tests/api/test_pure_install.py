"""jaxmg without its native engines, and the engine the default backend chooses.

jaxmg is pure Python: jaxmg-cuda (backends "mg" and "mp") is an optional install, imported at
the first call that needs it. Without it, ``import jaxmg`` works, the default backend chooses
"jax", and asking for "mg" or "mp" raises an ImportError naming the install command. The
default chooses a native engine only where it can run the call (jaxmg.engines.choose); the
multi-process cases run for real in tests/multiprocess (2 processes x 2 devices).
"""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxmg
from jaxmg import engines
from jaxmg.describe import processes
from jaxmg.engines import base

INSTALL = "pip install ./packages/jaxmg-layout ./packages/jaxmg-cuda ./packages/jaxmg"

#: Put first in ``sys.meta_path``: ``jaxmg_cuda`` then imports as if it were not installed.
BLOCK_NATIVE = textwrap.dedent(
    """
    import sys

    class NoNativeEngines:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "jaxmg_cuda":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoNativeEngines())
    """
)

PURE_PROGRAM = textwrap.dedent(
    """
    import sys

    import jax

    jax.config.update("jax_num_cpu_devices", 4)
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    assert "jaxmg_cuda" not in sys.modules
    n = 32
    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n))
    A = m @ m.T / n + np.eye(n)
    b = rng.standard_normal((n, 2))
    mesh = jax.make_mesh((4,), ("x",))
    for spec in (P(None, "x"), P("x", None)):
        a = jax.device_put(A, NamedSharding(mesh, spec))
        for backend in ("jax", None):
            assert jaxmg.engines.resolve(a, backend=backend).backend == "jax"
            x = np.asarray(jaxmg.potrs(a, b, backend=backend))
            residual = np.linalg.norm(A @ x - b) / (np.linalg.norm(A) * np.linalg.norm(x) * n)
            assert residual < 30 * np.finfo(np.float64).eps, (spec, backend, residual)
            w, V = (np.asarray(o) for o in jaxmg.syevd(a, backend=backend))
            np.testing.assert_allclose(w, np.linalg.eigvalsh(A), rtol=0, atol=1e-12)
            np.testing.assert_allclose(A @ V, V * w, rtol=0, atol=1e-12)
    for backend in ("mg", "mp"):
        try:
            jaxmg.potrs(a, b, backend=backend)
        except ImportError as error:
            print(f"{backend}: {error}")
        else:
            raise AssertionError(f"backend={backend!r} ran without jaxmg_cuda")
    assert "jaxmg_cuda" not in sys.modules
    print("ok")
    """
)


@pytest.mark.usefixtures("once_per_suite")
def test_jaxmg_runs_without_its_native_engines(tmp_path):
    """In a process where ``jaxmg_cuda`` cannot be imported: ``import jaxmg``, potrs and syevd
    on 4 CPU devices with backend "jax" and the default, against numpy; "mg" and "mp" raise an
    ImportError with the install command."""
    program = tmp_path / "pure.py"
    program.write_text(BLOCK_NATIVE + PURE_PROGRAM)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "ok", done.stdout
    mg, mp = lines[-3:-1]
    assert mg.startswith("mg: jaxmg.potrs: backend='mg' needs jaxmg's native engines"), mg
    assert f"{INSTALL}." in mg and "backend='jax' runs without them" in mg, mg
    assert mp.startswith("mp: jaxmg.potrs: backend='mp' needs jaxmg's native engines"), mp
    assert "./packages/jaxmg-cuda './packages/jaxmg[mpi]'" in mp, mp


@pytest.fixture
def no_native(monkeypatch):
    """This process as if jaxmg_cuda were not installed."""
    monkeypatch.setattr(base, "_native", ModuleNotFoundError("no jaxmg_cuda", name="jaxmg_cuda"))


@pytest.fixture
def fresh_participants():
    """The processes' cache emptied before and after a test that fakes the job."""
    processes.participants.cache_clear()
    yield
    processes.participants.cache_clear()


def test_default_without_native_engines_is_jax(no_native, cpu_devices):
    mesh = jax.make_mesh((len(cpu_devices),), ("x",))
    assert engines.choose(None, mesh, "x", "cpu").name == "jax"
    assert engines.choose(None, mesh, "x", "cpu", cyclic=True).name == "jax"
    assert not engines.ENGINES["mg"].available() and engines.ENGINES["jax"].available()
    n = 8 * mesh.size
    a = jax.device_put(np.eye(n) * 2.0, NamedSharding(mesh, P(None, "x")))
    np.testing.assert_allclose(np.asarray(jaxmg.potrs(a, np.ones(n))), np.full(n, 0.5))
    with pytest.raises(ImportError, match=r"jaxmg.syevd: backend='mg' needs .*jaxmg-cuda"):
        jaxmg.syevd(a, backend="mg")


def test_default_in_one_process(cpu_devices):
    """One process: a native engine on several devices where jaxmg-cuda is installed, JAX's own
    dense solvers on one, backend "jax" on a platform the native engines do not run on."""
    mesh = jax.make_mesh((len(cpu_devices),), ("x",))
    one = jax.make_mesh((1,), ("x",), devices=cpu_devices[:1])
    assert engines.choose(None, one, "x", "cpu").name == "jax"
    assert engines.choose(None, mesh, "x", "tpu").name == "jax"
    expected = "mg" if base.native_installed() and mesh.size > 1 else "jax"
    assert engines.choose(None, mesh, "x", "cpu").name == expected


def _job(monkeypatch, processes_count, local, hosts):
    """Fakes a job of ``processes_count`` processes with ``local`` CPU devices each, on
    ``hosts`` (a host per process)."""
    monkeypatch.setattr(jax, "process_count", lambda *a, **k: processes_count)
    monkeypatch.setattr(jax, "local_device_count", lambda *a, **k: local)
    monkeypatch.setattr(jax, "device_count", lambda *a, **k: processes_count * local)
    job = processes.Job(token=7, pids=tuple(range(100, 100 + processes_count)), hosts=hosts)
    monkeypatch.setattr(processes, "job", lambda: job)


@pytest.mark.usefixtures("once_per_suite", "fresh_participants")
def test_default_with_several_devices_per_process(monkeypatch):
    """2 processes x 2 devices, an axis over all 4, known only as an abstract mesh (under jit):
    no native engine can be shown to run it, so the default is "jax"; asked for by name, "mg"
    says why not and names "jax". One device per process on one host: "mg"; on two hosts:
    "mp"."""
    pytest.importorskip("jaxmg_cuda")
    mesh = jax.sharding.AbstractMesh((4,), ("x",))
    _job(monkeypatch, 2, 2, hosts=(1, 1))
    assert engines.choose(None, mesh, "x", "cpu").name == "jax"
    where = engines.geometry(mesh, "x", "rows", "cpu", None, "jaxmg.potrs")
    assert where.engine.name == "jax" and where.ndev == 4
    with pytest.raises(
        ValueError, match=r"cannot tell which processes hold the 4 devices.*backend='jax' runs"
    ):
        engines.geometry(mesh, "x", "rows", "cpu", engines.ENGINES["mg"], "jaxmg.potrs")
    processes.participants.cache_clear()
    _job(monkeypatch, 4, 1, hosts=(1, 1, 1, 1))
    assert engines.choose(None, mesh, "x", "cpu").name == "mg"
    processes.participants.cache_clear()
    _job(monkeypatch, 4, 1, hosts=(1, 1, 2, 2))
    assert engines.choose(None, mesh, "x", "cpu").name == "mp"


@pytest.mark.usefixtures("once_per_suite", "fresh_participants")
def test_default_without_native_engines_across_processes(monkeypatch, no_native):
    mesh = jax.sharding.AbstractMesh((4,), ("x",))
    _job(monkeypatch, 4, 1, hosts=(1, 1, 2, 2))
    assert engines.choose(None, mesh, "x", "cpu").name == "jax"
