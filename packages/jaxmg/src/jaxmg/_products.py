"""Products of sharded matrices that never hold a whole ``K x K`` matrix on one device.

XLA's partitioner computes a Gram matrix ``X^H X`` of a row-sharded ``X`` as a full ``K x K``
partial sum on every device followed by an all-reduce, and ``X G`` by gathering ``G``: for a
square ``X`` that is a whole matrix per device. The ring products here pass one block at a time
around the devices of the axis (``ppermute``) instead, so each device holds its own blocks and
one block in flight. They run inside ``jax.shard_map`` on the local blocks of ``X`` sharded by
rows ``P(axis, None)`` (``x``: ``[M/p, K]``) or by columns ``P(None, axis)`` (``x``:
``[M, K/p]``), ``K`` divisible by the ``p`` devices of ``axis``.

Used by the Newton-Schulz polish of the singular vectors (:mod:`jaxmg._decompositions`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

_HIGHEST = lax.Precision.HIGHEST


def _mm(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


def _h(a):
    return jnp.conj(a).T


def _shift(p, by):
    """``ppermute`` pairs: device ``j`` sends to ``j + by`` (mod ``p``)."""
    return [(j, (j + by) % p) for j in range(p)]


def _columns(x, block, width):
    return lax.dynamic_slice_in_dim(x, block * width, width, axis=1)


def _rows(x, block, width):
    return lax.dynamic_slice_in_dim(x, block * width, width, axis=0)


# --- X sharded by rows: local x [M/p, K]; the K x K matrices by rows, local [K/p, K]


def gram_by_rows(x, y, axis, p):
    """Row block ``me`` of ``X^H Y``: a ring reduce-scatter of the devices' contributions
    (at step ``s`` device ``d`` adds its part of block ``d - s - 1`` and passes it on, so that
    the last step leaves block ``d`` on device ``d``)."""
    me = lax.axis_index(axis)
    width = x.shape[1] // p
    acc = _mm(_h(_columns(x, (me - 1) % p, width)), y)
    for step in range(1, p):
        acc = lax.ppermute(acc, axis, _shift(p, 1))
        acc = acc + _mm(_h(_columns(x, (me - step - 1) % p, width)), y)
    return acc


def times_by_rows(x, g, axis, p):
    """Local rows of ``X G`` from ``G``'s row block ``me``: the blocks of ``G`` go round."""
    me = lax.axis_index(axis)
    width = x.shape[1] // p
    out = _mm(_columns(x, me, width), g)
    for step in range(1, p):
        g = lax.ppermute(g, axis, _shift(p, -1))  # now block me + step
        out = out + _mm(_columns(x, (me + step) % p, width), g)
    return out


# --- X sharded by columns: local x [M, K/p]; the K x K matrices by columns, local [K, K/p]


def gram_by_columns(x, y, axis, p):
    """Column block ``me`` of ``X^H Y``: ``x_j^H y_me`` for every ``j``, the blocks of ``X``
    going round."""
    me = lax.axis_index(axis)
    width = x.shape[1]
    out = jnp.zeros((p * width, y.shape[1]), jnp.result_type(x, y))
    for step in range(p):
        if step:
            x = lax.ppermute(x, axis, _shift(p, -1))  # now block me + step
        block = _mm(_h(x), y)
        out = lax.dynamic_update_slice_in_dim(out, block, ((me + step) % p) * width, axis=0)
    return out


def times_by_columns(x, g, axis, p):
    """Local columns of ``X G`` from ``G``'s column block ``me`` (``[K, N2/p]``): the blocks
    of ``X`` go round."""
    me = lax.axis_index(axis)
    width = x.shape[1]
    out = _mm(x, _rows(g, me, width))
    for step in range(1, p):
        x = lax.ppermute(x, axis, _shift(p, -1))  # now block me + step
        out = out + _mm(x, _rows(g, (me + step) % p, width))
    return out


# --- the Newton-Schulz polish


def _axis(spec):
    return (spec[0], True) if spec[0] is not None else (spec[1], False)


def newton_schulz(x, keep, mesh, spec, steps=2):
    """``steps`` Newton-Schulz steps ``X <- X + X (I - X^H X) / 2`` on the columns ``keep``
    (a boolean ``[K]``, replicated) of ``x`` sharded as ``spec`` (``P(axis, None)`` or
    ``P(None, axis)``), the other columns left as they are. Each step squares ``X``'s distance
    from orthonormal columns."""
    axis, by_rows = _axis(spec)
    p = mesh.shape[axis]

    def body(x, keep):
        me = lax.axis_index(axis)
        k = x.shape[1] * (1 if by_rows else p)
        width = k // p
        if not by_rows:
            keep = lax.dynamic_slice_in_dim(keep, me * width, width)
        kept = jnp.where(keep[None, :], x, 0)
        # The local block of the identity: rows me of I (by rows) or its columns me.
        ids = jnp.arange(k, dtype=me.dtype)
        local = me * width + jnp.arange(width, dtype=me.dtype)
        eye = (local[:, None] == ids[None, :]) if by_rows else (ids[:, None] == local[None, :])
        for _ in range(steps):
            if by_rows:
                gram = gram_by_rows(kept, kept, axis, p)
                kept = kept + times_by_rows(kept, eye.astype(x.dtype) - gram, axis, p) / 2
            else:
                gram = gram_by_columns(kept, kept, axis, p)
                kept = kept + times_by_columns(kept, eye.astype(x.dtype) - gram, axis, p) / 2
        return jnp.where(keep[None, :], kept, x)

    return jax.shard_map(
        body, mesh=mesh, in_specs=(spec, P(None)), out_specs=spec, check_vma=False
    )(x, keep)


def gram(x, y, mesh, spec):
    """``X^H Y`` for ``X``, ``Y`` sharded as ``spec`` (by rows or by columns); the result
    ``[K, K2]`` sharded the same way (by rows: its rows; by columns: its columns)."""
    axis, by_rows = _axis(spec)
    p = mesh.shape[axis]
    body = gram_by_rows if by_rows else gram_by_columns
    return jax.shard_map(
        lambda x, y: body(x, y, axis, p),
        mesh=mesh,
        in_specs=(spec, spec),
        out_specs=spec,
        check_vma=False,
    )(x, y)
