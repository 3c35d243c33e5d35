"""Backend ``"jax"``'s eigensolver on several devices: block Jacobi in XLA's own collectives.

The operand contract is the native ``syevd``'s (packages/jaxmg-cuda/README.md) and the rest of
:mod:`jaxmg.engines.collectives`'s: each device holds ``a`` ``[s, N]``, the storage of its
columns of the Hermitian ``M`` (row ``r`` is ``M``'s column ``cols[d, r]``, the layout's tiles
of ``T`` taken block-cyclically, :func:`jaxmg.engines.collectives._columns`), and only ``M``'s
lower triangle is read. The eigenvalues come back ascending and replicated, the eigenvectors in
the same storage: row ``r`` is the eigenvector of the ``cols[d, r]``-th eigenvalue.

The method: one-sided block Jacobi on ``V`` with ``W = M V`` kept beside it (both start as
the device's own columns of ``I`` and ``M``).

- **Rounds.** Each device splits its columns in two halves. The ``2 p`` halves meet in pairs,
  every pair once a sweep, in the ``2 p - 1`` rounds of a round-robin tournament (the circle
  method: one ``ppermute`` to each neighbour a round). In a round each device diagonalises its
  pair's block of ``V^H M V`` (``s x s``, local: ``V^H W``) with ``lax.linalg.eigh`` and
  rotates its columns of ``V`` and ``W`` by the result, each column keeping the rank of its
  diagonal entry (:func:`_round`).
- **Sweeps.** A sweep starts from ``W = M V`` made afresh (a ring of ``p - 1`` ``ppermute``s of
  ``M``'s blocks), so that rounding in the rotations of ``W`` does not pile up over sweeps.
  Sweeps go on until the off-diagonal part of the blocks a sweep met is at rounding level
  (:func:`_tolerances`), at most :data:`MAX_SWEEPS`.
- **The end.** One Newton-Schulz step makes ``V`` orthonormal to rounding
  (:func:`_orthonormalized`; ``V`` is a product of unitary rotations, which leaves it a few
  hundred ``eps`` off after many sweeps), clustered and repeated eigenvalues included. The
  eigenvalues are ``V``'s Rayleigh quotients. They are gathered on every device (``N``
  numbers) and sorted, and each device collects the eigenvectors of its ranks in a ring over
  the others' columns.

Convergence is quadratic for distinct eigenvalues (8 to 10 sweeps for random spectra at
N = 512 to 2048) and linear where eigenvalues repeat or cluster: every Jacobi method,
serial ones too, takes 2 to 4 times as many sweeps there (40 for ``+-1`` eigenvalues at
N = 512 on 4 devices; benchmarks/eigen.py). Jacobi is accurate and simple, but it is not cheap:
``12 N^3 / p`` flops a sweep on each device (``V^H W``, two rotations, the product ``M V``) and
``2 p - 1`` eigendecompositions of order ``N / p``. Each device holds ``M``, ``V`` and ``W``
(three blocks), a round's rotated copies and its neighbours' halves.

Where ``N / p`` is odd each device takes one more column, a ghost: the matrix is bordered by
``p`` rows and columns of ``mu I`` with ``mu`` above every eigenvalue (``2 ||M||_F``), whose
eigenpairs (``mu``, unit vectors) sort last and are dropped.

The status is LAPACK's ``info`` convention of the other engines: ``N + 1`` when the sweeps did
not converge or the input was not finite (the outputs are then NaN), else 0.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ._unbatched import unbatched
from .dense import _varying_like

#: At most this many sweeps (repeated eigenvalues of N = 512 took 40; random ones take 10).
MAX_SWEEPS = 60
#: Below convergence a sweep must leave at most this fraction of the last one's off-diagonal
#: norm for another to follow (:func:`_tolerances`).
GAIN = 0.75

_HIGHEST = lax.Precision.HIGHEST


def _mm(x, y):
    return jnp.matmul(x, y, precision=_HIGHEST)


def _shift(ndev, k):
    """``ppermute`` pairs that send each device's value ``k`` devices on, around the ring."""
    return [(i, (i + k) % ndev) for i in range(ndev)]


def _hermitian(a, position, table, axis, ndev):
    """The storage of all of ``M`` from its lower triangle: each device receives from every
    other the ``s x s`` block of its columns that holds the mirror image of its upper part."""
    mine = table[position]
    rows = jnp.arange(a.shape[0])

    def fill(h, theirs, block):
        # block[r', r] = M[mine[r], theirs[r']] (lower where theirs[r'] < mine[r]); its
        # conjugate is M[theirs[r'], mine[r]], at h[r, theirs[r']].
        here = jnp.take(h, theirs, axis=1)
        upper = theirs[None, :] < mine[:, None]
        return h.at[:, theirs].set(jnp.where(upper, jnp.conj(block).T, here), unique_indices=True)

    h = fill(a, mine, jnp.take(a, mine, axis=1))
    for k in range(1, ndev):
        sent = jnp.take(a, table[(position + k) % ndev], axis=1)
        h = fill(h, table[(position - k) % ndev], lax.ppermute(sent, axis, _shift(ndev, k)))
    diagonal = h[rows, mine]
    return h.at[rows, mine].set(jnp.real(diagonal).astype(h.dtype), unique_indices=True)


def _times(h, v, position, table, axis, ndev):
    """``W = M V`` in storage (``W^T``'s rows): ``sum_e V_d^T[:, cols_e] M[:, cols_e]^T``, ``M``'s
    blocks passed around the ring."""
    w = _mm(jnp.take(v, table[position], axis=1), h)

    def step(k, carry):
        w, block = carry
        block = lax.ppermute(block, axis, _shift(ndev, 1))
        theirs = table[(position - k) % ndev]
        return w + _mm(jnp.take(v, theirs, axis=1), block), block

    if ndev > 1:
        w, _ = lax.fori_loop(1, ndev, step, (w, h))
    return w


def _orthonormalized(v, axis, ndev):
    """One Newton-Schulz step ``V (3 I - V^H V) / 2``, and ``||V^H V - I||_F`` before it: the
    step squares that distance (the rounding of the sweeps' rotations, a few hundred ``eps``).
    Each device's ``sum_e V_e (V_e^H V_d)`` in a ring over the others' columns, the Gram blocks
    ``V_e^H V_d`` on the way."""

    def step(k, carry):
        total, block, off = carry
        block = lax.ppermute(block, axis, _shift(ndev, 1))
        gram = _mm(jnp.conj(block), v.T)
        return total + _mm(gram.T, block), block, off + jnp.sum(jnp.abs(gram) ** 2)

    gram = _mm(jnp.conj(v), v.T)
    eye = jnp.eye(v.shape[0], dtype=v.dtype)
    off = jnp.sum(jnp.abs(gram - eye) ** 2)
    total = _mm(gram.T, v)
    if ndev > 1:
        total, _, off = lax.fori_loop(1, ndev, step, (total, v, off))
    return 1.5 * v - 0.5 * total, jnp.sqrt(lax.psum(off, axis))


def _round(v, w):
    """Diagonalise the block ``V^H M V`` of this device's columns and rotate them by it; the
    block's squared off-diagonal norm before. Each column keeps the rank of its diagonal entry:
    eigenvectors taken in ascending order would swap columns between the halves every round,
    and the sweeps would converge linearly instead of quadratically (N = 256 on 4 devices:
    1e-4 after 12 sweeps, against 1e-13 after 9)."""
    g = _mm(jnp.conj(v), w.T)
    g = (g + jnp.conj(g).T) / 2
    diagonal = jnp.real(jnp.diagonal(g))
    off = jnp.sum(jnp.abs(g - jnp.diag(diagonal).astype(g.dtype)) ** 2)
    q, _ = unbatched(lax.linalg.eigh, g, lower=True, symmetrize_input=False, sort_eigenvalues=True)
    q = q[:, jnp.argsort(jnp.argsort(diagonal))]
    return _mm(q.T, v), _mm(q.T, w), off


def _rotate(x, position, axis, ndev):
    """The circle method's move of the ``2 p`` halves: device ``d`` holds positions ``d`` (its
    first half) and ``2 p - 1 - d`` (its second); position 0 stays, the others advance by one."""
    half = x.shape[0] // 2
    top, bottom = x[:half], x[half:]
    right = lax.ppermute(
        jnp.where(position == 0, bottom, top), axis, [(i, i + 1) for i in range(ndev - 1)]
    )
    left = lax.ppermute(bottom, axis, [(i + 1, i) for i in range(ndev - 1)])
    top = jnp.where(position == 0, top, right)
    bottom = jnp.where(position == ndev - 1, x[:half], left)
    return jnp.concatenate([top, bottom])


def _tolerances(norm, n, dtype):
    """``(converged, floor)`` for a sweep's off-diagonal Frobenius norm, about the residual
    ``||M V - V diag(w)||_F`` it leaves. Within ``converged`` (``N eps ||M||_F``) the eigenpairs
    count as found (else the status says not); below it the sweeps go on while each takes a
    quarter off the last (:data:`GAIN`), down to ``floor`` (``eps ||M||_F``, the rounding of
    the ``V^H W`` blocks themselves): where eigenvalues cluster the last sweeps gain only 2 to
    3 times each, and stopping at ``converged`` left 10 to 30 times LAPACK's residual."""
    eps = jnp.finfo(dtype).eps
    return n * eps * norm, eps * norm


def syevd(a, position, layout, *, vectors=True, axis, ndev):
    """``(v, w, status)`` as ``jaxmg_cuda.mg_syevd``: ``v`` the eigenvectors' storage (``a``
    itself without ``vectors``), ``w`` the eigenvalues ascending. ``layout`` ``[p, s]``: the
    column of ``M`` each local row holds, on each device."""
    s, n = a.shape
    layout = np.asarray(layout, np.int32)
    h = _hermitian(a, position, jnp.asarray(layout), axis, ndev)
    real = jnp.finfo(a.dtype).dtype
    norm = jnp.sqrt(lax.psum(jnp.sum(jnp.abs(h).astype(real) ** 2), axis))
    ghost = s % 2
    table = layout
    if ghost:  # a bordered matrix of even width per device
        ghosts = n + np.arange(ndev, dtype=np.int32)[:, None]
        table = np.concatenate([layout, ghosts], axis=1)
        mu = jnp.where(norm > 0, 2 * norm, 1).astype(a.dtype)
        h = jnp.pad(h, ((0, 1), (0, ndev)))
        h = h.at[s, n + position].set(mu)
    table = jnp.asarray(table)
    width, order = table.shape[1], n + ghost * ndev
    v = (jnp.arange(order, dtype=jnp.int32)[None, :] == table[position][:, None]).astype(a.dtype)
    converged, floor = _tolerances(norm, n, real)
    rounds = 2 * ndev - 1

    def sweep(carry):
        v, off, _, count = carry
        w = _times(h, v, position, table, axis, ndev)

        def one(i, c):
            v, w, off = c
            v, w, o = _round(v, w)
            if ndev > 1:
                v, w = (_rotate(x, position, axis, ndev) for x in (v, w))
            return v, w, off + o

        new = _varying_like(jnp.zeros((), real), v, w)  # this device's sum
        v, _, new = lax.fori_loop(0, rounds, one, (v, w, new))
        return v, jnp.sqrt(lax.psum(new, axis)), off, count + 1

    def going(carry):
        _, off, before, count = carry
        gaining = (off > floor) & (off < GAIN * before)
        return ((off > converged) | gaining) & (count < MAX_SWEEPS)  # False for NaN

    inf = jnp.asarray(jnp.inf, real)
    v, off, _, _ = lax.while_loop(going, sweep, (v, inf, inf, 0))
    v, _ = _orthonormalized(v, axis, ndev)
    w = _times(h, v, position, table, axis, ndev)
    values = jnp.real(jnp.sum(jnp.conj(v) * w, axis=1))  # Rayleigh quotients
    # [p * width], device-major; typed as the same on every device (as it is)
    everyone = lax.all_gather(values, axis, tiled=True, to="invarying")
    ranked = jnp.argsort(everyone).astype(jnp.int32)
    ok = jnp.isfinite(off) & (off <= converged)
    status = jnp.where(ok, 0, n + 1).astype(jnp.int32)[None]
    eigenvalues = jnp.where(ok, everyone[ranked[:n]], jnp.nan)
    if not vectors:
        return a, eigenvalues, status
    source = ranked[jnp.asarray(layout)[position]]  # the rank each local row takes
    out = _collect(v, source // width, source % width, position, axis, ndev)[:, :n]
    return jnp.where(ok, out, jnp.nan), eigenvalues, status


def _collect(v, device, row, position, axis, ndev):
    """Row ``r`` of the result is row ``row[r]`` of device ``device[r]``'s ``v``: each device's
    ``v`` passed once around the ring."""

    def step(k, carry):
        out, block = carry
        theirs = (position - k) % ndev
        out = jnp.where((device == theirs)[:, None], jnp.take(block, row, axis=0), out)
        return out, lax.ppermute(block, axis, _shift(ndev, 1))

    out = _varying_like(jnp.zeros((device.shape[0], v.shape[1]), v.dtype), v, device, position)
    out, _ = lax.fori_loop(0, ndev, step, (out, v))
    return out
