"""Backend ``"jax"``'s eigensolver on several devices: Householder tridiagonalisation, bisection
and inverse iteration in XLA's own collectives.

The operand contract is :mod:`jaxmg.engines.jacobi`'s: each device holds ``a`` ``[s, N]``, the
storage of its columns of the Hermitian ``M`` (row ``r`` is ``M``'s column ``layout[d, r]``),
only ``M``'s lower triangle is read, and the eigenvectors come back in the same storage.

The method is LAPACK's ``?sytrd``, ``?stebz``, ``?stein`` and ``?ormtr`` on a 1D layout:

- **Reduction** (:func:`_tridiagonalize`). ``Q^H M Q = T``, ``T`` real symmetric tridiagonal,
  by ``N - 1`` Householder reflectors in panels of :data:`PANEL` columns, as ``?latrd`` does:
  within a panel ``M`` is updated lazily (``M - V W^H - W V^H``), a column costs one ``psum``
  of ``2 N`` numbers (this device's part of ``M v``, and the next column from its owner), and
  at the panel's end each device updates its own columns with one GEMM. The loops run in
  stages whose static shapes shrink with the trailing matrix (:func:`_stages`). The
  reflectors stay in ``a``'s rows.
- **Eigenvalues** (:func:`_bisection`). ``T`` splits where an off-diagonal entry is at
  rounding level (:func:`_split`); each device finds, by bisection on Sturm counts restricted
  to the unreduced block, the eigenvalue that belongs to each of its own ``N / p`` positions
  (the ``k``-th of its block), and they are gathered (``N`` numbers).
- **Eigenvectors of ``T``** (:func:`_inverse_iteration`). Each device solves for the vectors
  of its positions: :data:`ITERATIONS` steps of inverse iteration from a pseudo-random start
  confined to the unreduced block, vectorised over the positions. Eigenvalues of one block
  closer than :data:`TIGHT` ``eps ||T||`` form a cluster, whose vectors are orthonormalised
  together after each step (:func:`_orthonormalize_clusters`, in position order). A device
  computes :data:`WINDOW` positions on either side of its own as well, so that it meets each of
  its clusters whole and orthonormalises it as every other device that meets it does. Repeated
  eigenvalues of ``M`` mostly split ``T`` (an unreduced tridiagonal has distinct eigenvalues);
  where they do not they are a cluster.
- **Back-transformation** (:func:`_back_transform`). ``Q Z`` by panels of reflectors, each
  gathered in one ``psum`` and applied in compact WY form (three GEMMs per device).
- **Orthogonality.** Inverse iteration leaves eigenvectors of eigenvalues ``g`` apart about
  ``eps ||T|| / g`` off orthogonal. Newton-Schulz steps
  (:func:`jaxmg.engines.jacobi._orthonormalized`) take them to rounding: one for random
  spectra (``||V^H V - I||_F`` 1e-12 at N = 2048), up to three for graded ones; the
  correction each vector receives from a neighbour is proportional to their gap's inverse, so
  the residuals stay at ``eps ||T||``.
- **The end.** The eigenvalues are sorted and each device collects the eigenvectors of its
  ranks in a ring (:func:`jaxmg.engines.jacobi._collect`).

Flops per device: ``8 N^3 / (3 p)`` in GEMMs and ``4 N^3 / (3 p)`` in matrix-vector products
(the reduction, as LAPACK's), ``2 N^3 / p`` in the back-transformation and ``4 N^3 / p`` a
Newton-Schulz step; the tridiagonal problem is ``O(N^2 / p)`` per device but sequential in
``N``. On 4 CPU devices at N = 2048 the reduction takes about 60% of the time, half of it in the
matrix-vector products, which read the trailing matrix from memory once per column.

Where a cluster is wider than the window, Newton-Schulz does not settle within :data:`POLISH`
steps, or ``M`` is not finite, the program takes block Jacobi instead
(:mod:`jaxmg.engines.jacobi`, one ``lax.cond``): slower, but orthonormal for any clustering,
and with its status (``N + 1`` with NaN where it fails). Under ``jax.vmap`` the ``lax.cond``
becomes a select, so a batch computes both.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import jacobi

#: Columns per panel of the reduction and the back-transformation.
PANEL = 32
#: Positions computed on either side of a device's own: the widest cluster.
WINDOW = 32
#: Steps of inverse iteration.
ITERATIONS = 3
#: Eigenvalues of one block closer than ``TIGHT eps ||T||_max`` are orthonormalised together.
TIGHT = 100
#: At most this many Newton-Schulz steps.
POLISH = 6
#: Rows of ``T`` per trip of the tridiagonal problem's loops (a trip costs about a microsecond).
UNROLL = 8
#: Off-diagonal entries of ``T`` below ``SPLIT sqrt(N) eps ||T||_max`` are set to zero.
SPLIT = 4
#: A stage of the reduction ends once the trailing order has fallen to this fraction...
SHRINK = 0.75
#: ... until it is this small.
SMALL = 256

_mm = jacobi._mm


def _unroll(n: int) -> int:
    """Rows per trip of a loop over ``T``'s rows: :data:`UNROLL` from ``N`` = 512, where the
    trips' cost shows, one below (a smaller program to compile)."""
    return UNROLL if n >= 512 else 1


def _stages(n: int, nb: int) -> list[tuple[int, int]]:
    """The reduction's stages ``[c0, c1)`` of whole panels: each holds the static shapes of its
    first column's trailing matrix, so it does at most ``1 / SHRINK^2`` its own flops."""
    out, c0 = [], 0
    while c0 < n:
        rest = n - c0
        step = rest if rest <= SMALL else max(nb, int(rest * (1 - SHRINK)) // nb * nb)
        c1 = min(n, c0 + -(-step // nb) * nb)
        out.append((c0, c1))
        c0 = c1
    return out


def _householder(x, c, c0):
    """LAPACK's ``?larfg`` for the part of ``x`` (stage coordinates) below row ``c``:
    ``(v, tau, beta)`` with ``(I - tau v v^H)^H x = beta e_{c+1}``, ``beta`` real, ``v`` zero
    down to row ``c`` and 1 at ``c + 1``."""
    real = jnp.finfo(x.dtype).dtype
    i = jnp.arange(x.shape[0], dtype=jnp.int32) + c0
    below = jnp.where(i > c, x, 0)
    alpha = jnp.sum(jnp.where(i == c + 1, below, 0))
    rest = jnp.sum(jnp.where(i > c + 1, jnp.abs(below).astype(real) ** 2, 0))
    trivial = (rest == 0) & (jnp.imag(alpha) == 0)
    beta = -jnp.where(jnp.real(alpha) >= 0, 1, -1) * jnp.sqrt(jnp.abs(alpha) ** 2 + rest)
    beta = jnp.where(trivial, jnp.real(alpha), beta).astype(real)
    safe = jnp.where(trivial, 1, beta).astype(x.dtype)
    tau = jnp.where(trivial, 0, (safe - alpha) / safe).astype(x.dtype)
    scale = jnp.where(trivial, 0, 1 / jnp.where(trivial, 1, alpha - safe)).astype(x.dtype)
    v = jnp.where(i == c + 1, 1, below * scale).astype(x.dtype)
    return jnp.where(trivial, 0, v), tau, beta


def _owners(layout, n):
    """Each column's owner and its row there, from the ``[p, s]`` layout."""
    table = np.asarray(layout)
    owner_of = np.zeros(n, np.int32)
    row_of = np.zeros(n, np.int32)
    for dev, columns in enumerate(table):
        owner_of[columns] = dev
        row_of[columns] = np.arange(len(columns))
    return jnp.asarray(owner_of), jnp.asarray(row_of)


def _tridiagonalize(h, position, layout, axis):
    """``(reflectors, d, e, tau)``: ``T = tridiag(e, d, e)`` with ``Q^H M Q = T``, ``Q`` the
    product of the reflectors ``I - tau_c v_c v_c^H``, ``v_c`` kept in the row of ``a`` that
    held ``M``'s column ``c`` (from row ``c + 1`` on; what is above is left over)."""
    n = h.shape[1]
    d = jnp.zeros(n, jnp.finfo(h.dtype).dtype)
    carry = (h, d, jnp.zeros(n, d.dtype), jnp.zeros(n, h.dtype))
    for c0, c1 in _stages(n, PANEL):
        carry = _reduce_stage(carry, c0, c1, position, np.asarray(layout), axis)
    h, d, e, tau = carry
    return h, d, e[: n - 1], tau


def _reduce_stage(carry, c0, c1, position, table, axis):
    """The reduction's columns ``[c0, c1)``, on the rows of ``a`` and of ``M`` from ``c0`` on.

    Within a panel ``U^T = [V, W]^T`` (``[2 nb, n0]``, the same on every device) holds its
    reflectors and ``W`` as rows (XLA:CPU's vector-matrix products run 3 to 10 times faster
    than its products with a transposed or thin operand). A column's one ``psum`` carries this
    device's part of ``M v`` and, from its owner, the next column, which ``U`` brings up to
    date."""
    h, d, e, tau = carry
    n, nb = h.shape[1], PANEL
    owner_of, row_of = _owners(table, n)
    s0 = int(min(np.sum(columns < c0) for columns in table))
    n0 = n - c0
    part = h[s0:, c0:]
    mine = jnp.asarray(table)[position][s0:]  # the global column of each of part's rows
    at = jnp.clip(mine - c0, 0, n0 - 1)

    def swap(x):  # [V-part; W-part] -> [W-part; V-part]
        return jnp.concatenate([x[nb:], x[:nb]])

    def fetch(part, c):  # M's column c (as of the panel's start) from its owner's row
        c = jnp.minimum(c, n - 1)
        row = lax.dynamic_index_in_dim(part, row_of[c] - s0, keepdims=False)
        return jnp.where(position == owner_of[c], row, 0)

    def column(j, carry, k):
        part, ut, col, d, e, tau = carry
        c = k + j
        live = c < n
        cc = jnp.minimum(c, n - 1)
        here, after = cc - c0, jnp.minimum(cc + 1, n - 1) - c0
        v, t, beta = _householder(col, cc, c0)
        v, t = jnp.where(live, v, 0), jnp.where(live, t, 0)
        picked = jnp.where(mine >= c0, jnp.take(v, at), 0)
        both = lax.psum(jnp.stack([_mm(picked, part), fetch(part, c + 1)]), axis)
        w = t * (both[0] - _mm(swap(_mm(jnp.conj(ut), v)), ut))  # t (M - V W^H - W V^H) v
        w = w - 0.5 * t * jnp.vdot(w, v) * v
        nxt = both[1] - _mm(jnp.conj(swap(ut[:, after])), ut)
        nxt = nxt - v * jnp.conj(w[after]) - w * jnp.conj(v[after])
        ut = ut.at[j].set(v).at[nb + j].set(w)
        d = d.at[cc].set(jnp.where(live, jnp.real(col[here]), d[cc]))
        e = e.at[cc].set(jnp.where(live, beta, e[cc]))
        tau = tau.at[cc].set(jnp.where(live, t, tau[cc]))
        return part, ut, nxt, d, e, tau

    def panel(p, carry):
        part, d, e, tau = carry
        k = c0 + p * nb
        col = lax.psum(fetch(part, k), axis)
        ut = jnp.zeros((2 * nb, n0), h.dtype)
        part, ut, _, d, e, tau = lax.fori_loop(
            0, nb, lambda j, cr: column(j, cr, k), (part, ut, col, d, e, tau)
        )
        # M's columns after the panel: M - V W^H - W V^H; the panel's own keep the reflectors.
        updated = part - _mm(jnp.conj(jnp.take(ut, at, axis=1)).T, swap(ut))
        inside = (mine >= k) & (mine < k + nb)
        reflectors = jnp.take(ut[:nb], jnp.clip(mine - k, 0, nb - 1), axis=0)
        part = jnp.where(
            (mine >= k + nb)[:, None], updated, jnp.where(inside[:, None], reflectors, part)
        )
        return part, d, e, tau

    part, d, e, tau = lax.fori_loop(0, -(-(c1 - c0) // nb), panel, (part, d, e, tau))
    return h.at[s0:, c0:].set(part), d, e, tau


def _split(d, e):
    """``T``'s off-diagonal with the entries at rounding level set to zero, and each row's
    unreduced block ``[first, end)``. Rounding level is :data:`SPLIT` ``sqrt(N) eps ||T||_max``:
    where ``M`` has an eigenvalue of multiplicity ``m``, the reduction leaves ``m - 1`` entries
    of 3 to 25 ``eps ||M||`` (N = 256; an unreduced tridiagonal has distinct eigenvalues), and
    with ``SPLIT = 1`` the ``+-1`` spectrum of N = 128 kept chains of more than
    :data:`WINDOW` eigenvalues on 8 devices. Setting an entry to zero moves ``T`` by that
    much; those left form clusters."""
    n = d.shape[0]
    eps = jnp.finfo(d.dtype).eps
    scale = jnp.maximum(jnp.max(jnp.abs(d)), jnp.max(jnp.abs(e), initial=0))
    small = jnp.abs(e) <= SPLIT * float(np.sqrt(n)) * eps * scale
    e = jnp.where(small, 0, e)
    i = jnp.arange(n, dtype=jnp.int32)
    starts = jnp.concatenate([jnp.ones(1, bool), small])
    first = lax.cummax(jnp.where(starts, i, 0))
    ends = jnp.concatenate([small, jnp.ones(1, bool)])
    end = lax.cummin(jnp.where(ends, i + 1, n), reverse=True)
    return e, first, end, scale


def _bisection(d, e, first, end, positions):
    """The eigenvalue of each of ``positions``: the ``(i - first[i])``-th of ``T``'s unreduced
    block holding row ``i``, by bisection on Sturm counts restricted to that block (LAPACK's
    ``?stebz``, with its guard ``pivmin`` against a zero pivot)."""
    n = d.shape[0]
    real = d.dtype
    e2 = jnp.concatenate([jnp.zeros(1, real), e**2])
    pivmin = jnp.finfo(real).tiny * jnp.maximum(1, jnp.max(e2))
    radius = jnp.abs(e2) ** 0.5
    spread = radius + jnp.concatenate([radius[1:], jnp.zeros(1, real)])
    lo = jnp.min(d - spread)
    hi = jnp.max(d + spread)
    pad = 2 * jnp.finfo(real).eps * jnp.maximum(jnp.abs(lo), jnp.abs(hi)) + pivmin
    lo, hi = lo - pad, hi + pad
    block_lo, block_hi = first[positions], end[positions]
    rank = positions - block_lo
    rows = jnp.arange(n, dtype=jnp.int32)

    def count(x):
        def step(carry, inputs):
            q, k = carry
            dr, er, r = inputs
            q = dr - x - er / q
            q = jnp.where(jnp.abs(q) < pivmin, -pivmin, q)
            k = k + ((q < 0) & (r >= block_lo) & (r < block_hi)).astype(jnp.int32)
            return (q, k), None

        init = (jnp.ones_like(x), jnp.zeros_like(rank))
        (_, k), _ = lax.scan(step, init, (d, e2, rows), unroll=_unroll(n))
        return k

    def halve(_, bounds):
        a, b = bounds
        mid = (a + b) / 2
        above = count(mid) > rank
        return jnp.where(above, a, mid), jnp.where(above, mid, b)

    steps = jnp.finfo(real).nmant + 4
    zero = jnp.zeros_like(rank, dtype=real)
    a, b = lax.fori_loop(0, steps, halve, (zero + lo, zero + hi))
    return (a + b) / 2


def _clusters(values, first, scale):
    """Each position's cluster: the first position of its run of eigenvalues of one block
    closer than :data:`TIGHT` ``eps ||T||_max`` to the next."""
    n = values.shape[0]
    i = jnp.arange(n, dtype=jnp.int32)
    gap = TIGHT * jnp.finfo(values.dtype).eps * scale
    apart = jnp.concatenate([jnp.ones(1, bool), values[1:] - values[:-1] > gap])
    return lax.cummax(jnp.where(apart | (first == i), i, 0))


def _orthonormalize_clusters(x, cluster):
    """Gram-Schmidt (twice) of each vector against the earlier ones of its cluster, in position
    order; columns of ``x`` are the vectors, ``cluster`` their cluster ids."""
    n, m = x.shape
    padded = jnp.concatenate([jnp.zeros((n, WINDOW), x.dtype), x], axis=1)
    ids = jnp.concatenate([jnp.full(WINDOW, -1, cluster.dtype), cluster])

    def one(j, padded):
        y = lax.dynamic_slice_in_dim(padded, j, WINDOW, axis=1)  # the WINDOW vectors before j
        mates = lax.dynamic_slice_in_dim(ids, j, WINDOW) == ids[j + WINDOW]
        z = lax.dynamic_index_in_dim(padded, j + WINDOW, axis=1, keepdims=False)
        for _ in range(2):
            z = z - _mm(y, jnp.where(mates, _mm(z, y), 0))
        z = z / jnp.linalg.norm(z)
        return lax.dynamic_update_index_in_dim(padded, z, j + WINDOW, axis=1)

    return lax.fori_loop(0, m, one, padded)[:, WINDOW:]


def _start(r, positions, dtype):
    """Row ``r`` of the starting vectors of ``positions``: numbers in ``[-1, 1)`` that depend on
    the row and the position only, so every device that computes a position starts it alike."""
    t = jnp.sin(r.astype(dtype) * 12.9898 + positions.astype(dtype) * 78.233) * 43758.5453
    return 2 * (t - jnp.floor(t)) - 1


def _inverse_iteration(d, e, first, end, values, cluster, lanes, scale):
    """Unit eigenvectors of ``T`` (columns ``[N, lanes]``) for the positions ``lanes``. The
    starts are zero outside the position's unreduced block, and so are the iterates (``T``'s
    entries between blocks are zero)."""
    n = d.shape[0]
    real = d.dtype
    lam = values[lanes]
    block_lo, block_hi = first[lanes], end[lanes]
    floor = jnp.finfo(real).eps * scale
    floor = jnp.where(floor > 0, floor, jnp.finfo(real).tiny)
    e_before = jnp.concatenate([jnp.zeros(1, real), e])
    e_after = jnp.concatenate([e, jnp.zeros(1, real)])

    def pivot(u, inputs):  # LU of T - lam I without pivoting, tiny pivots raised to the floor
        dr, er = inputs
        u = dr - lam - er**2 / u
        u = jnp.where(jnp.abs(u) < floor, jnp.where(u < 0, -floor, floor), u)
        return u, u

    unroll = _unroll(n)
    _, u = lax.scan(pivot, jnp.ones_like(lam), (d, e_before), unroll=unroll)  # [n, lanes]

    def solve(start, b):  # (T - lam I)^{-1} b, or of the starting vectors where start
        def down(carry, inputs):
            y, before = carry
            br, er, ur, r = inputs
            inside = (r >= block_lo) & (r < block_hi)
            br = jnp.where(start, jnp.where(inside, _start(r, lanes, real), 0), br)
            y = br - er / before * y
            return (y, ur), y

        def up(x, inputs):
            yr, er, ur = inputs
            x = (yr - er * x) / ur
            return x, x

        init = (jnp.zeros_like(lam), jnp.ones_like(lam))
        rows = jnp.arange(n, dtype=jnp.int32)
        _, y = lax.scan(down, init, (b, e_before, u, rows), unroll=unroll)
        _, x = lax.scan(up, jnp.zeros_like(lam), (y, e_after, u), reverse=True, unroll=unroll)
        x = x / jnp.linalg.norm(x, axis=0, keepdims=True)
        return lax.cond(tight, lambda x: _orthonormalize_clusters(x, cluster), lambda x: x, x)

    tight = jnp.any(cluster[1:] == cluster[:-1])
    # one loop, its first step from the starting vectors: XLA kept every unrolled step's
    # [N, lanes] iterates alive, and each copy of the step is compiled anew
    return lax.fori_loop(0, ITERATIONS, lambda i, x: solve(i == 0, x), jnp.zeros_like(u))


def _panel(a, position, k, nb, c0, owner_of, row_of, axis):
    """Reflectors ``k .. k + nb - 1`` as rows ``[nb, N - c0]`` (from column ``c0`` on), from
    their owners in one ``psum``."""
    n = owner_of.shape[0]
    c = k + jnp.arange(nb, dtype=jnp.int32)
    live = c < n - 1
    cc = jnp.minimum(c, n - 1)
    rows = jnp.take(a, row_of[cc], axis=0)
    v = lax.psum(jnp.where((owner_of[cc] == position)[:, None], rows, 0), axis)
    keep = (jnp.arange(a.shape[1], dtype=jnp.int32)[None, :] + c0 > c[:, None]) & live[:, None]
    return jnp.where(keep, v, 0)


def _back_transform(z, a, tau, position, layout, axis):
    """``Q Z`` (rows) by panels of reflectors, the last first: ``Z - V T V^H Z`` with ``T``
    the panel's compact WY factor (LAPACK's ``?larft``). A panel from column ``k`` changes
    ``Z``'s columns from ``k + 1`` on, so the panels go in the reduction's stages, each on the
    columns from its first."""
    n = a.shape[1]
    nb = PANEL
    owner_of, row_of = _owners(layout, n)
    taus = jnp.concatenate([tau, jnp.zeros(nb, tau.dtype)])
    idx = jnp.arange(nb, dtype=jnp.int32)

    def one(k, z, c0):
        v = _panel(a[:, c0:], position, k, nb, c0, owner_of, row_of, axis)  # [nb, n - c0]
        t = lax.dynamic_slice_in_dim(taus, k, nb)
        g = _mm(jnp.conj(v), v.T)  # V^H V

        def column(i, f):
            col = -t[i] * _mm(f, jnp.where(idx < i, g[:, i], 0))
            return f.at[:, i].set(jnp.where(idx < i, col, 0)).at[i, i].set(t[i])

        f = lax.fori_loop(0, nb, column, jnp.zeros((nb, nb), tau.dtype))
        return z - _mm(_mm(_mm(z, jnp.conj(v).T), f.T), v)

    def stage(z, c0, c1):
        panels = -(-(min(c1, n - 1) - c0) // nb)
        part = lax.fori_loop(
            0, panels, lambda p, z: one(c0 + (panels - 1 - p) * nb, z, c0), z[:, c0:]
        )
        return z.at[:, c0:].set(part)

    for c0, c1 in reversed(_stages(n, nb)):
        if c0 < n - 1:
            z = stage(z, c0, c1)
    return z


def syevd(a, position, layout, *, vectors=True, axis, ndev):
    """``(v, w, status)`` as :func:`jaxmg.engines.jacobi.syevd`."""
    s, n = a.shape
    layout = np.asarray(layout, np.int32)
    real = jnp.finfo(a.dtype).dtype
    h = jacobi._hermitian(a, position, jnp.asarray(layout), axis, ndev)
    finite = lax.psum(jnp.sum(~jnp.isfinite(h)), axis) == 0
    # M scaled by a power of two to a largest entry in [1, 2): no square in the reduction
    # overflows or underflows (LAPACK's ?syevd scales outside a safe range)
    largest = lax.pmax(jnp.max(jnp.where(finite, jnp.abs(h), 0)), axis)
    power = jnp.where(largest > 0, jnp.floor(jnp.log2(jnp.where(largest > 0, largest, 1))), 0)
    h = jnp.where(finite, h * jnp.exp2(-power).astype(h.dtype), 0)
    reflectors, d, e, tau = _tridiagonalize(h, position, layout, axis)
    e, first, end, scale = _split(d, e)
    own = position * s + jnp.arange(s, dtype=jnp.int32)
    own_values = _bisection(d, e, first, end, own)
    values = lax.all_gather(own_values, axis, tiled=True, to="invarying")  # the same everywhere
    ranked = jnp.argsort(values).astype(jnp.int32)
    eigenvalues = jnp.where(finite, values[ranked] * jnp.exp2(power), jnp.nan)
    if not vectors:
        status = jnp.where(finite, 0, n + 1).astype(jnp.int32)[None]
        return a, eigenvalues, status
    cluster = _clusters(values, first, scale)
    widest = jnp.max(jnp.arange(n, dtype=jnp.int32) - cluster)
    lanes = jnp.clip(position * s - WINDOW + jnp.arange(s + 2 * WINDOW, dtype=jnp.int32), 0, n - 1)
    outside = lanes != position * s - WINDOW + jnp.arange(s + 2 * WINDOW, dtype=jnp.int32)
    ids = jnp.where(outside, -2 - jnp.arange(s + 2 * WINDOW, dtype=jnp.int32), cluster[lanes])

    z = _inverse_iteration(d, e, first, end, values, ids, lanes, scale)[:, WINDOW : WINDOW + s].T
    v = _back_transform(z.astype(a.dtype), reflectors, tau, position, layout, axis)

    def polish(carry):
        v, _, count = carry
        v, distance = jacobi._orthonormalized(v, axis, ndev)
        return v, distance, count + 1

    def going(carry):
        _, distance, count = carry
        return (count == 0) | ((distance > settled) & (count < POLISH))

    settled = jnp.sqrt(jnp.finfo(real).eps)
    v, distance, count = lax.while_loop(going, polish, (v, jnp.zeros((), real), 0))
    source = ranked[jnp.asarray(layout)[position]]  # the position each local row takes
    v = jacobi._collect(v, source // s, source % s, position, axis, ndev)

    def fallback(_):
        return jacobi.syevd(a, position, layout, vectors=True, axis=axis, ndev=ndev)

    usable = finite & (widest < WINDOW) & (distance <= settled)
    return lax.cond(usable, lambda _: (v, eigenvalues, jnp.zeros((1,), jnp.int32)), fallback, None)
