"""The matrices and meshes the API tests share (imported by name: ``from matrices import hpd``).

Every matrix is drawn from ``numpy.random.default_rng(seed)`` in double precision (complex
dtypes take a second draw for the imaginary part) and cast last, so one seed gives the same
matrix in every dtype up to rounding.
"""

import jax
import numpy as np
from jax.sharding import AxisType


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
