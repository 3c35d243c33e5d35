"""One rank of an ``mpiexec -n P`` job calling the ``jaxmg_mp_*`` targets directly on a 2D
process grid, inside ``jax.shard_map`` over a ``rows x cols`` mesh of one device per process,
with the local arrays laid out by :class:`jaxmg_layout.BlockCyclic2D` (padded to the largest):
potrs, potri, getrf + getrs ('T'), syevd, float64 and complex128, against numpy.

Usage: ``mpiexec -n P python native_worker.py ROWSxCOLS TILE N RESULTS_DIR``. Last, the same
potrs on a mesh in reverse process order must fail, with the error that says why, on every
process (MKL's eigensolver hangs on such grids).
"""

import json
import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(cluster_detection_method="mpi4py", initialization_timeout=60)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxmg_cuda  # noqa: E402
from jaxmg_layout import BlockCyclic2D  # noqa: E402

grid_text, tile, n, results = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows, cols = (int(v) for v in grid_text.split("x"))
jaxmg_cuda.mp.load()
devices = np.array(jax.devices()).reshape(rows, cols)
mesh = jax.sharding.Mesh(devices, ("r", "c"))
plan = BlockCyclic2D.make(n, n, (rows, cols), tile)
shapes = [plan.local_shape(i, j) for i in range(rows) for j in range(cols)]
LR, LC = max(s[0] for s in shapes), max(s[1] for s in shapes)
lines = []


def distributed(matrix):
    """[rows, cols, LC, LR]: each position's column-major local array, as row-major [C, LLD]."""
    out = np.zeros((rows, cols, LC, LR), matrix.dtype)
    for i in range(rows):
        for j in range(cols):
            block = plan.local_block(matrix, i, j)
            out[i, j, : block.shape[1], : block.shape[0]] = block.T
    return jax.make_array_from_callback(
        out.shape, NamedSharding(mesh, P("r", "c")), lambda index: out[index]
    )


def gathered(local):
    """The global matrix from the [rows, cols, LC, LR] local arrays."""
    local = np.asarray(jax.experimental.multihost_utils.process_allgather(local, tiled=True))
    blocks = [[None] * cols for _ in range(rows)]
    for i in range(rows):
        for j in range(cols):
            r, c = plan.local_shape(i, j)
            blocks[i][j] = local[i, j, :c, :r].T
    return plan.assemble(blocks)


def run(body, *args, out_specs):
    mapped = jax.shard_map(
        body, mesh=mesh, in_specs=(P("r", "c"),) + (P(),) * (len(args) - 1),
        out_specs=out_specs, check_vma=False,
    )  # fmt: skip
    return jax.jit(mapped)(*args)


def position():
    return jax.lax.axis_index("r") * cols + jax.lax.axis_index("c")


kw = dict(T_A=tile, grid=(rows, cols), n=n)
for dtype in (np.float64, np.complex128):
    rng = np.random.default_rng(1)
    m = rng.standard_normal((n, n))
    m = m + 1j * rng.standard_normal((n, n)) if dtype == np.complex128 else m
    hpd = (m @ m.conj().T / n + np.eye(n)).astype(dtype)
    general = (m / np.sqrt(n) + 2 * np.eye(n)).astype(dtype)
    b = rng.standard_normal((n, 2)).astype(dtype)
    bt = jax.device_put(np.ascontiguousarray(b.T), NamedSharding(mesh, P()))
    case = {"dtype": np.dtype(dtype).name, "grid": grid_text}

    def potrs(a, bb):
        _, x, status = jaxmg_cuda.mp.potrs(a[0, 0], bb, position(), **kw)
        return x, status

    x, status = run(potrs, distributed(hpd), bt, out_specs=(P(), P()))
    x = np.asarray(x.addressable_data(0)).T
    lines.append({"check": "potrs", "ok": int(status[0]) == 0 and np.allclose(hpd @ x, b), **case})

    def potri(a):
        inv, status = jaxmg_cuda.mp.potri(a[0, 0], position(), **kw)
        return inv[None, None], status

    inv, status = run(potri, distributed(hpd), out_specs=(P("r", "c"), P()))
    lower = np.tril(gathered(inv))
    ok = np.allclose(lower, np.tril(np.linalg.inv(hpd)))
    lines.append({"check": "potri", "ok": bool(ok and int(status[0]) == 0), **case})

    def lu(a, bb):
        factor, pivots, status = jaxmg_cuda.mp.getrf(a[0, 0], position(), **kw)
        x, _ = jaxmg_cuda.mp.getrs(factor, pivots, bb, position(), trans="T", **kw)
        return x, status

    x, status = run(lu, distributed(general), bt, out_specs=(P(), P()))
    x = np.asarray(x.addressable_data(0)).T
    ok = int(status[0]) == 0 and np.allclose(general.T @ x, b)
    lines.append({"check": "getrs", "ok": bool(ok), **case})

    def syevd(a):
        v, w, status = jaxmg_cuda.mp.syevd(a[0, 0], position(), **kw)
        return v[None, None], w, status

    v, w, status = run(syevd, distributed(hpd), out_specs=(P("r", "c"), P(), P()))
    v, w = gathered(v), np.asarray(w.addressable_data(0))
    ok = np.allclose(w, np.linalg.eigvalsh(hpd)) and np.allclose(hpd @ v, v * w)
    lines.append({"check": "syevd", "ok": bool(ok and int(status[0]) == 0), **case})

# A mesh whose positions are not in MPI rank order: refused on every process alike.
mesh = jax.sharding.Mesh(np.array(jax.devices()[::-1]).reshape(rows, cols), ("r", "c"))
try:
    x, status = run(potrs, distributed(hpd), jax.device_put(bt, NamedSharding(mesh, P())),
                    out_specs=(P(), P()))  # fmt: skip
    np.asarray(x.addressable_data(0))
    refused = ""
except Exception as error:  # XLA's runtime error carries the native message
    refused = str(error)
lines.append({"check": "reversed_refused", "ok": "in process order" in refused or
              "needs position p" in refused, "message": refused[-300:]})  # fmt: skip

rank = jax.process_index()
pathlib.Path(results, f"{rank}.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
jax.distributed.shutdown()
