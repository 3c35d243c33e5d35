"""Backend ``"mp"`` (cuSOLVERMp over NCCL) on one GPU: the step of ``gpu_validate.py`` that
checks it, in one process on a 1 x 1 grid.

    python benchmarks/mp_gpu_check.py --json rows.jsonl [--smoke] [--budget S]

Every routine backend ``"mp"`` runs on GPUs, in float32, float64, complex64 and complex128,
against numpy: ``potrs``, ``cho_factor`` + ``cho_solve``, ``lu_factor`` + ``lu_solve``,
``syevd`` (values and vectors), ``qr`` (cuSOLVERMp's Geqrf + Orgqr) and ``least_squares``
(Gels); the status of a matrix that is not positive definite (``k > 0``, ``x`` NaN) and of an
exactly singular LU (cuSOLVERMp 0.8.0 fails the former with an internal error, which jaxmg
names); the cuSOLVERMp release the process loaded. Then the time of ``potrs`` N =
16384 and ``syevd`` N = 8192 (float64) with backend ``"mp"``, with ``"mg"`` (cuSolverMg) and
with JAX's own solver on the same GPU, in the same run: what cuSOLVERMp costs on one device.

Rows go to ``--json`` as they are made (one JSON line each: ``{"kind": "test", ...}`` for a
check, ``{"kind": "bench", ...}`` for a timing, in ``gpu_validate.py``'s forms), so a run killed
at its deadline keeps what it did; a case that raises is a failed row, and the run goes on. A
case past ``--budget`` seconds is not started.

``--smoke`` (CI, no GPU): the same code on one CPU device with ``backend="mg"`` (the LAPACK
twin: backend ``"mp"`` on CPUs needs MPI), at tiny sizes, one timed run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import traceback

os.environ.setdefault("JAXMG_GPU_MULTIPROCESS", "1")  # backend "mp" on GPUs is opt-in

STEP = "backend mp (cuSOLVERMp) on one GPU"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=pathlib.Path, required=True, help="where the rows go")
    p.add_argument("--smoke", action="store_true", help="CI: one CPU device, backend 'mg'")
    p.add_argument("--budget", type=float, default=120.0, help="seconds; later cases skipped")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.smoke:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from _common import program_memory, timed

    started = time.monotonic()
    backend = "mg" if args.smoke else "mp"
    mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
    cols = P(None, "x")
    out = args.json.open("w")
    failures = 0

    def emit(row):
        out.write(json.dumps(row) + "\n")
        out.flush()

    def check(name, run):
        """One check: ``run()`` returns ``(ok, detail)``; an exception is a failure."""
        nonlocal failures
        if time.monotonic() - started > args.budget:
            emit({"kind": "test", "step": STEP, "test": name, "outcome": "skipped",
                  "seconds": 0.0, "message": "past --budget"})  # fmt: skip
            return
        start = time.monotonic()
        try:
            ok, detail = run()
        except Exception as err:  # noqa: BLE001 - reported as the row's failure
            ok, detail = False, "".join(traceback.format_exception_only(err)).strip()
        failures += not ok
        emit({"kind": "test", "step": STEP, "test": name,
              "outcome": "passed" if ok else "failed",
              "seconds": time.monotonic() - start, "message": str(detail)[:400]})  # fmt: skip

    def placed(a):
        return jax.device_put(jnp.asarray(a), NamedSharding(mesh, cols))

    def random(shape, dtype, seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(shape)
        if np.issubdtype(dtype, np.complexfloating):
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(dtype)

    n = 16 if args.smoke else 256
    kw = dict(mesh=mesh, in_specs=cols, backend=backend)

    def cases(dtype):
        """The checks of one dtype: (what, run) pairs."""
        name = np.dtype(dtype).name
        tol = 1e-3 if np.finfo(dtype).bits <= 32 else 1e-10
        m = random((n, n), dtype, seed=1)
        spd = (m @ m.conj().T + n * np.eye(n)).astype(dtype)
        general = (m + n * np.eye(n)).astype(dtype)
        b = random((n, 2), dtype, seed=2)

        def residual(a, x):
            return float(np.linalg.norm(a @ np.asarray(x) - b) / np.linalg.norm(b))

        def potrs():
            x, status = jaxmg.potrs(placed(spd), jnp.asarray(b), T_A=64, return_status=True, **kw)
            r = residual(spd, x)
            return int(status) == 0 and r < tol, f"residual {r:.2e}, status {int(status)}"

        def cholesky():
            factor = jaxmg.cho_factor(placed(spd), T_A=64, **kw)
            x = jaxmg.cho_solve(factor, jnp.asarray(b))
            sign, logdet = np.linalg.slogdet(spd.astype(np.complex128))
            gap = abs(float(factor.logdet) - float(np.real(logdet)))
            r = residual(spd, x)
            return r < tol and gap < 1e3 * tol * n, f"residual {r:.2e}, logdet off by {gap:.1e}"

        def lu():
            factor = jaxmg.lu_factor(placed(general), T_A=64, **kw)
            r = residual(general, jaxmg.lu_solve(factor, jnp.asarray(b)))
            return r < tol, f"residual {r:.2e}"

        def syevd():
            w, v = jaxmg.syevd(placed(spd), T_A=64, **kw)
            w, v = np.asarray(w), np.asarray(v)
            expected = np.linalg.eigvalsh(spd.astype(np.complex128))
            scale = np.abs(expected).max()
            values = np.abs(w - expected).max() / scale
            vectors = np.linalg.norm(spd @ v - v * w) / (np.linalg.norm(spd) * n)
            return values < tol and vectors < tol, f"values {values:.1e}, vectors {vectors:.1e}"

        def qr():
            # 64 divides neither side: Q and R come back as tiles padded past their extents
            a = random((n + n // 2 + 3, n - 5), dtype, seed=3)
            q, r = jaxmg.qr(placed(a), 64, **kw)
            q, r = np.asarray(q), np.asarray(r)
            backward = np.linalg.norm(q @ r - a) / np.linalg.norm(a)
            orthonormal = np.linalg.norm(q.conj().T @ q - np.eye(n - 5)) / n
            ok = backward < tol and orthonormal < tol and np.allclose(np.tril(r, -1), 0)
            return ok, f"backward {backward:.1e}, orthonormality {orthonormal:.1e}"

        def least_squares():
            a, rhs = random((n + n // 2, n), dtype, seed=4), random((n + n // 2, 1), dtype, 5)
            x = np.asarray(jaxmg.least_squares(placed(a), jnp.asarray(rhs), 64, **kw))
            expected = np.linalg.lstsq(a.astype(np.complex128), rhs, rcond=None)[0]
            error = np.linalg.norm(x - expected) / np.linalg.norm(expected)
            return error < 100 * tol, f"relative error {error:.1e}"

        return [
            (f"potrs {name}", potrs),
            (f"cho_factor + cho_solve {name}", cholesky),
            (f"lu_factor + lu_solve {name}", lu),
            (f"syevd {name}", syevd),
            (f"qr {name}", qr),
            (f"least_squares {name}", least_squares),
        ]

    def not_pd():
        a = np.eye(n)
        a[n // 2, n // 2] = -1.0
        if backend == "mp":  # cuSOLVERMp 0.8.0 fails it with an internal error (docs/gpu.md)
            try:
                jax.block_until_ready(jaxmg.potrs(placed(a), jnp.ones((n, 1)), T_A=8, **kw))
            except jax.errors.JaxRuntimeError as err:
                said = "not positive definite" in str(err)
                return said, f"refused{'' if said else ' without saying why'}: {err}"
            return False, "no error"
        x, status = jaxmg.potrs(placed(a), jnp.ones((n, 1)), T_A=8, return_status=True, **kw)
        ok = int(status) == n // 2 + 1 and np.isnan(np.asarray(x)).all()
        return ok, f"status {int(status)} (expected {n // 2 + 1}), x NaN: {np.isnan(x).all()}"

    def singular():
        a = np.eye(n)
        a[:, n - 1] = 0.0  # U[n-1, n-1] is exactly zero
        factor = jaxmg.lu_factor(placed(a), T_A=8, **kw)
        return int(factor.status) == n, f"status {int(factor.status)} (expected {n})"

    # The statuses first, in a process no other call has touched: a failure is their own.
    check("not positive definite: status k, x NaN", not_pd)
    check("singular LU: status N", singular)

    for dtype in (np.float32, np.float64, np.complex64, np.complex128):
        for what, run in cases(dtype):
            check(what, run)

    if not args.smoke:
        import jaxmg_cuda.mp

        def version():
            release, gesvd = jaxmg_cuda.mp.cusolvermp_version()
            return release is not None, f"cuSOLVERMp {release} (Gesvd: {gesvd})"

        check("the cuSOLVERMp release loaded", version)

    def scaled_error(routine, dense, rhs, result):
        """potrs: |A x - b| / (|A| |x| N eps); syevd: |A V - V diag(w)| / (|A| N eps)."""
        eps, size = float(jnp.finfo(dense.dtype).eps), dense.shape[0]
        norm = float(jnp.linalg.norm(dense))
        if routine == "potrs":
            x = jax.device_put(result, dense.sharding)
            off = float(jnp.linalg.norm(dense @ x - rhs))
            return off / (norm * float(jnp.linalg.norm(x)) * size * eps)
        w, v = (jax.device_put(r, dense.sharding) for r in result)
        return float(jnp.linalg.norm(dense @ v - v * w)) / (norm * size * eps)

    # Timings: backend "mp", "mg" and JAX's own solver on the same device.
    sizes = {"potrs": 64 if args.smoke else 16384, "syevd": 32 if args.smoke else 8192}
    runs = 1 if args.smoke else 3
    for routine, size in sizes.items():
        if time.monotonic() - started > args.budget:
            break
        key = jax.random.PRNGKey(size)
        g = jax.random.normal(key, (size, size), jnp.float64)
        dense = jax.block_until_ready(g @ g.T / size + jnp.eye(size))  # on the one device
        a = jax.device_put(dense, NamedSharding(mesh, cols))
        rhs = jnp.ones((size, 1), jnp.float64)
        solver = {"potrs": jaxmg.potrs, "syevd": jaxmg.syevd}[routine]

        def jaxmg_on(engine, solver=solver):
            return jax.jit(lambda *x: solver(*x, backend=engine, mesh=mesh, in_specs=cols))

        if routine == "potrs":
            own = jax.jit(
                lambda a, b: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), b)
            )
            rest = (rhs,)
        else:
            own, rest = jax.jit(jnp.linalg.eigh), ()
        # JAX's own solver takes the matrix as its one device holds it, jaxmg's sharded.
        variants = {
            "jax": (own, (dense, *rest)),
            "mg": (jaxmg_on("mg"), (a, *rest)),
            "mp": (jaxmg_on(backend), (a, *rest)),
        }
        for variant, (fn, operands) in variants.items():
            row = {"kind": "bench", "group": "mp", "routine": routine, "label": "", "n": size,
                   "dtype": "float64", "variant": variant, "T_A": None, "ndev": 1,
                   "relayout": "-"}  # fmt: skip
            try:
                start = time.monotonic()
                compiled = fn.lower(*operands).compile()
                row["compile_s"] = time.monotonic() - start
                row["memory"] = program_memory(compiled)
                error = scaled_error(routine, dense, rhs, compiled(*operands))
                median, low, high = timed(compiled, operands, runs, 1)
                passed = bool(error < 30)
                calls = compiled.as_text().count('custom_call_target="jaxmg_')
                row.update(median_s=median, min_s=low, max_s=high, passed=passed)
                row.update(check={"value": error, "passed": passed}, native_calls=calls)
                failures += not passed
            except Exception as err:  # noqa: BLE001 - the row's error
                row["error"] = "".join(traceback.format_exception_only(err)).strip()
                row["passed"] = False
                failures += 1
            emit(row)
    out.close()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
