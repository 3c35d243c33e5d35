"""The polar decomposition of a sharded matrix by QDWH, and the SVD from it.

QDWH (Nakatsukasa, Bai, Gygi 2010) takes ``X_0 = A / ||A||_F`` to the unitary polar factor ``U`` of
``A = U H`` with the dynamically weighted Halley iteration ``X <- X (a I + b X^H X) (I + c X^H
X)^{-1}``, whose weights ``a, b, c`` follow from a lower bound ``l`` of ``X``'s smallest singular
value. They depend on ``l`` alone, so the whole sequence is fixed before the program runs: from
``l_0 = ε`` (the matrix's condition number is not known; every singular value above ``ε ||A||_F``
converges) about six iterations reach ``l = 1`` in float64. While ``c > 100`` an iteration is the
QR-based one, which is stable at any condition number: ``[sqrt(c) X; I] = [Q_1; Q_2] R`` and ``X <-
(b / c) X + (a - b / c) / sqrt(c) Q_1 Q_2^H``; after, the Cholesky-based one, ``X <- (b / c) X + (a
- b / c) X (I + c X^H X)^{-1}``, which is stable there (Nakatsukasa, Higham 2013). Everything is
sharded like ``A``: the QR is :mod:`jaxmg.decompositions.qr`'s CholeskyQR2, or shifted CholeskyQR3
where that is not enough, of the stacked matrix (each device stacks its own rows of ``X`` and of
``I``: a row permutation, which changes neither ``R`` nor ``Q_1 Q_2^H``; its first Gram matrix is
``c X^H X + I``, made from ``X``); the inverse is ``potri``'s; the products and triangular solves
are the ring ones of :mod:`jaxmg.decompositions.products`.

The SVD is then ``H = V diag(s) V^H`` by ``syevd`` (``N x N``, Hermitian) and ``A = (U V)
diag(s) V^H``, as JAX's own TPU ``svd`` does on one device (``jax/_src/tpu/linalg/svd.py``): an
eigensolver of ``N`` columns instead of the Jordan-Wielandt matrix's ``M + N``, and no matrix
larger than ``A`` and two ``N x N`` ones per device. The singular values are ``H``'s
eigenvalues, so they carry ``syevd``'s absolute error, ``O(ε ||A||)``.

Taken by ``svd`` (``full_matrices=False``), ``polar`` and ``lstsq`` for ``M >= N`` with ``N``
divisible by the devices (:func:`applies`); other shapes keep the Jordan-Wielandt route of
:mod:`jaxmg.decompositions.svd`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..solvers import hermitian
from . import products
from .glue import _engine, _engine_inverts, _glue, _h
from .qr import _frobenius2, cholesky_upper, orthonormal_factor

#: Iterations with ``c`` above this are QR-based (Nakatsukasa, Higham 2013's threshold).
_QR_ABOVE = 100.0


def weights(eps: float) -> list[tuple[float, float, float]]:
    """QDWH's ``(a, b, c)`` for each iteration, from ``l_0 = eps`` until ``1 - l < 10 eps``
    (float64: six iterations, two of them QR-based; float32: four, two)."""
    out, low = [], eps
    while 1 - low >= 10 * eps and len(out) < 20:
        low2 = low * low
        d = (4 * (1 - low2) / (low2 * low2)) ** (1 / 3)
        a = math.sqrt(1 + d) + 0.5 * math.sqrt(
            8 - 4 * d + 8 * (2 - low2) / (low2 * math.sqrt(1 + d))
        )
        b = (a - 1) ** 2 / 4
        c = a + b - 1
        out.append((a, b, c))
        low = min(1.0, low * (a + b * low2) / (1 + c * low2))
    return out


def applies(geometry, shape) -> bool:
    """Whether the QDWH route runs (for reduced factors): ``M >= N``, ``N`` divisible by the
    devices (its ``N x N`` matrices are factored by ``cho_factor`` over them), the 1D forms."""
    m, n = shape
    return (
        geometry.form in ("rows", "cols") and m >= n and n % geometry.ndev == 0
        and (geometry.form == "cols" or m % geometry.ndev == 0)
    )  # fmt: skip


def _local_identity(n, geometry, dtype):
    """This device's block of ``I_N`` sharded like ``A`` (inside ``shard_map``)."""
    me = lax.axis_index(geometry.axis)
    width = n // geometry.ndev
    ids = jnp.arange(n, dtype=me.dtype)
    ids = ids[None, :] if geometry.form == "rows" else ids[:, None]
    local = me * width + jnp.arange(width, dtype=me.dtype)
    local = local[:, None] if geometry.form == "rows" else local[None, :]
    return (ids == local).astype(dtype)


def _map(geometry, f, *args):
    """``f`` on each device's blocks (every operand and result sharded like ``A``)."""
    spec = geometry.spec
    return jax.shard_map(
        f, mesh=geometry.mesh, in_specs=(spec,) * len(args), out_specs=spec, check_vma=False
    )(*args)


def _adjoint(geometry, x):
    """``X^H`` of a square ``X``, sharded like ``A``."""
    return _glue(geometry, geometry.spec, _h, x)


def _shifted_gram(geometry, x, c):
    """``I + c X^H X``, sharded like ``A`` (a ring product)."""
    n = x.shape[1]
    g = products.gram(x, x, geometry.mesh, geometry.spec)
    return _glue(geometry, geometry.spec, lambda g: c * g + jnp.eye(n, dtype=g.dtype), g)


def _qr_step(geometry, x, a, b, c):
    """``(b / c) X + (a - b / c) / sqrt(c) Q_1 Q_2^H`` with ``[sqrt(c) X; I] = [Q_1; Q_2] R``."""
    m, n = x.shape
    rows = geometry.form == "rows"
    p = geometry.ndev
    root = math.sqrt(c)

    def stack(x):  # this device's rows of sqrt(c) X over its rows of I (by rows), or [.; .]
        return jnp.concatenate([root * x, _local_identity(n, geometry, x.dtype)], axis=0)

    # cond(Y) <= sqrt(c) (and <= cond(A)): CholeskyQR2 below ε^{-1/2} / 100, shifted
    # CholeskyQR3 above, a choice made before the program runs (deciding at run time, as qr
    # does, costs here about what it saves). Y's first Gram matrix is I + c X^H X, made from X:
    # half the work of Y^H Y.
    plain = root < 0.01 / math.sqrt(float(np.finfo(x.dtype).eps))
    shifted = (False, False) if plain else (True, False, False)
    g = _shifted_gram(geometry, x, c)
    q, status = orthonormal_factor(geometry, _map(geometry, stack, x), shifted, g)
    split = m // p if rows else m

    q1 = _map(geometry, lambda q: q[:split], q)
    q2 = _map(geometry, lambda q: q[split:], q)
    update = products.times(q1, _adjoint(geometry, q2), geometry.mesh, geometry.spec)
    x = _glue(
        geometry, geometry.spec, lambda x, u: (b / c) * x + ((a - b / c) / root) * u, x, update
    )
    return x, status


def _cholesky_step(geometry, x, a, b, c, inverse=None):
    """``(b / c) X + (a - b / c) X Z^{-1}`` with ``Z = I + c X^H X``. Here ``c <= 100``, so
    ``cond(Z) <= 101``: ``Z^{-1}`` itself (``potri``) and one ring product are as accurate as
    the two triangular solves with ``Z``'s Cholesky factor ``W^H W``, and on CPUs cheaper. The
    solves run where the engine has no inverse (backend ``"mp"`` on GPUs), or with
    ``inverse=False``."""
    n = x.shape[1]
    spec, mesh = geometry.spec, geometry.mesh
    z = _shifted_gram(geometry, x, c)
    options = dict(T_A=n // geometry.ndev, mesh=mesh, in_specs=spec, backend=_engine(geometry))
    if _engine_inverts(geometry) if inverse is None else inverse:
        z_inv, status = hermitian.potri(z, return_status=True, **options)
        y = products.times(x, z_inv, mesh, spec)
    else:
        w, status = cholesky_upper(geometry, z)
        y = products.right_triangular_solve(x, w, mesh, spec)
        y = products.right_triangular_solve(y, _adjoint(geometry, w), mesh, spec, lower=True)
    x = _glue(geometry, spec, lambda x, y: (b / c) * x + (a - b / c) * y, x, y)
    return x, status


@functools.partial(jax.jit, static_argnums=0)
def polar_unitary(geometry, a):
    """``(U, status)``: the unitary polar factor of ``a`` (``M >= N``, :func:`applies`),
    sharded like ``a``; the status is the first failed factorisation's (``U`` is then NaN)."""
    eps = float(np.finfo(a.dtype).eps)
    norm = jnp.sqrt(_glue(geometry, jax.sharding.PartitionSpec(), _frobenius2, a))
    x = _glue(
        geometry, geometry.spec, lambda a, s: a / jnp.where(s > 0, s, 1).astype(a.dtype), a, norm
    )
    status = jnp.asarray(0, jnp.int32)
    ws = weights(eps)  # c decreases: the QR-based iterations come first
    qr_based = sum(c > _QR_ABOVE for _, _, c in ws)
    for a_k, b_k, c_k in ws[:qr_based]:
        x, st = _qr_step(geometry, x, a_k, b_k, c_k)
        status = jnp.where(status == 0, st, status)

    def cholesky_based(carry, w):  # one program for them all: they differ only in weights
        x, status = carry
        x, st = _cholesky_step(geometry, x, *w)
        return (x, jnp.where(status == 0, st, status)), None

    rest = np.array(ws[qr_based:], dtype=a.dtype)
    (x, status), _ = lax.scan(cholesky_based, (x, status), rest)
    x = jnp.where(status == 0, x, jnp.asarray(jnp.nan, x.dtype))
    return x, status


@functools.partial(jax.jit, static_argnums=0)
def polar(geometry, a):
    """``(U_p, H, status)``: the polar factors of ``a`` (:func:`applies`), ``H = U_p^H A`` made
    Hermitian, both sharded like ``a``."""
    u_p, status = polar_unitary(geometry, a)
    h = products.gram(u_p, a, geometry.mesh, geometry.spec)
    return u_p, _glue(geometry, geometry.spec, lambda h: (h + _h(h)) / 2, h), status


@functools.partial(jax.jit, static_argnums=(0, 1))
def polar_and_svd(geometry, T_A, a):
    """``(U_p, H, U, s, Vh, status)`` of ``a``: its polar factors (:func:`polar`) and its SVD
    from ``H``'s eigenpairs (``s`` descending)."""
    spec = geometry.spec
    u_p, h, status = polar(geometry, a)
    w, v, st = hermitian.syevd(
        h, T_A=T_A, mesh=geometry.mesh, in_specs=spec, return_status=True, backend=_engine(geometry)
    )
    status = jnp.where(status == 0, st, status)
    s = jnp.maximum(w[::-1], 0)
    v = _glue(geometry, spec, lambda v: v[:, ::-1], v)
    u = products.times(u_p, v, geometry.mesh, spec)
    vh = _adjoint(geometry, v)
    return u_p, h, u, s, vh, status
