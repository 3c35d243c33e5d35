"""The matrices and meshes the API tests share (imported by name: ``from matrices import hpd``).

Every matrix is drawn from ``numpy.random.default_rng(seed)`` in double precision (complex
dtypes take a second draw for the imaginary part) and cast last, so one seed gives the same
matrix in every dtype up to rounding.
"""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

#: The four dtypes, single precision marked for the 4-device run only (tests/conftest.py).
DTYPES = [
    pytest.param(np.float32, marks=pytest.mark.dtype_sweep),
    np.float64,
    pytest.param(np.complex64, marks=pytest.mark.dtype_sweep),
    np.complex128,
]
#: The 1D forms, by the name the tests give them.
FORMS = {"cols": P(None, "x"), "rows": P("x", None)}


def random(n, dtype=np.float64, seed=0, cols=None):
    """A ``[n, cols]`` (square by default) standard normal matrix of ``dtype``."""
    rng = np.random.default_rng(seed)
    shape = (n, n if cols is None else cols)
    m = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal(shape)
    return m.astype(dtype)


def hpd(n, dtype=np.float64, seed=0, shift=1.0):
    """A Hermitian positive definite ``M M^H / n + shift I`` (eigenvalues at least ``shift``)."""
    m = random(n, np.complex128 if np.dtype(dtype).kind == "c" else np.float64, seed)
    return (m @ m.conj().T / n + shift * np.eye(n)).astype(dtype)


def mesh_of(axis_type=AxisType.Explicit, name="x"):
    """Every device on one mesh axis ``name`` of ``axis_type``."""
    return jax.make_mesh((jax.device_count(),), (name,), axis_types=(axis_type,))


def several_devices_mesh():
    """:func:`mesh_of`, or a skip where the suite runs on one device (the engine of
    collectives runs on several)."""
    if jax.device_count() == 1:
        pytest.skip("the engine of collectives runs on several devices")
    return mesh_of()


def put(a, mesh, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))
