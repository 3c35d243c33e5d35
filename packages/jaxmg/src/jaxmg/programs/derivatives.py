"""Every derivative: the rules (``jax.custom_jvp``), the jitted calls that run them, and the
factor objects (:class:`CholeskyFactor`, :class:`LUFactor`) that carry a factor and its ``A``
to them (the programs they run: :mod:`jaxmg.programs.routines`).

Derivatives (``jax.custom_jvp``, so ``jvp``, ``grad``, ``vjp`` and their compositions all work).
A solve ``x = A^-1 b`` is a ``lax.custom_linear_solve`` whose ``solve`` and ``transpose_solve``
are native solves with the forward factor, and whose ``matvec`` is ``A @ v`` on the sharded
``A``: the derivative costs one more solve with the same factor and a matrix-vector product,
never a second factorisation, and never gathers ``A``. For Hermitian routines ``matvec`` is the
Hermitian part ``(A + A^H) v / 2`` (without transposing ``A``): derivatives are those of
``X -> f((X + X^H) / 2)`` at ``X = A``, so a function of ``(S + S^H) / 2`` gets the right
gradient, and the gradient with respect to ``A`` is Hermitian. The log-determinant's derivative
``tr(A^-1 dA)`` takes the inverse from the same factor (``potri_factored``); ``potri`` and
``syevd`` differentiate through their own results (``dY = -Y dA Y``; the eigenvector rule of
``jnp.linalg.eigh``, for distinct eigenvalues). A failed factorisation gives NaN values and NaN
derivatives, never an exception.

Eager derivatives. The ``custom_jvp`` functions below are called only inside jitted programs
(``_potrs_call``, ``_potri_call``, ``_syevd_call``, ``_cho_solve_call``, ``_cho_logdet_call``,
``_lu_solve_call``, below), so that ``jax.grad``, ``jvp`` and ``vjp`` called eagerly
differentiate a program's jaxpr: the rules, and the zero tangents JAX makes for a factor's
arguments, are traced, and the devices come from the program's arguments. Run eagerly
instead, JAX would make those zeros, and the rules their reshards, as arrays of their own on
the abstract mesh of their type, which outside ``jax.set_mesh`` has no devices (on a mesh with
Explicit axes every derivative of a factor's solve failed so).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ..describe.call import Call
from ..describe.sharding import _explicit
from .local import (
    _columns_of,
    _from_columns,
    _hermitian_matvec,
    _hermitian_part_columns,
    _potri_local,
    _potrs_local,
    _ring,
    _ring_into,
    _same_everywhere,
    _syevd_local,
    _varying_like,
)
from .routines import (
    _cho_inverse_program,
    _cho_logdet_program,
    _cho_solve_program,
    _lu_solve_program,
    _potri_program,
    _potrs_program,
    _status,
    _syevd_program,
)

# --- derivatives: the pieces ----------------------------------------------------------------------


def _held(a):
    """A factor's ``A`` for a derivative rule; a factor made with ``donate=True`` holds none."""
    if a is None:
        raise ValueError(
            "jaxmg: this factor was made with donate=True, which gave A's buffer to the factor: "
            "its solves and logdet have no derivatives (they need A). Factor without donate= "
            "to differentiate, or donate A with jax.jit(..., donate_argnums=...) around the "
            "whole computation, derivatives included (XLA then keeps A as long as they need it)."
        )
    return a


def _float0(x):
    return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


class _Algebra:
    """Matrix products and transposes of ``A``-shaped arrays, in ``A``'s sharding.

    On a mesh with Explicit axes every product names its output sharding and a transpose is
    resharded back to ``A``'s (JAX refuses to guess); on Auto axes XLA chooses.
    """

    def __init__(self, call: Call):
        g = call.geometry
        self.explicit = _explicit(g.mesh, g.spec)
        self.matrix = NamedSharding(g.mesh, g.spec)
        self.replicated = NamedSharding(g.mesh, P())
        # The matvecs' [N, k] results, with a spec of their rank: under jax.vmap (jacfwd,
        # jacrev) JAX inserts the batch axis into a product's out_sharding at the batch
        # dimension's index, which P() has not (an AssertionError in jax 0.10-0.12).
        self.vectors = NamedSharding(g.mesh, P(None, None))

    def matmul(self, x, y, sharding):
        if self.explicit:
            return jnp.matmul(x, y, out_sharding=sharding)
        return x @ y

    def transpose(self, d, conjugate=True):
        """``d^H`` (``d^T`` without ``conjugate``) of an ``A``-shaped ``d``, sharded like ``A``."""
        t = (jnp.conj(d) if conjugate else d).T
        return jax.sharding.reshard(t, self.matrix) if self.explicit else t

    def replicate(self, x):
        return jax.sharding.reshard(x, self.replicated) if self.explicit else x

    def hermitian_part(self, d):
        return 0.5 * (d + self.transpose(d))

    def products(self, *factors):
        """``f1 @ f2 @ ...`` of ``A``-shaped matrices, sharded like ``A``."""
        out = factors[0]
        for f in factors[1:]:
            out = self.matmul(out, f, self.matrix)
        return out

    # matvecs: ``A``-shaped ``a``, replicated ``v`` (``[N, k]``), replicated results
    def general(self, a, v):
        return self.matmul(a, v, self.vectors)

    def adjoint(self, a, v):
        """``A^H v`` without transposing ``A``: ``conj(v^H A)^T``."""
        return jnp.conj(self.matmul(jnp.conj(v).T, a, self.vectors)).T

    def transposed(self, a, v):
        """``A^T v`` without transposing ``A``: ``(v^T A)^T``."""
        return self.matmul(v.T, a, self.vectors).T

    def hermitian(self, a, v):
        """``(A + A^H) v / 2``."""
        return 0.5 * (self.general(a, v) + self.adjoint(a, v))


def _linear_solve(matvec, a, b, solve, transpose_solve):
    """``x`` with ``matvec(a, x) = b``, differentiable in ``a`` (through ``matvec``) and ``b``."""
    return jax.lax.custom_linear_solve(
        lambda v: matvec(a, v),
        b,
        solve=lambda _, r: solve(r),
        transpose_solve=lambda _, r: transpose_solve(r),
    )


def _cholesky_solves(call: Call, f):
    """``(solve, transpose_solve)`` with a Cholesky factor: ``A^T = conj(A)``."""

    def solve(r):
        return _cho_solve_program(call, f, r)

    return solve, lambda r: jnp.conj(solve(jnp.conj(r)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _cholesky_solution(call: Call, f, x, a, b):
    """``A^-1 b`` when it is already known (``x``, with ``A``'s factor ``f``): ``x`` itself,
    with the derivatives of the solve. Saves the forward solve a derivative would repeat."""
    return x


@_cholesky_solution.defjvp
def _cholesky_solution_jvp(call, primals, tangents):
    f, x, a, b = primals
    _, _, da, db = tangents
    x = _cholesky_solution(call, f, x, a, b)
    algebra = _Algebra(call)
    solve, transpose_solve = _cholesky_solves(call, f)
    # A dx = db - dA_h x, solved with the factor (linear in the tangents, transposable).
    rhs = db - algebra.hermitian(da, x)
    return x, _linear_solve(algebra.hermitian, a, rhs, solve, transpose_solve)


# --- differentiable functions of the global arrays ------------------------------------------------


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def potrs_and_logdet(call: Call, logdet: bool, a, b):
    """``(x, logdet or None, status)``; one native call (factor and solve)."""
    if not logdet:
        x, status = _potrs_program(call, a, b)
        return x, None, _status(status)
    x, f, status = _potrs_program(call, a, b, with_factor=True)
    return x, _cho_logdet_program(call, f), _status(status)


@potrs_and_logdet.defjvp
def _potrs_and_logdet_jvp(call, logdet, primals, tangents):
    a, b = primals
    da, db = tangents
    # One native call, as without derivatives: the solution and the factor the derivatives
    # reuse. Both are constants of the rule (derivatives flow through `a` and `b`), so the
    # rule itself is differentiable: derivatives of any order.
    x, f, status = _potrs_program(
        call, jax.lax.stop_gradient(a), jax.lax.stop_gradient(b), with_factor=True
    )
    x, dx = jax.jvp(functools.partial(_cholesky_solution, call, f, x), (a, b), (da, db))
    status = _status(status)
    if not logdet:
        return (x, None, status), (dx, None, _float0(status))
    value, dvalue = _logdet_jvp(call, f, a, da)
    return (x, value, status), (dx, dvalue, _float0(status))


def _logdet_jvp(call: Call, f, a, da):
    """``log det A`` and its derivative."""
    return cho_logdet_with(call, f, a), _logdet_tangent(call, f, a, da)


def _logdet_tangent(call: Call, f, a, da):
    """``Re tr(A^-1 dA) = Re sum(conj(A^-1) * dA)`` (``A^-1`` Hermitian), ``A^-1`` from ``f``."""
    inverse = cho_inverse_with(call, f, a)
    return jnp.real(jnp.sum(jnp.conj(inverse) * da))


def _inverse_tangent(call: Call, inverse, da):
    """``dY = -Y dA_h Y`` for ``Y = A^-1``."""
    algebra = _Algebra(call)
    return -algebra.hermitian_part(algebra.products(inverse, da, inverse))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def cho_inverse_with(call: Call, f, a):
    """``A^-1`` from its factor ``f`` (``a`` is there for the derivative only)."""
    return _cho_inverse_program(call, f)


@cho_inverse_with.defjvp
def _cho_inverse_with_jvp(call, primals, tangents):
    f, a = primals
    _, da = tangents
    inverse = cho_inverse_with(call, f, a)
    return inverse, _inverse_tangent(call, inverse, da)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def cho_solve_with(call: Call, f, a, b):
    """``A^-1 b`` with ``A``'s factor ``f`` (``a`` is there for the derivative only)."""
    return _cho_solve_program(call, f, b)


@cho_solve_with.defjvp
def _cho_solve_with_jvp(call, primals, tangents):
    f, a, b = primals
    _, da, db = tangents
    a = _held(a)
    # As potrs's rule: the solution is a constant of the rule and its derivative a solve with
    # the factor, linear in (dA, db). Not the derivative of a linear solve in A: transposing
    # that solve's matvec through A's tangent adds cotangents of two shardings on Explicit
    # axes, which JAX refuses.
    x = _cho_solve_program(call, f, jax.lax.stop_gradient(b))
    return jax.jvp(functools.partial(_cholesky_solution, call, f, x), (a, b), (da, db))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def cho_logdet_with(call: Call, f, a):
    """``log det A`` from its factor ``f`` (``a`` is there for the derivative only)."""
    return _cho_logdet_program(call, f)


@cho_logdet_with.defjvp
def _cho_logdet_with_jvp(call, primals, tangents):
    f, a = primals
    _, da = tangents
    a = _held(a)
    return _cho_logdet_program(call, f), _logdet_tangent(call, f, a, da)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def lu_solve_with(call: Call, trans: str, lu, pivots, a, b):
    """``op(A)^-1 b`` with ``A``'s LU factor (``a`` is there for the derivative only)."""
    return _lu_solve_program(call, trans, lu, pivots, b)


@lu_solve_with.defjvp
def _lu_solve_with_jvp(call, trans, primals, tangents):
    lu, pivots, a, b = primals
    da, db = tangents[2], tangents[3]
    a = _held(a)
    transposed = {"N": "T", "T": "N", "C": "N"}[trans]

    def solve(r):
        return _lu_solve_program(call, trans, lu, pivots, r)

    def transpose_solve(r):  # op(A)^T x = r
        if trans == "C":  # (A^H)^T = conj(A): x = conj(A^-1 conj(r))
            return jnp.conj(_lu_solve_program(call, "N", lu, pivots, jnp.conj(r)))
        return _lu_solve_program(call, transposed, lu, pivots, r)

    algebra = _Algebra(call)
    matvec = {"N": algebra.general, "T": algebra.transposed, "C": algebra.adjoint}[trans]

    def x_of(a, b):
        return _linear_solve(matvec, a, b, solve, transpose_solve)

    return jax.jvp(x_of, (a, b), (da, db))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def potri_differentiable(call: Call, a):
    """``(A^-1, status)``."""
    inverse, status = _potri_program(call, a)
    return inverse, _status(status)


@potri_differentiable.defjvp
def _potri_jvp(call, primals, tangents):
    (a,), (da,) = primals, tangents
    inverse, status = potri_differentiable(call, a)
    return (inverse, status), (_inverse_tangent(call, inverse, da), _float0(status))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def syevd_differentiable(call: Call, vectors: bool, a):
    """``(w, V or None, status)``."""
    out = _syevd_program(call, a, vectors)
    if vectors:
        w, v, status = out
        return w, v, _status(status)
    w, status = out
    return w, None, _status(status)


@syevd_differentiable.defjvp
def _syevd_jvp(call, vectors, primals, tangents):
    (a,), (da,) = primals, tangents
    w, v, status = syevd_differentiable(call, True, a)
    algebra = _Algebra(call)
    dav = algebra.products(algebra.hermitian_part(da), v)  # dA_h V
    # diag(V^H dA_h V), without a gather from the sharded product.
    dw = algebra.replicate(jnp.real(jnp.sum(jnp.conj(v) * dav, axis=0)).astype(w.dtype))
    if not vectors:
        return (w, None, status), (dw, None, _float0(status))
    gaps = w[None, :] - w[:, None]
    eye = jnp.eye(w.shape[0], dtype=bool)
    inverse_gaps = jnp.where(eye, 0, 1 / jnp.where(eye, 1, gaps))
    s = algebra.products(algebra.transpose(v), dav)  # V^H dA_h V
    dv = algebra.products(v, inverse_gaps.astype(s.dtype) * s)
    return (w, v, status), (dw, dv, _float0(status))


# --- on local blocks, inside a user's shard_map (the *_no_shardmap functions) ---------------------
#
# The same derivatives as the global functions' (those of X -> f((X + X^H) / 2) at X = A), on each
# device's block of A in the call's form and layout: potrs's is one more solve with the forward
# factor and a matrix-vector product with the blocks; potri's (-Y dA_h Y) and syevd's (JAX's eigh
# rule) are products of column blocks passed around the ring (local._ring, local._ring_into), so
# that no device holds more than a few blocks. A process grid (sharded_by="grid") has none.


def _local_cholesky_solves(call: Call, f):
    """``(solve, transpose_solve)`` with the factor ``f`` of the local blocks' potrs."""

    def solve(r):
        route = call.route()
        x, _ = call.native().potrs_factored(
            f, call.conj(r.T), call.position(), **call.native_kw(route)
        )
        return call.conj(x.T)

    return solve, lambda r: jnp.conj(solve(jnp.conj(r)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _local_cholesky_solution(call: Call, f, x, a, b):
    """:func:`_cholesky_solution` on local blocks: ``x = A^-1 b`` with ``A``'s factor ``f``."""
    return x


@_local_cholesky_solution.defjvp
def _local_cholesky_solution_jvp(call, primals, tangents):
    f, x, a, b = primals
    _, _, da, db = tangents
    x = _local_cholesky_solution(call, f, x, a, b)
    solve, transpose_solve = _local_cholesky_solves(call, f)

    # lax.custom_linear_solve types its solution as varying where A does: the right-hand side
    # and the products are typed so too (the same on every device all the same), and the
    # solution back like x
    def matvec(a, v):
        return _varying_like(_hermitian_matvec(call, a, v), a)

    rhs = db - matvec(da, x)
    return x, _same_everywhere(_linear_solve(matvec, a, rhs, solve, transpose_solve), x)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def potrs_local(call: Call, a, b):
    """``(x, status)`` from the local block ``a`` and ``b`` ``[N, k]``, as
    :func:`jaxmg.programs.local._potrs_local`, differentiable as :func:`potrs_and_logdet`."""
    return _potrs_local(call, a, b)


@potrs_local.defjvp
def _potrs_local_jvp(call, primals, tangents):
    a, b = primals
    da, db = tangents
    x, f, status = _potrs_local(
        call, jax.lax.stop_gradient(a), jax.lax.stop_gradient(b), with_factor=True
    )
    f = _varying_like(f, a)  # each device's own (a native target's result is typed as no axis's)
    x, dx = jax.jvp(functools.partial(_local_cholesky_solution, call, f, x), (a, b), (da, db))
    return (x, status), (dx, _float0(status))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def potri_local(call: Call, a):
    """``(inverse block, status)`` as :func:`jaxmg.programs.local._potri_local`, with the
    derivative ``dY = -Y dA_h Y``."""
    inverse, status = _potri_local(call, a)
    return _varying_like(inverse, a), status  # a native target's result is typed as no axis's


@potri_local.defjvp
def _potri_local_jvp(call, primals, tangents):
    (a,), (da,) = primals, tangents
    inverse, status = potri_local(call, a)
    axis = call.geometry.axis
    y = _columns_of(inverse, call, hermitian=True)  # Y[:, blk]
    t = _ring(_hermitian_part_columns(da, call), y, axis)  # (dA_h Y)[:, blk]
    dy = -_ring(t, y, axis, adjoint=True)  # (dA_h Y)^H Y = Y dA_h Y, both Hermitian
    return (inverse, status), (_from_columns(dy, call, hermitian=True), _float0(status))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def syevd_local(call: Call, vectors: bool, v_columns: bool, a):
    """``(w, v block, status)``, or ``(w, status)`` without ``vectors``, as
    :func:`jaxmg.programs.local._syevd_local`, with the derivatives of :func:`_syevd_jvp`."""
    if not vectors:
        return _syevd_local(call, a, False)
    w, v, status = _syevd_local(call, a, True, v_columns=v_columns)
    return w, _varying_like(v, a), status  # a native target's result is typed as no axis's


@syevd_local.defjvp
def _syevd_local_jvp(call, vectors, v_columns, primals, tangents):
    (a,), (da,) = primals, tangents
    w, v, status = syevd_local(call, True, v_columns, a)
    axis = call.geometry.axis
    vc = v if v_columns else _columns_of(v, call)  # V[:, blk]
    y = _ring(_hermitian_part_columns(da, call), vc, axis)  # (dA_h V)[:, blk]
    s = _ring(y, vc, axis, adjoint=True)  # (V^H dA_h V)[:, blk], Hermitian
    width = s.shape[1]
    local = jnp.arange(width, dtype=jnp.int32)
    mine = call.position() * width + local  # this device's columns
    diagonal = jnp.real(s[mine, local]).astype(w.dtype)
    dw = jax.lax.psum(jnp.zeros_like(w).at[mine].set(diagonal, unique_indices=True), axis)
    if not vectors:
        return (w, status), (dw, _float0(status))
    gaps = w[None, :] - w[mine][:, None]  # [blk, N]: w_j - w_i
    own = mine[:, None] == jnp.arange(w.shape[0], dtype=jnp.int32)[None, :]
    inverse_gaps = jnp.where(own, 0, 1 / jnp.where(own, 1, gaps)).astype(s.dtype)
    dvc = _ring_into(vc, inverse_gaps * jnp.conj(s).T, axis)  # V (F o S), F o S's rows blk
    dv = dvc if v_columns else _from_columns(dvc, call)
    return (w, v, status), (dw, dv, _float0(status))


# --- the differentiable calls, one jitted program each --------------------------------------------

# The public functions' differentiable calls as one program each: an eager call then dispatches
# once (a custom_jvp function called eagerly costs about 150 us more per call, measured on one
# CPU device at N = 64), and a status nobody asked for is not computed (on one device it takes
# a loop of its own); under an enclosing jit they are inlined. And an eager derivative
# differentiates the program's jaxpr, so the derivative rules always run traced (module
# docstring).


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _potrs_call(call, logdet, status, b_shape, a, b):
    x, value, info = potrs_and_logdet(call, logdet, a, b.reshape(call.n, -1))
    return x.reshape(b_shape), value, (info if status else None)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _potri_call(call, status, a):
    inverse, info = potri_differentiable(call, a)
    return inverse, (info if status else None)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _syevd_call(call, vectors, status, a):
    w, v, info = syevd_differentiable(call, vectors, a)
    return w, v, (info if status else None)


# The differentiable calls of the factor objects, one jitted program each, as
# ``_potrs_call``: never call a custom_jvp function above outside one (module docstring).


@functools.partial(jax.jit, static_argnums=(0, 1))
def _cho_solve_call(call: Call, shape, f, a, b):
    return cho_solve_with(call, f, a, b.reshape(call.n, -1)).reshape(shape)


@functools.partial(jax.jit, static_argnums=0)
def _cho_logdet_call(call: Call, f, a):
    return cho_logdet_with(call, f, a)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _lu_solve_call(call: Call, trans: str, shape, lu, pivots, a, b):
    return lu_solve_with(call, trans, lu, pivots, a, b.reshape(call.n, -1)).reshape(shape)


# --- factor objects -------------------------------------------------------------------------------


@jax.tree_util.register_pytree_node_class
class CholeskyFactor:
    """The Cholesky factor of a Hermitian positive definite ``A``, for :func:`jaxmg.cho_solve`.

    Made by :func:`jaxmg.cho_factor`. A registered pytree: it goes in and out of ``jax.jit``,
    ``jax.lax.scan`` and the like, and stays sharded over the devices of ``A``.

    Holds:
      factor: ``L`` with ``A = L L^H`` (of ``conj(A)`` when ``A`` is sharded by rows), in the
        layout cuSolverMg wants: every device keeps its block-cyclic tiles as ``[W, N]`` rows
        (column-major ``N x W``, ``W`` the local width plus the in-place relayout's room), one
        ``[ndev * W, N]`` array sharded ``P(ax, None)``. On a process grid ``P(r, c)``: every
        process's ``[Lc, Lr]`` local array, sharded ``P(r, c)``. Whose buffer: by default a
        buffer of its own, one more copy of ``A``'s size (``A`` survives); made with
        ``donate=True``, or under ``jax.jit`` with ``A`` donated and nothing reading ``A``
        afterwards, ``A``'s own buffer (row-sharded ``A`` whose tile divides ``N / ndev``: no
        copy at all; column-sharded: ``A``'s block is transposed first, one block more while
        the factor is made).
      matrix: ``A`` itself, as given (a reference, not a copy): derivatives with respect to
        ``A`` flow through it, the factor being the forward pass's. ``None`` for a factor made
        with ``donate=True`` (``A`` is gone): its solves and ``logdet`` then have no
        derivatives and say so.
      status: int32 scalar, 0 on success, ``k > 0`` if the leading minor of order ``k`` is not
        positive definite (the factor is then NaN, and so is everything made from it).
    """

    def __init__(self, factor, matrix, status, call: Call):
        self.factor, self.matrix, self.status, self._call = factor, matrix, status, call

    def tree_flatten(self):
        return (self.factor, self.matrix, self.status), self._call

    @classmethod
    def tree_unflatten(cls, call, children):
        return cls(*children, call)

    @property
    def logdet(self):
        """``log det A`` (real; NaN when the factorisation failed), differentiable in ``A``."""
        return _cho_logdet_call(self._call, self.factor, self.matrix)

    @property
    def shape(self):
        return (self._call.n, self._call.n)

    def __repr__(self):
        g = self._call.geometry
        return (
            f"CholeskyFactor(N={self._call.n}, T_A={self._call.T_A}, axis={g.axis!r}, "
            f"form={g.form!r}, ndev={g.ndev})"
        )


@jax.tree_util.register_pytree_node_class
class LUFactor:
    """The LU factorisation with partial pivoting ``P A = L U`` of a square ``A``, for
    :func:`jaxmg.lu_solve`.

    Made by :func:`jaxmg.lu_factor`; a registered pytree like :class:`CholeskyFactor`.

    Holds:
      factor: ``L`` (unit lower) and ``U`` of ``A`` (of ``A^T`` for a row-sharded ``A`` given in
        the block-cyclic layout, ``cyclic_1d``), laid out as :attr:`CholeskyFactor.factor`:
        ``[ndev * W, N]`` sharded ``P(ax, None)``, in its own buffer or, with ``donate=True``
        (or ``A`` donated to your ``jax.jit``), in ``A``'s (a row-sharded ``A`` is transposed
        first: two blocks more while it is factored).
      pivots: int32 ``[ndev * W]`` sharded ``P(ax)``: each device's entries belong to its
        local block-cyclic columns (LAPACK's 1-based ``ipiv``, as cuSolverMg distributes it).
        On a process grid, every process's ScaLAPACK ``ipiv``, sharded ``P((r, c))``.
      matrix: ``A`` itself (a reference): derivatives with respect to ``A`` flow through it;
        ``None`` with ``donate=True`` (no derivatives then).
      status: int32 scalar, 0 on success, ``k > 0`` if ``U[k-1, k-1]`` is exactly zero (the
        factor is then NaN, and so is every solve with it).
    """

    def __init__(self, factor, pivots, matrix, status, call: Call):
        self.factor, self.pivots, self.matrix, self.status = factor, pivots, matrix, status
        self._call = call

    def tree_flatten(self):
        return (self.factor, self.pivots, self.matrix, self.status), self._call

    @classmethod
    def tree_unflatten(cls, call, children):
        return cls(*children, call)

    @property
    def shape(self):
        return (self._call.n, self._call.n)

    def __repr__(self):
        g = self._call.geometry
        return (
            f"LUFactor(N={self._call.n}, T_A={self._call.T_A}, axis={g.axis!r}, "
            f"form={g.form!r}, ndev={g.ndev})"
        )
