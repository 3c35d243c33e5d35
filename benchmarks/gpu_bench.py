"""The GPU benchmark table of issue 24: jaxmg against JAX's own single-device solvers.

    python benchmarks/gpu_bench.py GROUP --json rows.jsonl [--smoke] [--budget S]

``benchmarks/gpu_validate.py`` (``nox -s gpu``) runs each group in a process of its own (a
crash loses one group, not the table) and merges their rows into its results file. Groups:

- ``potrs``: float64 N=32768 with the tile sweep T_A = auto, 256, 512, 1024, 2048, 32768;
  float32 N=32768; float64 N=16384 (auto and T_A=1024); the fixed cost of a call (float32
  N=64, 50 timed runs).
- ``syevd``: float64 N=8192, with eigenvectors and values only.
- ``factored``: lu_solve N=8192 (T_A=512: cuSolverMg's getrf refused tiles of 1024 and more
  on the H100); cho_factor + cho_solve (with logdet) and cho_solve with a given factor,
  N=16384; a Gaussian process likelihood's value_and_grad, N=8192 (its kernel matrix built on
  the mesh, as in ``benchmarks/autodiff.py``).
- ``blocked``: potrs float64 N=32768 and syevd float64 N=8192 by backend ``"jax"``'s engine of
  XLA collectives forced on one device (``blocked``: on one device ``backend="jax"`` takes
  JAX's own dense solvers), against JAX's ``cho_factor`` + ``cho_solve`` and ``eigh``: the
  efficiency each device of several would bring (issue 47 aims at 1.25x JAX's time for potrs;
  issue 48 compares the eigensolver with JAX's ``eigh`` and cuSolverMg's ``syevd``, 3.1x
  ``eigh`` on an H200).
- ``scaling`` (more than one device): potrs N=32768 and syevd N=8192 on 1, 2, 4, 8 devices (as
  many as there are), and ``relayout="native"`` against ``"jax"`` on all of them.

Variants of each case: ``jax`` (JAX's own solver on one device: ``cho_factor``/``cho_solve``,
``eigh``, ``eigvalsh``, ``solve``), ``default`` (jaxmg, ``backend=None``: on a one-device mesh
JAX's own solvers inside jaxmg's programs, once issue 24's one-device path is in; before that,
cuSolverMg), ``mg`` (``backend="mg"``: cuSolverMg, or its LAPACK twin on CPUs, whatever the
device count) and, in the ``blocked`` group, ``blocked`` (the engine of collectives on one
device). Each row says how many of jaxmg's native calls its compiled program holds
(``native_calls``), so the table shows which engine ran.

Method (as ``benchmarks/solvers.py``): the program is compiled once ahead of time (its compile
time and XLA's memory analysis, per device, are reported), then ``warmup`` untimed and ``runs``
timed calls, each ending in ``block_until_ready``: the median and the spread (min..max), with
TFLOP/s from the standard flop counts (potrs N^3/3 + 2 N^2 nrhs, syevd 4 N^3 with vectors and
4 N^3/3 without, LU 2 N^3/3 + 2 N^2 nrhs, a solve with a given factor 2 N^2 nrhs). The
matrices are made on the device (a host copy of N=32768 would take longer than the solve).
Every row is checked against a reference that does not trust the solver (on the first device;
the likelihood's on the host):

- solves: the scaled residual ``|A x - b| / (|A|_1 |x| N eps)`` below 30 (and for cho_factor
  the log determinant against ``slogdet``, an LU-based one);
- eigenvectors: ``|A V - V diag(w)|_F / (|A|_F N eps)`` and ``|V^H V - I|_F / (N eps)`` below
  30, and the eigenvalues against those of JAX's ``eigh`` (itself checked so) within 30 ``|A|_2 N
  eps``; values only: against the same;
- the likelihood: JAX's gradient against central finite differences, jaxmg's value and gradient
  against JAX's, relative error below 1e-6.

A case that raises is a row with its error, and the group goes on; a group past ``--budget``
seconds starts no more cases (their rows say so). Rows go to ``--json`` as they are made, one
JSON line each, so a group killed at its deadline keeps what it measured.

``--smoke``: the same cases at sizes divided by 128 on simulated CPU devices (``--cpu-devices``,
2 by default), one of each kind of case, one timed run: checks this script end to end in CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import sys
import time
import traceback
import warnings

from _common import program_memory, timed

GROUPS = ("potrs", "blocked", "syevd", "factored", "scaling")
RESIDUAL_LIMIT = 30.0
GRADIENT_TOLERANCE = 1e-6  # float64: jaxmg's likelihood and gradient against JAX's
SMOKE_DIVISOR = 128


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: ``routine`` on an ``n x n`` matrix by ``variant`` (jax, default or mg)."""

    routine: str  # potrs, syevd, syevd_values, lu_solve, cho_factor_solve, cho_solve, gp
    n: int
    variant: str  # "jax": JAX on one device; "default": jaxmg, backend=None; "mg": backend="mg";
    # "blocked": backend "jax"'s engine of collectives forced on one device
    dtype: str = "float64"
    T_A: int | None = None
    ndev: int = 1
    relayout: str = "native"
    label: str = ""  # a case of its own kind (the fixed cost)
    runs: int = 3
    warmup: int = 1

    def kind(self):
        """What a smoke run keeps one of: the same code with other sizes, dtypes and numbers of
        runs is the same kind."""
        return (self.routine, self.variant, self.relayout, self.ndev, self.T_A is None)


def variants(routine, n, dtype="float64", tiles=(None,), label="", runs=3, warmup=1):
    """JAX on one device, jaxmg's default on one device and backend "mg" for each of ``tiles``."""
    common = dict(dtype=dtype, label=label, runs=runs, warmup=warmup)
    out = [Case(routine, n, "jax", **common), Case(routine, n, "default", **common)]
    return out + [Case(routine, n, "mg", T_A=t, **common) for t in tiles]


def plan(group: str, ndev: int) -> list[Case]:
    """The cases of ``group`` at full size, most wanted first (a group that runs out of time
    drops the last ones)."""
    if group == "potrs":
        return [
            # Two H100 runs ran out of the group's time before N=16384: T_A=8192 (between
            # 2048 and 32768, both within 6% of JAX) and N=8192 are left out.
            *variants("potrs", 32768, tiles=(None, 256, 512, 1024, 2048, 32768)),
            # float32, as the first H100 run measured it (benchmarks/solvers.py's probe).
            *variants("potrs", 64, "float32", label="fixed cost", runs=50, warmup=5),
            *variants("potrs", 32768, "float32"),
            *variants("potrs", 16384, tiles=(None, 1024)),
        ]
    if group == "blocked":
        return [
            Case("potrs", 32768, "jax"),
            Case("potrs", 32768, "blocked"),
            Case("syevd", 8192, "jax"),
            Case("syevd", 8192, "blocked", runs=2),
        ]
    if group == "syevd":
        return [*variants("syevd", 8192), *variants("syevd_values", 8192)]
    if group == "factored":
        return [
            # cuSolverMg's getrf refused T_A >= 1024 on the H100 (issue 24): 512 on GPUs.
            *variants("lu_solve", 8192, tiles=(512,)),
            *variants("cho_factor_solve", 16384),
            *variants("cho_solve", 16384),
            *variants("gp", 8192),
        ]
    if group == "scaling":
        counts = [c for c in (1, 2, 4, 8) if c <= ndev]
        if counts[-1] != ndev:
            counts.append(ndev)
        out = []
        for routine, n, tile in (("potrs", 32768, 1024), ("syevd", 8192, 256)):
            out.append(Case(routine, n, "jax"))
            out.append(Case(routine, n, "default"))
            out += [Case(routine, n, "mg", ndev=c) for c in counts]
            # The relayout to tiles of T_A on every device: in place, or by JAX's collectives.
            out += [
                Case(routine, n, "mg", T_A=tile, ndev=ndev, relayout=r) for r in ("native", "jax")
            ]
        return out
    raise ValueError(f"unknown group {group!r}; the groups are {', '.join(GROUPS)}")


def smoke_plan(group: str, ndev: int) -> list[Case]:
    """``plan`` at sizes divided by SMOKE_DIVISOR (at least 16), one case of each kind, one
    timed run: every code path of the group, in seconds on CPU devices (the scaling group's
    one-device jaxmg cases are the potrs and syevd groups' code, left to them)."""
    seen, out = set(), []
    for case in plan(group, ndev):
        if case.kind() in seen:
            continue
        if group == "scaling" and case.ndev == 1 and case.variant != "jax":
            continue  # the potrs and syevd groups' code
        seen.add(case.kind())
        n = max(16, case.n // SMOKE_DIVISOR)
        tile = None if case.T_A is None else max(1, case.T_A // SMOKE_DIVISOR)
        out.append(dataclasses.replace(case, n=n, T_A=tile, runs=1, warmup=0))
    return out


def flops(routine: str, n: int, nrhs: int = 1) -> float | None:
    return {
        "potrs": n**3 / 3 + 2 * n**2 * nrhs,
        "cho_factor_solve": n**3 / 3 + 2 * n**2 * nrhs,
        "cho_solve": 2 * n**2 * nrhs,
        "syevd": 4 * n**3,
        "syevd_values": 4 * n**3 / 3,
        "lu_solve": 2 * n**3 / 3 + 2 * n**2 * nrhs,
    }.get(routine)


class Bench:
    """Runs cases on ``devices``, keeping the last matrix made and its last placement on a
    mesh (one at a time: N=32768 float64 is 8 GiB), and the JAX rows' results that later rows
    are checked against."""

    def __init__(self, devices):
        self.devices = devices
        self.cache_key, self.cache = None, {}
        self.references = {}

    # --- data, made on the device ----------------------------------------------------------

    def matrix(self, kind, n, dtype, ndev):
        """``(A, b)``: A sharded by columns over a mesh of ``ndev`` devices (``ndev=0``: on the
        first device alone). ``kind``: hpd (``G G^T / N + I``), symmetric (``(G + G^T) / 2``)
        or general (``G / sqrt(N) + 3 I``), G standard normal."""
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P

        if self.cache_key != (kind, n, dtype):
            self.cache_key, self.cache = (kind, n, dtype), {}
        if ndev in self.cache:
            return self.cache[ndev]
        if 0 not in self.cache:

            @jax.jit
            def make(key):
                g = jax.random.normal(key, (n, n), jnp.float64)
                if kind == "hpd":
                    a = jnp.matmul(g, g.T, precision=jax.lax.Precision.HIGHEST) / n
                    a = (a + a.T) / 2 + jnp.eye(n)
                elif kind == "symmetric":
                    a = (g + g.T) / 2
                else:
                    a = g / jnp.sqrt(n) + 3 * jnp.eye(n)
                b = jax.random.normal(jax.random.fold_in(key, 1), (n, 1), jnp.float64)
                return a.astype(dtype), b.astype(dtype)

            with jax.default_device(self.devices[0]):
                self.cache[0] = jax.block_until_ready(make(jax.random.PRNGKey(n)))
        if ndev:
            # One placement at a time besides the matrix as made (on the first device).
            self.cache = {0: self.cache[0]}
            mesh = self.mesh(ndev)
            a, b = self.cache[0]
            placed = (
                jax.device_put(a, NamedSharding(mesh, P(None, "x"))),
                jax.device_put(b, NamedSharding(mesh, P())),
            )
            self.cache[ndev] = jax.block_until_ready(placed)
        return self.cache[ndev]

    def mesh(self, ndev):
        import jax

        return jax.make_mesh((ndev,), ("x",), devices=self.devices[:ndev])

    # --- programs ----------------------------------------------------------------------------

    def program(self, case: Case):
        """``(fn, args, check)``: the program to time, its arguments, and ``check(out)``."""
        import jax
        import jax.numpy as jnp
        import jax.scipy.linalg as jsl

        import jaxmg

        on_jax = case.variant == "jax"
        ndev = 0 if case.variant in ("jax", "blocked") else case.ndev
        kw = dict(relayout=case.relayout, backend="mg" if case.variant == "mg" else None)
        r = case.routine
        if r == "gp":
            return self.gp_program(case)
        kind = {"lu_solve": "general", "syevd": "symmetric", "syevd_values": "symmetric"}
        a, b = self.matrix(kind.get(r, "hpd"), case.n, case.dtype, ndev)
        # The checks run on the first device, with the matrix as made there.
        a0, b0 = self.matrix(kind.get(r, "hpd"), case.n, case.dtype, 0)
        solve_check = residual_check(a0, b0, self.devices[0])
        if r == "potrs":
            if case.variant == "blocked":
                return blocked_potrs(self.devices[0]), (a, b), solve_check
            if on_jax:
                return (
                    jax.jit(lambda a, b: jsl.cho_solve(jsl.cho_factor(a, lower=True), b)),
                    (a, b),
                    solve_check,
                )
            return jax.jit(lambda a, b: jaxmg.potrs(a, b, case.T_A, **kw)), (a, b), solve_check
        if r == "lu_solve":
            if on_jax:
                return jax.jit(jnp.linalg.solve), (a, b), solve_check
            return jax.jit(lambda a, b: jaxmg.lu_solve(a, b, case.T_A, **kw)), (a, b), solve_check
        if r == "cho_factor_solve":
            reference = float(_jitted("log_abs_det")(a0))

            def check(out):
                x, logdet = out
                found = solve_check(x)
                error = abs(float(logdet) - reference) / max(abs(reference), 1.0)
                limit = 1e3 * case.n * float(jnp.finfo(case.dtype).eps)
                found["logdet_rel_err"] = error
                found["passed"] = bool(found["passed"] and error < limit)
                return found

            if on_jax:

                def fn(a, b):
                    c = jsl.cho_factor(a, lower=True)
                    return jsl.cho_solve(c, b), 2 * jnp.sum(jnp.log(jnp.diagonal(c[0])))

                return jax.jit(fn), (a, b), check

            def fn(a, b):
                factor = jaxmg.cho_factor(a, case.T_A, **kw)
                return jaxmg.cho_solve(factor, b), factor.logdet

            return jax.jit(fn), (a, b), check
        if r == "cho_solve":  # a solve with a factor made beforehand (not timed)
            if on_jax:
                factor = jax.block_until_ready(
                    jax.jit(lambda a: jsl.cho_factor(a, lower=True)[0])(a)
                )
                return jax.jit(lambda c, b: jsl.cho_solve((c, True), b)), (factor, b), solve_check
            factor = jax.jit(lambda a: jaxmg.cho_factor(a, case.T_A, **kw))(a)
            factor = jax.block_until_ready(factor)
            return jax.jit(jaxmg.cho_solve), (factor, b), solve_check
        if r in ("syevd", "syevd_values"):
            return self.syevd_program(case, a, a0, kw)
        raise ValueError(f"unknown routine {r!r}")

    def syevd_program(self, case, a, a0, kw):
        import jax
        import jax.numpy as jnp

        import jaxmg

        vectors = case.routine == "syevd"
        key = ("eigenvalues", case.n, case.dtype)
        eps = float(jnp.finfo(case.dtype).eps)

        def check(out):
            out = on_device(out, self.devices[0])
            w, v = out if vectors else (out, None)
            found = {}
            if v is not None:
                found = {k: float(x) for k, x in _jitted("eigen_residuals")(a0, w, v).items()}
            reference = self.references.get(key)
            if reference is not None:
                norm = float(jnp.max(jnp.abs(reference)))
                found["eigenvalues"] = float(jnp.max(jnp.abs(w - reference))) / (
                    norm * case.n * eps
                )
            elif case.variant == "jax" and vectors:
                self.references[key] = jax.device_put(w, self.devices[0])
            if not found:
                return {"check": "none: no reference eigenvalues", "passed": False}
            worst = max(found.values())
            return {
                "check": "scaled residuals",
                **found,
                "value": worst,
                "limit": RESIDUAL_LIMIT,
                "passed": bool(worst < RESIDUAL_LIMIT),
            }

        if case.variant == "jax":
            return jax.jit(jnp.linalg.eigh if vectors else jnp.linalg.eigvalsh), (a,), check
        if case.variant == "blocked":
            return blocked_syevd(self.devices[0]), (a,), check
        fn = jax.jit(lambda a: jaxmg.syevd(a, case.T_A, return_eigenvectors=vectors, **kw))
        return fn, (a,), check

    def gp_program(self, case):
        """A Gaussian process's negative log likelihood and its gradient in the kernel's three
        parameters (``benchmarks/autodiff.py``'s ``gp_nll``)."""
        import jax
        import jax.numpy as jnp
        import jax.scipy.linalg as jsl
        import numpy as np
        from autodiff import gp_data, kernel_block, sharded_kernel
        from jax.sharding import NamedSharding, PartitionSpec as P

        import jaxmg

        theta, x, y = gp_data(case.n, 2, case.dtype)
        key = ("gp", case.n, case.dtype)

        def jax_loss(theta, x, y):
            c = jsl.cho_factor(kernel_block(theta, x, x, 0), lower=True)
            return 0.5 * jnp.sum(y * jsl.cho_solve(c, y)) + jnp.sum(jnp.log(jnp.diagonal(c[0])))

        if case.variant == "jax":
            inputs = tuple(jax.device_put(v, self.devices[0]) for v in (theta, x, y))
            value = jax.jit(jax_loss)

            def check(out):
                self.references[key] = jax.tree.map(np.asarray, out)
                grad = np.asarray(out[1])
                h = 1e-4
                fd = np.array(
                    [
                        (
                            float(value(inputs[0].at[i].add(h), *inputs[1:]))
                            - float(value(inputs[0].at[i].add(-h), *inputs[1:]))
                        )
                        / (2 * h)
                        for i in range(len(grad))
                    ]
                )
                error = relative_error(grad, fd)
                return {
                    "check": "gradient vs finite differences",
                    "value": error,
                    "limit": GRADIENT_TOLERANCE,
                    "passed": bool(error < GRADIENT_TOLERANCE),
                }

            return jax.jit(jax.value_and_grad(jax_loss)), inputs, check

        mesh = self.mesh(case.ndev)
        backend = "mg" if case.variant == "mg" else None

        def loss(theta, x, y):
            k = sharded_kernel(mesh, theta, x)
            alpha, logdet = jaxmg.potrs(
                k,
                y,
                case.T_A,
                mesh=mesh,
                in_specs=(P(None, "x"), P()),
                return_logdet=True,
                relayout=case.relayout,
                backend=backend,
            )
            return 0.5 * jnp.sum(y * alpha) + 0.5 * logdet

        inputs = tuple(jax.device_put(v, NamedSharding(mesh, P())) for v in (theta, x, y))

        def check(out):
            reference = self.references.get(key)
            if reference is None:
                return {"check": "none: JAX's row failed", "passed": False}
            value_err = relative_error(out[0], reference[0])
            grad_err = relative_error(out[1], reference[1])
            worst = max(value_err, grad_err)
            return {
                "check": "value and gradient vs JAX",
                "value_rel_err": value_err,
                "grad_rel_err": grad_err,
                "value": worst,
                "limit": GRADIENT_TOLERANCE,
                "passed": bool(worst < GRADIENT_TOLERANCE),
            }

        return jax.jit(jax.value_and_grad(loss)), inputs, check

    # --- one row -----------------------------------------------------------------------------

    def run(self, case: Case) -> dict:
        import jax

        row = describe(case, self.devices)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn, args, check = self.program(case)
                start = time.perf_counter()
                compiled = fn.lower(*args).compile()
                row["compile_s"] = time.perf_counter() - start
            row["warnings"] = [str(w.message) for w in caught]
            row["native_calls"] = compiled.as_text().count('custom_call_target="jaxmg_')
            row["memory"] = program_memory(compiled)
            median, low, high = timed(compiled, args, case.runs, case.warmup)
            row.update(median_s=median, min_s=low, max_s=high)
            work = flops(case.routine, case.n)
            row["tflops"] = None if work is None else work / median / 1e12
            row["check"] = check(jax.block_until_ready(compiled(*args)))
            row["passed"] = row["check"]["passed"]
        except Exception as err:  # noqa: BLE001 - a row with the error; the group goes on
            row["error"] = f"{type(err).__name__}: {err}"[-3000:]
            row["traceback"] = traceback.format_exc()[-3000:]
            row["passed"] = False
        return row


def blocked_potrs(device):
    """``potrs`` by backend ``"jax"``'s engine of collectives (:mod:`jaxmg.engines.collectives`)
    on a mesh of ``device`` alone, called as jaxmg's programs call an engine: the local block in
    the native storage (a symmetric ``A`` is its own), ``b`` as rows. On one device
    ``backend="jax"`` takes JAX's own solvers, so this is the only way to time the blocked
    algorithm there."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    from jaxmg.engines import collectives

    def local(a, b):
        position = jax.lax.axis_index("x")
        n = a.shape[0]
        _, x_rows, status = collectives.potrs(a, b.T, position, axis="x", ndev=1, T_A=n)
        return x_rows.T, status

    mesh = Mesh(np.array([device]), ("x",))
    spec = P(None, "x")  # varying over the axis, as a sharded A is
    solve = jax.shard_map(
        local, mesh=mesh, in_specs=(spec, P()), out_specs=(P(), P()), check_vma=False
    )
    return jax.jit(lambda a, b: solve(a, b)[0])


def blocked_syevd(device):
    """``syevd`` by the engine of collectives (:mod:`jaxmg.engines.tridiagonal`) on a mesh of
    ``device`` alone, as :func:`blocked_potrs` calls ``potrs``: a symmetric ``A`` is its own
    storage, and the eigenvectors come back as rows."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    from jaxmg.engines import collectives

    def local(a):
        position = jax.lax.axis_index("x")
        v, w, _ = collectives.syevd(a, position, axis="x", ndev=1, T_A=a.shape[0])
        return w, v.T

    mesh = Mesh(np.array([device]), ("x",))
    spec = P(None, "x")
    solve = jax.shard_map(local, mesh=mesh, in_specs=(spec,), out_specs=(P(), P()), check_vma=False)
    return jax.jit(solve)


def describe(case: Case, devices) -> dict:
    row = {"kind": "bench", **dataclasses.asdict(case)}
    row["platform"] = devices[0].platform
    row["device_kind"] = devices[0].device_kind
    return row


@functools.cache
def _jitted(name):
    """The checks' programs, compiled once per shape and dtype for the whole group."""
    import jax
    import jax.numpy as jnp

    hi = jax.lax.Precision.HIGHEST

    def scaled_residual(a, b, x):
        r = jnp.linalg.norm(jnp.matmul(a, x, precision=hi) - b)
        norm_a = jnp.max(jnp.sum(jnp.abs(a), axis=0))
        return r / (norm_a * jnp.linalg.norm(x) * a.shape[0] * jnp.finfo(a.dtype).eps)

    def eigen_residuals(a, w, v):
        """``|A V - V diag(w)|_F / |A|_F`` and ``|V^H V - I|_F``, divided by N eps."""
        scale = a.shape[0] * jnp.finfo(a.dtype).eps
        residual = jnp.linalg.norm(jnp.matmul(a, v, precision=hi) - v * w) / jnp.linalg.norm(a)
        gram = jnp.matmul(v.conj().T, v, precision=hi)
        orthogonality = jnp.linalg.norm(gram - jnp.eye(a.shape[0], dtype=a.dtype))
        return {"residual": residual / scale, "orthogonality": orthogonality / scale}

    def log_abs_det(a):
        return jnp.linalg.slogdet(a)[1]

    return jax.jit(locals()[name])


def on_device(tree, device):
    """The arrays of ``tree`` as single-device arrays on ``device``, through the host: jax 0.10's
    device_put from a multi-device mesh to one device keeps the mesh in the array's type, and
    jit then refuses it."""
    import jax
    import numpy as np

    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), device), tree)


def residual_check(a, b, device):
    """``check(x)``: the scaled residual of ``A x = b``, computed on ``device`` (where ``a`` and
    ``b`` are)."""

    def check(x):
        x = on_device(x, device)
        value = float(_jitted("scaled_residual")(a, b, x.reshape(b.shape)))
        passed = bool(value < RESIDUAL_LIMIT)
        return {
            "check": "scaled residual",
            "value": value,
            "limit": RESIDUAL_LIMIT,
            "passed": passed,
        }

    return check


def relative_error(found, reference) -> float:
    import numpy as np

    found, reference = np.asarray(found, np.float64), np.asarray(reference, np.float64)
    return float(np.linalg.norm(found - reference) / max(np.linalg.norm(reference), 1e-300))


def device_memory(devices) -> dict:
    """The devices' allocator statistics (GPUs; None on CPUs): the peak over the process."""
    stats = [d.memory_stats() or {} for d in devices]
    return {
        "peak_bytes_in_use": max((s.get("peak_bytes_in_use", 0) for s in stats), default=0),
        "bytes_limit": max((s.get("bytes_limit", 0) for s in stats), default=0),
    }


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("group", choices=GROUPS)
    p.add_argument("--json", type=pathlib.Path, help="append the rows here, one JSON line each")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on simulated CPU devices")
    p.add_argument("--cpu-devices", type=int, default=2, help="simulated CPU devices (--smoke)")
    p.add_argument("--budget", type=float, default=600.0, help="seconds: no case starts later")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    started = time.monotonic()
    import jax

    if args.smoke:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    devices = jax.devices()
    cases = (smoke_plan if args.smoke else plan)(args.group, len(devices))
    sink = args.json.open("a") if args.json else None
    bench = Bench(devices)
    failed = 0
    for case in cases:
        if case.ndev > len(devices):
            continue
        if time.monotonic() - started > args.budget:
            row = {**describe(case, devices), "skipped": "out of time", "passed": False}
        else:
            row = bench.run(case)
        failed += not row["passed"]
        row["group"] = args.group
        line = json.dumps(row, default=float)
        print(summary_line(row), flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()
    memory = {"kind": "group", "group": args.group, "seconds": time.monotonic() - started}
    memory.update(device_memory(devices))
    if sink:
        sink.write(json.dumps(memory) + "\n")
        sink.close()
    return 1 if failed else 0


def summary_line(row) -> str:
    what = (
        f"{row['routine']}{' (' + row['label'] + ')' if row['label'] else ''} N={row['n']} "
        f"{row['dtype']} {row['variant']} T_A={row['T_A']} ndev={row['ndev']} {row['relayout']}"
    )
    if "skipped" in row:
        return f"{what}: skipped, {row['skipped']}"
    if "error" in row:
        return f"{what}: ERROR {row['error'][:500]}"
    check = row["check"]
    low, high = row["min_s"] * 1e3, row["max_s"] * 1e3
    return (
        f"{what}: {row['median_s'] * 1e3:.4g} ms ({low:.4g}..{high:.4g}), "
        f"compile {row['compile_s']:.1f} s, native calls {row['native_calls']}, "
        f"check {check.get('value', float('nan')):.3g} {'ok' if row['passed'] else 'FAILED'}"
    )


if __name__ == "__main__":
    sys.exit(main())
