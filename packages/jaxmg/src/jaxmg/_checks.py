"""Input validation shared by the solvers: every check runs in Python, before any device work."""

from __future__ import annotations

import numpy as np

import jaxmg_layout

SUPPORTED_DTYPES = tuple(
    np.dtype(name) for name in ("float32", "float64", "complex64", "complex128")
)
_DTYPE_NAMES = ", ".join(d.name for d in SUPPORTED_DTYPES)

#: cuSolverMg's syevd refuses column tiles wider than this (reported by the earlier jaxmg; the
#: GPU path has not yet run on hardware in this project, so the limit is not re-measured).
SYEVD_MAX_TILE = 1024


RELAYOUTS = ("native", "jax")


def relayout(value, fn: str) -> str:
    """The relayout strategy, or a ValueError naming the accepted ones."""
    if not isinstance(value, str) or value not in RELAYOUTS:
        raise ValueError(
            f"{fn}: relayout must be 'native' (in place, inside the solver call) or 'jax' "
            f"(JAX collectives), got {value!r}."
        )
    return value


def matrix_dtype(a, fn: str, argname: str = "A") -> np.dtype:
    """The dtype of a 2-D matrix argument, or a TypeError/ValueError saying what is accepted."""
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"{fn}: {argname} must be a jax.Array, got {type(a).__name__}.")
    if len(shape) != 2:
        raise ValueError(f"{fn}: {argname} must be 2-D [N, N], got shape {tuple(shape)}.")
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{fn}: {argname} has dtype {dtype.name}; accepted: {_DTYPE_NAMES}.")
    return dtype


def square_size(a, fn: str, argname: str = "A") -> int:
    n_rows, n_cols = a.shape
    if n_rows != n_cols:
        raise ValueError(f"{fn}: {argname} must be square [N, N], got shape {tuple(a.shape)}.")
    return int(n_rows)


def rhs_shape(b, n: int, dtype: np.dtype, fn: str) -> tuple[int, ...]:
    """Check ``b`` is ``[N]`` or ``[N, nrhs]`` with A's dtype; return its shape."""
    shape = getattr(b, "shape", None)
    if shape is None or getattr(b, "dtype", None) is None:
        raise TypeError(f"{fn}: b must be a jax.Array, got {type(b).__name__}.")
    if len(shape) not in (1, 2) or shape[0] != n or (len(shape) == 2 and shape[1] < 1):
        raise ValueError(
            f"{fn}: b must have shape [{n}] or [{n}, nrhs] with nrhs >= 1 to match A of size "
            f"{n}, got {tuple(shape)}."
        )
    if np.dtype(b.dtype) != dtype:
        raise TypeError(
            f"{fn}: b has dtype {np.dtype(b.dtype).name} but A has {dtype.name}; they must be "
            "equal (cast one of them)."
        )
    return tuple(shape)


def tile_size(T_A, fn: str) -> int:
    if isinstance(T_A, bool) or not isinstance(T_A, (int, np.integer)):
        raise TypeError(f"{fn}: T_A must be a positive int, got {T_A!r}.")
    if T_A <= 0:
        raise ValueError(f"{fn}: T_A must be a positive int, got {T_A}.")
    return int(T_A)


def plan(n: int, ndev: int, T_A: int, fn: str) -> jaxmg_layout.CyclicPlan:
    """The block-cyclic plan, with the layout's error messages prefixed by the call."""
    if n % ndev:
        raise ValueError(
            f"{fn}: N={n} is not divisible by the {ndev} devices of the sharded axis; jaxmg "
            "needs equal shards (pad A, or use a device count that divides N)."
        )
    try:
        return jaxmg_layout.CyclicPlan.make(n, ndev, T_A)
    except (ValueError, TypeError) as err:
        raise type(err)(f"{fn}: {err}") from None


def cyclic_shape(a, geometry, T_A: int, fn: str) -> int:
    """For ``cyclic_1d=True``: check A has the block-cyclic global shape; return N."""
    n = int(a.shape[1 - geometry.sharded_dim])
    layout = plan(n, geometry.ndev, T_A, fn)
    expected = [n, n]
    expected[geometry.sharded_dim] = geometry.ndev * layout.local_width
    if tuple(a.shape) != tuple(expected):
        raise ValueError(
            f"{fn}: with cyclic_1d=True, A must already be in the block-cyclic layout of "
            f"jaxmg.cyclic_1d_layout(A, T_A={T_A}), of shape {tuple(expected)}; got "
            f"{tuple(a.shape)}."
        )
    return n
