"""One process of an ``mpiexec -n P`` job running jaxmg's public API with ``backend="mp"``
(ScaLAPACK over MPI), started by test_backend_mp.py.

    mpiexec -n P python jax_worker.py SCENARIO RESULTS_DIR [double]

Every process initialises ``jax.distributed`` from MPI (``cluster_detection_method="mpi4py"``),
with one CPU device, builds the same seeded matrices, runs the scenario and writes one JSON line
per check, ``{"check": ..., "ok": bool, ...}``, to ``RESULTS_DIR/<rank>.jsonl`` (not stdout,
where Gloo writes too); ``double`` limits ``solve``, ``grid:`` and ``decompositions`` to float64
and complex128.
Scenarios:

- ``solve``: potrs (+logdet), potri, syevd (values, vectors), cho_factor/cho_solve, lu_solve
  (N/T/C) and lu_factor, every dtype, both 1D forms, eager and under ``jit``, a tile that
  needs the relayout, a matrix that is not positive definite, and the same calls with
  ``backend="mg"`` (jaxmg's one-host multi-process mode) giving the same answers;
  ``potrs_no_shardmap`` inside the user's ``shard_map``; the gradient of potrs plus logdet
  against the closed form.
- ``grid:RxC``: ``A`` sharded ``P(r, c)`` over an ``R x C`` process grid (ScaLAPACK's 2D
  block-cyclic layout): potrs (+logdet), potri, syevd, cho_factor/cho_solve, lu_solve (N/T/C)
  and lu_factor, every dtype, eager and under ``jit``, a tile that needs the relayout (by the
  engine, and by JAX for potrs, potri, syevd), the same answers as ``P(None, x)`` with both
  backends on the same processes; potri and potrs under ``jit`` on a mesh with Auto axes;
  potrs, syevd and potri inside the user's ``shard_map`` (``sharded_by="grid"``; potri refused
  on a grid that is not square); the gradients of potrs plus logdet and of the largest
  eigenvalue.
- ``quick``: potrs and lu_solve in float64 (for two jobs at once).
- ``order``: one jitted program with two independent calls, the first of which reaches the
  engine a second late on the last rank (``JAXMG_TEST_MP_LATE``): the processes must agree on
  one order and both answers be right; reports how often a call stepped back.
- ``donate``: ``donate=True`` on potrs, cho_factor, lu_factor, potri and syevd, both 1D
  forms: the answers, ``A`` deleted; and under ``jax.jit(..., donate_argnums=0)`` the factor
  (cho_factor, lu_factor) takes over ``A``'s buffer (XLA's ``input_output_alias``), with the
  program's bytes per process from XLA's memory analysis.
- ``decompositions``: svd, qr, polar, lstsq (ScaLAPACK's p?gesvd, p?geqrf + p?orgqr/p?ungqr)
  and p?gels (``jaxmg.decompositions.engine_routines.gels``), both 1D forms, against numpy and scipy
  (singular values, reconstruction, orthonormality, numpy's lstsq): every dtype of DTYPES on a
  tall matrix, the double ones also wide and square; ``U``, ``Vh``, ``Q``, ``R`` sharded like
  ``A`` and never whole on a process (XLA's memory analysis), whole where ``K`` divides no grid
  (``P(x, None)``, ``K = 3``); a rank-deficient A (its documented
  outcome for each routine); the jvp of the singular values against JAX's rule, and of Q and
  R against central differences. ``decompositions:RxC``: the same on ``P(r, c)`` over an
  ``R x C`` process grid, and ``full_matrices=True`` refused there.
- ``killed``: one good call, then the last rank is killed before the next: the job must end
  (mpiexec aborts it), not hang.
"""

import functools
import json
import os
import pathlib
import re
import signal
import sys

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(cluster_detection_method="mpi4py", initialization_timeout=60)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxmg  # noqa: E402

scenario, results = sys.argv[1], pathlib.Path(sys.argv[2])
# Every dtype, or with "double" as a third argument float64 and complex128 only (the single-
# precision cases are the same code paths, run by another job of the session).
DTYPES = (np.float32, np.float64, np.complex64, np.complex128)
if sys.argv[3:] == ["double"]:
    DTYPES = (np.float64, np.complex128)
rank, size = jax.process_index(), jax.process_count()
lines = []


def report(check, ok, **extra):
    lines.append(json.dumps({"check": check, "ok": bool(ok), "rank": rank, **extra}))


def host(x):
    """A replicated or sharded result as numpy on every process."""
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def matrices(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.issubdtype(dtype, np.complexfloating):
        m = m + 1j * rng.standard_normal((n, n))
    hpd = (m @ m.conj().T / n + np.eye(n)).astype(dtype)
    general = (m / np.sqrt(n) + 2 * np.eye(n)).astype(dtype)
    b = rng.standard_normal((n, 3)).astype(dtype)
    return hpd, general, b


def tolerance(dtype):
    return 2e-3 if np.finfo(dtype).bits <= 32 or dtype == np.complex64 else 1e-9


def close(x, y, dtype):
    x, y = np.asarray(x), np.asarray(y)
    return bool(np.max(np.abs(x - y)) <= tolerance(dtype) * max(1.0, np.max(np.abs(y))))


def solve(mesh):
    n = 6 * size
    for dtype in DTYPES:
        hpd, general, b = matrices(n, dtype)
        tol = dict(dtype=np.dtype(dtype).name)
        for form in ("cols", "rows"):
            spec = P(None, "x") if form == "cols" else P("x", None)
            sharding = NamedSharding(mesh, spec)
            A, G = jax.device_put(hpd, sharding), jax.device_put(general, sharding)
            case = dict(form=form, **tol)
            x, logdet, status = jaxmg.potrs(
                A, b, backend="mp", return_logdet=True, return_status=True
            )
            ok = int(status) == 0 and close(x, np.linalg.solve(hpd, b), dtype)
            report("potrs", ok and close(logdet, np.linalg.slogdet(hpd)[1], dtype), **case)
            jitted = jax.jit(lambda a, r: jaxmg.potrs(a, r, backend="mp"))
            report("potrs_jit", close(jitted(A, b), np.linalg.solve(hpd, b), dtype), **case)
            x = jaxmg.potrs(A, b, T_A=2, backend="mp")  # the engine relays to 2-column tiles
            report("potrs_tile2", close(x, np.linalg.solve(hpd, b), dtype), **case)
            x = jaxmg.potrs(A, b, T_A=2, backend="mp", relayout="jax")  # JAX relays them
            report("potrs_tile2_jax", close(x, np.linalg.solve(hpd, b), dtype), **case)
            inv = host(jaxmg.potri(A, backend="mp"))
            report("potri", close(inv, np.linalg.inv(hpd), dtype), **case)
            w, v = jaxmg.syevd(A, backend="mp")
            v = host(v)
            ok = close(w, np.linalg.eigvalsh(hpd), dtype)
            report("syevd", ok and close(hpd @ v, v * np.asarray(w), dtype), **case)
            factor = jaxmg.cho_factor(A, backend="mp")
            ok = close(jaxmg.cho_solve(factor, b), np.linalg.solve(hpd, b), dtype)
            ok = ok and close(factor.logdet, np.linalg.slogdet(hpd)[1], dtype)
            report("cho_solve", ok, **case)
            for trans, op in ((0, general), (1, general.T), (2, general.conj().T)):
                x = jaxmg.lu_solve(G, b, trans=trans, backend="mp")
                report("lu_solve", close(x, np.linalg.solve(op, b), dtype), trans=trans, **case)
            lu = jaxmg.lu_factor(G, backend="mp")
            x = jaxmg.lu_solve(lu, b)
            report("lu_factor", close(x, np.linalg.solve(general, b), dtype), **case)
            # The one-node engine, in its one-process-per-device mode: the same answers.
            x_mg = jaxmg.potrs(A, b, backend="mg")
            report("same_as_mg", close(jaxmg.potrs(A, b, backend="mp"), x_mg, dtype), **case)
    # Failure: status and NaN, on every process.
    hpd, _, b = matrices(n, np.float64)
    bad = hpd.copy()
    bad[3, 3] = -1.0
    A = jax.device_put(bad, NamedSharding(mesh, P(None, "x")))
    x, status = jaxmg.potrs(A, b, backend="mp", return_status=True)
    # LAPACK's info of A (the leading minor of order 4), as on every backend.
    report("not_pd", int(status) == 4 and bool(np.isnan(np.asarray(x)).all()), status=int(status))
    broken = hpd.copy()
    broken[n - 1, 2] = broken[2, n - 1] = np.nan
    # Each process gives its own blocks: device_put compares the whole array across processes,
    # and NaN != NaN.
    sharding = NamedSharding(mesh, P(None, "x"))
    A = jax.make_array_from_callback(broken.shape, sharding, lambda index: broken[index])
    x, status = jaxmg.potrs(A, b, backend="mp", return_status=True)
    ok = int(status) == n + 1 and bool(np.isnan(np.asarray(x)).all())  # NaN in A: N + 1
    report("nan_in_a", ok, status=int(status))
    # Inside the user's shard_map, on local column blocks.
    A = jax.device_put(hpd, NamedSharding(mesh, P(None, "x")))
    local = jax.shard_map(
        lambda a, r: jaxmg.potrs_no_shardmap(a, r, backend="mp"),
        mesh=mesh, in_specs=(P(None, "x"), P()), out_specs=(P(), P()), check_vma=False,
    )  # fmt: skip
    x, status = jax.jit(local)(A, b)
    ok = int(np.asarray(status)[0]) == 0 and close(x, np.linalg.solve(hpd, b), np.float64)
    report("no_shardmap", ok)
    # Derivatives: the rules are the backend's too.
    A = jax.device_put(hpd, NamedSharding(mesh, P(None, "x")))

    def loss(a):
        x, logdet = jaxmg.potrs(a, b, backend="mp", return_logdet=True)
        return jnp.sum(b * x) + logdet

    grad = host(jax.grad(loss)(A))
    inv = np.linalg.inv(hpd)
    expected = -inv @ b @ b.T @ inv + inv  # d/dA of b^T A^-1 b + log det A, A symmetric
    report("grad", close(grad, expected, np.float64))


def grid(mesh, line):
    n = 12 * size
    spec = P("r", "c")
    for dtype in DTYPES:
        hpd, general, b = matrices(n, dtype)
        case = dict(dtype=np.dtype(dtype).name)
        A = jax.device_put(hpd, NamedSharding(mesh, spec))
        G = jax.device_put(general, NamedSharding(mesh, spec))
        x, logdet, status = jaxmg.potrs(A, b, return_logdet=True, return_status=True)
        ok = int(status) == 0 and close(x, np.linalg.solve(hpd, b), dtype)
        report("potrs", ok and close(logdet, np.linalg.slogdet(hpd)[1], dtype), **case)
        jitted = jax.jit(lambda a, r: jaxmg.potrs(a, r, backend="mp"))
        report("potrs_jit", close(jitted(A, b), np.linalg.solve(hpd, b), dtype), **case)
        x = jaxmg.potrs(A, b, T_A=5)  # 5 x 5 tiles: the engine's relayout (pdgemr2d)
        report("potrs_tile5", close(x, np.linalg.solve(hpd, b), dtype), **case)
        # JAX's relayout, with padding, for the routines whose results come back relaid.
        x = jaxmg.potrs(A, b, T_A=5, relayout="jax")
        inv = host(jaxmg.potri(A, T_A=5, relayout="jax"))
        w, v = jaxmg.syevd(A, T_A=5, relayout="jax")
        ok = close(x, np.linalg.solve(hpd, b), dtype) and close(inv, np.linalg.inv(hpd), dtype)
        v = host(v)
        ok = ok and close(w, np.linalg.eigvalsh(hpd), dtype) and close(hpd @ v, v * w, dtype)
        report("jax_relayout", ok, **case)
        inv = jaxmg.potri(A, T_A=5)
        ok = inv.sharding.spec == spec and close(host(inv), np.linalg.inv(hpd), dtype)
        report("potri", ok, **case)
        w, v = jaxmg.syevd(A, T_A=5)
        v = host(v)
        ok = close(w, np.linalg.eigvalsh(hpd), dtype)
        report("syevd", ok and close(hpd @ v, v * np.asarray(w), dtype), **case)
        factor = jaxmg.cho_factor(A, T_A=5)
        ok = close(jaxmg.cho_solve(factor, b), np.linalg.solve(hpd, b), dtype)
        ok = ok and close(factor.logdet, np.linalg.slogdet(hpd)[1], dtype)
        report("cho_solve", ok, **case)
        for trans, op in ((0, general), (1, general.T), (2, general.conj().T)):
            x = jaxmg.lu_solve(G, b, T_A=5, trans=trans)
            report("lu_solve", close(x, np.linalg.solve(op, b), dtype), trans=trans, **case)
        x = jaxmg.lu_solve(jaxmg.lu_factor(G), b)
        report("lu_factor", close(x, np.linalg.solve(general, b), dtype), **case)
        # The same processes with the 1D layout give the same answer.
        A1 = jax.device_put(hpd, NamedSharding(line, P(None, "x")))
        with jax.set_mesh(line):
            x1 = jaxmg.potrs(A1, b, backend="mp")
            x_mg = jaxmg.potrs(A1, b, backend="mg")  # the one-node engine, a process per device
        x = jaxmg.potrs(A, b)
        report("same_as_1d_and_mg", close(x, x1, dtype) and close(x, x_mg, dtype), **case)
    hpd, _, b = matrices(n, np.float64)
    # A mesh with Auto axes, under jit: XLA places the results (potri's fill reshards a
    # transpose with a sharding constraint there).
    auto = jax.make_mesh(mesh.axis_sizes, ("r", "c"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    A = jax.device_put(hpd, NamedSharding(auto, spec))
    with jax.set_mesh(auto):
        inv, x = jax.jit(
            lambda a: (
                jaxmg.potri(a, T_A=5, in_specs=spec),  # Auto axes: the sharding is not visible
                jaxmg.potrs(a, b, T_A=5, in_specs=spec),
            )
        )(A)
    ok = close(host(inv), np.linalg.inv(hpd), np.float64)
    report("auto_axes_jit", ok and close(x, np.linalg.solve(hpd, b), np.float64))
    A = jax.device_put(hpd, NamedSharding(mesh, spec))
    # Inside the user's shard_map, on the blocks of P(r, c).
    grid_kw = dict(T_A=5, sharded_by="grid", axis_name=("r", "c"), backend="mp")

    def blocks(a, r):
        x, solved = jaxmg.potrs_no_shardmap(a, r, **grid_kw)
        w, v, converged = jaxmg.syevd_no_shardmap(a, **grid_kw)
        return x, w, v, solved + converged

    mapped = jax.shard_map(
        blocks, mesh=mesh, in_specs=(spec, P()), out_specs=(P(), P(), spec, P()), check_vma=False
    )
    x, w, v, status = jax.jit(mapped)(A, b)
    v = host(v)
    ok = int(np.asarray(status)[0]) == 0 and close(x, np.linalg.solve(hpd, b), np.float64)
    ok = ok and close(w, np.linalg.eigvalsh(hpd), np.float64)
    report("no_shardmap", ok and close(hpd @ v, v * np.asarray(w), np.float64))
    inverse = jax.shard_map(
        lambda a: jaxmg.potri_no_shardmap(a, **grid_kw),
        mesh=mesh, in_specs=spec, out_specs=(spec, P()), check_vma=False,
    )  # fmt: skip
    if mesh.axis_sizes[0] == mesh.axis_sizes[1]:
        inv, status = jax.jit(inverse)(A)
        ok = int(np.asarray(status)[0]) == 0 and close(host(inv), np.linalg.inv(hpd), np.float64)
    else:
        try:
            jax.jit(inverse)(A)
            ok = False
        except ValueError as error:  # refused while tracing, before any device work
            ok = "square grids only" in str(error)
    report("potri_no_shardmap", ok)

    def loss(a):
        x, logdet = jaxmg.potrs(a, b, T_A=5, return_logdet=True)
        return jnp.sum(b * x) + logdet

    grad = host(jax.grad(loss)(A))
    inv = np.linalg.inv(hpd)
    report("grad", close(grad, -inv @ b @ b.T @ inv + inv, np.float64))
    # d/dA of the largest eigenvalue: v v^T, its eigenvector's outer product.
    top = jax.grad(lambda a: jaxmg.syevd(a, T_A=5, return_eigenvectors=False)[-1])(A)
    v = np.linalg.eigh(hpd)[1][:, -1]
    report("grad_syevd", close(host(top), np.outer(v, v), np.float64))


def quick(mesh):
    n = 4 * size
    hpd, general, b = matrices(n, np.float64, seed=rank // size)
    A = jax.device_put(hpd, NamedSharding(mesh, P(None, "x")))
    G = jax.device_put(general, NamedSharding(mesh, P("x", None)))
    for _ in range(5):
        report("potrs", close(jaxmg.potrs(A, b, backend="mp"), np.linalg.solve(hpd, b), np.float64))
        x = jaxmg.lu_solve(G, b, backend="mp")
        report("lu_solve", close(x, np.linalg.solve(general, b), np.float64))


def order(mesh):
    import jaxmg_cuda

    n = 4 * size
    hpd, general, b = matrices(n, np.float64)
    A = jax.device_put(hpd, NamedSharding(mesh, P(None, "x")))
    G = jax.device_put(general, NamedSharding(mesh, P(None, "x")))

    @jax.jit
    def both(a, g, r):
        return jaxmg.potrs(a, r, backend="mp"), jaxmg.lu_solve(g, r, backend="mp")

    first = next(jaxmg_cuda.mp._call_ids) + 1  # the ids the next trace takes, on every process
    if rank == size - 1:
        os.environ["JAXMG_TEST_MP_LATE"] = f"{first}:1.0"
    for _ in range(3):
        x, y = both(A, G, b)
        report("potrs", close(x, np.linalg.solve(hpd, b), np.float64))
        report("lu_solve", close(y, np.linalg.solve(general, b), np.float64))
    os.environ.pop("JAXMG_TEST_MP_LATE", None)
    # Two programs started from two threads, in opposite orders on the first and last rank.
    import threading
    import time

    solve_a = jax.jit(lambda a, r: jaxmg.potrs(a, r, backend="mp"))
    solve_g = jax.jit(lambda g, r: jaxmg.lu_solve(g, r, backend="mp"))
    programs = [solve_a.lower(A, b).compile(), solve_g.lower(G, b).compile()]  # ids in order
    out = [None, None]

    def start(k, delay):
        time.sleep(delay)
        out[k] = programs[k](*((A, b) if k == 0 else (G, b)))
        jax.block_until_ready(out[k])

    late = 0 if rank == size - 1 else 1  # the last rank starts the second program first
    threads = [threading.Thread(target=start, args=(k, 1.0 if k == late else 0.0)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report("threads_potrs", close(out[0], np.linalg.solve(hpd, b), np.float64))
    report("threads_lu_solve", close(out[1], np.linalg.solve(general, b), np.float64))
    report("step_backs", True, step_backs=int(jaxmg_cuda._jaxmg_cuda.mp_step_backs()))


def donate(mesh):

    n = 8 * size
    hpd, general, b = matrices(n, np.float64)
    block = n * n * 8 / size  # bytes of A per process
    for form in ("cols", "rows"):
        sharding = NamedSharding(mesh, P(None, "x") if form == "cols" else P("x", None))

        def put(m, sharding=sharding):
            return jax.device_put(m, sharding)

        A = put(hpd)
        x = jaxmg.potrs(A, b, backend="mp", donate=True)
        ok = A.is_deleted() and close(x, np.linalg.solve(hpd, b), np.float64)
        report("donate_potrs", ok, form=form)
        A = put(hpd)
        factor = jaxmg.cho_factor(A, backend="mp", donate=True)
        ok = A.is_deleted() and close(
            jaxmg.cho_solve(factor, b), np.linalg.solve(hpd, b), np.float64
        )
        report("donate_cho_factor", ok, form=form)
        G = put(general)
        lu = jaxmg.lu_factor(G, backend="mp", donate=True)
        ok = G.is_deleted() and close(
            jaxmg.lu_solve(lu, b), np.linalg.solve(general, b), np.float64
        )
        report("donate_lu_factor", ok, form=form)
        A = put(hpd)
        inv = jaxmg.potri(A, backend="mp", donate=True)
        report(
            "donate_potri",
            A.is_deleted() and close(host(inv), np.linalg.inv(hpd), np.float64),
            form=form,
        )
        A = put(hpd)
        w = jaxmg.syevd(A, backend="mp", return_eigenvectors=False, donate=True)
        report(
            "donate_syevd",
            A.is_deleted() and close(w, np.linalg.eigvalsh(hpd), np.float64),
            form=form,
        )
        for name, factorise in (
            ("cho_factor", lambda a: jaxmg.cho_factor(a, backend="mp").factor),
            ("lu_factor", lambda a: jaxmg.lu_factor(a, backend="mp").factor),
        ):
            compiled = jax.jit(factorise, donate_argnums=0).lower(put(hpd)).compile()
            header = compiled.as_text().splitlines()[0]
            aliased = re.findall(r"\{\d*\}: \(0, \{\}, (?:may|must)-alias\)", header)
            m = compiled.memory_analysis()
            total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            blocks = (total + m.temp_size_in_bytes) / block
            report(f"donate_alias_{name}", bool(aliased), form=form, blocks=round(blocks, 2))


def random(shape, dtype, rng):
    x = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def orthonormal(q, dtype):
    return close(q.conj().T @ q, np.eye(q.shape[1]), dtype)


def decompositions(mesh, specs):
    """svd, qr, polar, lstsq (ScaLAPACK's p?gesvd, p?geqrf + p?orgqr) and p?gels on each of
    ``specs`` ((name, PartitionSpec) pairs over ``mesh``): every dtype of DTYPES, tall, wide
    and square (single precision: tall only), a rank-deficient A, and the jvps."""
    import scipy.linalg

    from jaxmg.decompositions import engine_routines as _engine_rect

    rng = np.random.default_rng(3)
    p = size
    shapes = {"tall": (6 * p, 2 * p), "wide": (2 * p, 6 * p), "square": (4 * p, 4 * p)}
    mp = dict(backend="mp")
    for dtype in DTYPES:
        double = np.finfo(dtype).bits == 64
        for kind in ("tall", "wide", "square") if double else ("tall",):
            a = random(shapes[kind], dtype, rng)
            b = random((shapes[kind][0], 3), dtype, rng)
            for form, spec in specs:
                A = jax.device_put(a, NamedSharding(mesh, spec))
                tag = dict(form=form, dtype=np.dtype(dtype).name, shape=kind)
                u, s, vh = (host(x) for x in jaxmg.svd(A, T_A=3, **mp))
                ok = close(s, np.linalg.svd(a, compute_uv=False), dtype)
                ok = ok and close((u * s) @ vh, a, dtype) and orthonormal(u, dtype)
                report("svd", ok and orthonormal(vh.conj().T, dtype), **tag)
                q, r = (host(x) for x in jaxmg.qr(A, **mp))
                d = np.diagonal(r)
                ok = (
                    close(q @ r, a, dtype) and orthonormal(q, dtype) and np.all(np.tril(r, -1) == 0)
                )
                report("qr", ok and np.all(d.real >= 0) and np.all(d.imag == 0), **tag)
                x = host(_engine_rect.gels(A, jnp.asarray(b), T_A=2))
                report("gels", close(x, np.linalg.lstsq(a, b, rcond=None)[0], dtype), **tag)
                x, resid, rank, _ = (host(v) for v in jaxmg.lstsq(A, jnp.asarray(b), **mp))
                ok = close(x, np.linalg.lstsq(a, b, rcond=None)[0], dtype)
                report("lstsq", ok and int(rank) == min(a.shape), **tag)
                if kind == "tall":
                    up, pp = (host(x) for x in jaxmg.polar(A, **mp))
                    u_ref, p_ref = scipy.linalg.polar(a)
                    report("polar", close(up, u_ref, dtype) and close(pp, p_ref, dtype), **tag)

    # The engine's results come back in blocks, never whole on every process: its U and Vh (Q
    # and R) in the compiled program are this process's share of them (1/p of their entries),
    # and from 4 processes the program's temporaries and results per process are below the
    # whole U and Vh plus that share, what it held when they came back whole (float64).
    sized = random((8 * p, 4 * p), np.float64, rng)
    entries = (sized.shape[0] + sized.shape[1]) * sized.shape[1]
    for form, spec in specs:
        A = jax.device_put(sized, NamedSharding(mesh, spec))
        for name, f, target in (("svd", jaxmg.svd, "gesvd"), ("qr", jaxmg.qr, "qr")):
            out = f(A, **mp)
            compiled = jax.jit(lambda m, f=f: f(m, **mp)).lower(A).compile()
            call = next(
                line
                for line in compiled.as_text().splitlines()
                if f'custom_call_target="jaxmg_mp_{target}"' in line
            )
            dims = re.findall(r"\[(\d+),(\d+)\]", call.split("custom-call(")[0])
            returned = sum(int(r) * int(c) for r, c in dims)
            memory = compiled.memory_analysis()
            held = memory.temp_size_in_bytes + memory.output_size_in_bytes
            ok = all(x.sharding.spec == spec for x in out if x.ndim == 2)
            ok = ok and returned * p == entries and (p < 4 or held < 8 * entries * (1 + 1 / p))
            report(f"{name}_results_in_blocks", ok, form=form, returned=returned, held=held)
        if form == "rows":  # K = 3 divides no grid: U in blocks, Vh and R whole
            a = random((6 * p, 3), np.float64, rng)
            A = jax.device_put(a, NamedSharding(mesh, spec))
            u, s, vh = (host(x) for x in jaxmg.svd(A, **mp))
            ok = close(s, np.linalg.svd(a, compute_uv=False), np.float64)
            report("svd_narrow", ok and close((u * s) @ vh, a, np.float64), form=form)
            q, r = (host(x) for x in jaxmg.qr(A, **mp))
            ok = close(q @ r, a, np.float64) and orthonormal(q, np.float64)
            report("qr_narrow", ok and np.all(np.tril(r, -1) == 0), form=form)

    for form, spec in specs:
        if form == "grid":  # full_matrices=True is the composition's, which takes no grid
            A = jax.device_put(random(shapes["tall"], np.float64, rng), NamedSharding(mesh, spec))
            try:
                jaxmg.svd(A, full_matrices=True, backend="mp")
                report("svd_full_on_grid_refused", False)
            except ValueError as error:
                report("svd_full_on_grid_refused", "full_matrices=True" in str(error))

    # Rank-deficient A (float64, tall): column 1 = 2 x column 0, the last column zero.
    dtype = np.float64
    a = random(shapes["tall"], dtype, rng)
    a[:, 1] = 2 * a[:, 0]
    a[:, -1] = 0
    b = random((a.shape[0], 2), dtype, rng)
    n = a.shape[1]
    for form, spec in specs:
        A = jax.device_put(a, NamedSharding(mesh, spec))
        # p?gesvd: two singular values at rounding level, the rest numpy's, A reconstructed.
        u, s, vh = (host(x) for x in jaxmg.svd(A, **mp))
        s_ref = np.linalg.svd(a, compute_uv=False)
        ok = close(s[: n - 2], s_ref[: n - 2], dtype) and np.all(s[n - 2 :] < 1e-12 * s[0])
        report("svd_deficient", ok and close((u * s) @ vh, a, dtype), form=form)
        # lstsq drops them: rank N - 2 and numpy's minimum-norm solution.
        x, _, rank, _ = (host(v) for v in jaxmg.lstsq(A, jnp.asarray(b), **mp))
        ok = int(rank) == n - 2 and close(x, np.linalg.lstsq(a, b, rcond=None)[0], dtype)
        report("lstsq_deficient", ok, form=form)
        # p?gels: the triangular factor's exactly zero diagonal entry N is the status, x NaN.
        x, status = _engine_rect.gels(A, jnp.asarray(b), return_status=True)
        ok = int(host(status)) == n and np.all(np.isnan(host(x)))
        report("gels_singular", ok, form=form, status=int(host(status)))
        # Householder QR has no failure: status 0, A = Q R, Q orthonormal, R[N-1, N-1] = 0.
        q, r, status = (host(v) for v in jaxmg.qr(A, return_status=True, **mp))
        ok = int(status) == 0 and close(q @ r, a, dtype) and orthonormal(q, dtype)
        report("qr_deficient", ok and abs(r[-1, -1]) < 1e-12 * abs(r[0, 0]), form=form)

    # jvps: of s against JAX's rule, of Q and R against central differences.
    for dtype, kind in ((np.float64, "tall"), (np.complex128, "square")):
        a = random(shapes[kind], dtype, rng)
        da = random(shapes[kind], dtype, rng)
        _, ds_ref = jax.jvp(
            lambda m: jnp.linalg.svd(m, compute_uv=False), (jnp.asarray(a),), (jnp.asarray(da),)
        )
        for form, spec in specs:
            sharding = NamedSharding(mesh, spec)
            _, ds = jax.jvp(
                lambda m: jaxmg.svd(m, compute_uv=False, **mp),
                (jax.device_put(a, sharding),),
                (jax.device_put(da, sharding),),
            )
            report("svd_jvp", close(host(ds), np.asarray(ds_ref), dtype), form=form, shape=kind)
    h = 1e-6
    for kind in ("tall", "wide"):
        a = random(shapes[kind], np.float64, rng)
        da = random(shapes[kind], np.float64, rng)
        for form, spec in specs:
            sharding = NamedSharding(mesh, spec)
            put = functools.partial(jax.device_put, device=sharding)
            _, (dq, dr) = jax.jvp(lambda m: jaxmg.qr(m, **mp), (put(a),), (put(da),))
            plus = [host(v) for v in jaxmg.qr(put(a + h * da), **mp)]
            minus = [host(v) for v in jaxmg.qr(put(a - h * da), **mp)]
            ok = all(
                np.max(np.abs(host(d) - (p_ - m_) / (2 * h))) < 1e-5 * max(1, np.max(np.abs(p_)))
                for d, p_, m_ in zip((dq, dr), plus, minus, strict=True)
            )
            report("qr_jvp", ok, form=form, shape=kind)


def killed(mesh):
    n = 4 * size
    hpd, _, b = matrices(n, np.float64)
    A = jax.device_put(hpd, NamedSharding(mesh, P(None, "x")))
    report("first", close(jaxmg.potrs(A, b, backend="mp"), np.linalg.solve(hpd, b), np.float64))
    results.joinpath(f"{rank}.jsonl").write_text("\n".join(lines) + "\n")
    # Every process has written its results before one of them dies.
    multihost_utils.sync_global_devices("results written")
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    jaxmg.potrs(A, b, backend="mp").block_until_ready()
    report("survived", False)  # unreachable: the job is ended


mesh = jax.make_mesh((size,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
if scenario.startswith("decompositions:"):
    rows, cols = (int(v) for v in scenario.split(":")[1].split("x"))
    explicit = (jax.sharding.AxisType.Explicit,) * 2
    grid_mesh = jax.make_mesh((rows, cols), ("r", "c"), axis_types=explicit)
    with jax.set_mesh(grid_mesh):
        decompositions(grid_mesh, [("grid", P("r", "c"))])
elif scenario.startswith("grid:"):
    rows, cols = (int(v) for v in scenario[5:].split("x"))
    explicit = (jax.sharding.AxisType.Explicit,) * 2
    grid_mesh = jax.make_mesh((rows, cols), ("r", "c"), axis_types=explicit)
    with jax.set_mesh(grid_mesh):
        grid(grid_mesh, mesh)
else:
    with jax.set_mesh(mesh):
        scenarios = dict(
            solve=solve,
            quick=quick,
            order=order,
            killed=killed,
            donate=donate,
            decompositions=lambda mesh: decompositions(
                mesh, [("cols", P(None, "x")), ("rows", P("x", None))]
            ),
        )
        scenarios[scenario](mesh)
results.joinpath(f"{rank}.jsonl").write_text("\n".join(lines) + "\n")
jax.distributed.shutdown()
