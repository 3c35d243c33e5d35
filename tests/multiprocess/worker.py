"""One process of a multi-process jaxmg job, started by test_multiprocess.py.

    python worker.py SCENARIO PROCESS_ID PROCESSES PORT [DEVICES_PER_PROCESS]

On CPU by default; with ``JAXMG_WORKER_GPUS=G`` on GPUs instead: process ``i`` drives GPU
``i % G`` (every process sees every GPU; ``local_device_ids`` picks its own).

Every process builds the same matrices (seeded numpy), runs the scenario through the public
API, and reports one JSON line per check, ``{"check": ..., "ok": bool, ...}``, compared here
against numpy. The lines go to the file named by ``JAXMG_WORKER_RESULTS`` (one file per
process; the test reads them there) and, for the log, to stdout: stdout is no channel for
results, since Gloo (the CPU collectives) writes its connection messages there from C++, and
those can land inside a line of ours. Scenarios:

- ``solve``: a first call under jit; potrs, potri, syevd (values and vectors), cho_factor and
  cho_solve, lu_factor and lu_solve x float64,
  complex64, both sharding forms, plus a matrix that is not positive definite, the
  *_no_shardmap functions inside a user's shard_map and a NetKet-style call (abstract mesh
  under jax.set_mesh); one device per process.
- ``leader_dies``: one good call, then the leader's process (mesh position 0, process 1) is
  killed before its next call; the survivors must report it within the deadline.
- ``member_dies``: the same with a non-leader (process 1 at mesh position 1) killed.
- ``leader_dies_abstract``: ``leader_dies`` with the calls inside a user's shard_map, where
  jaxmg does not know the leader's process: the survivor's wait ends at the deadline.
- ``multinode``: the multi-node recipe (host_mesh, gather_to_hosts) solves on each process's
  own devices: the native engine on several, JAX's own dense solvers on one (no jaxmg call in
  the compiled program).
- ``default_2x2``: several devices per process across processes (the usual one process per
  node), which the native engines do not solve on: the default backend chooses backend "jax"
  for A by rows on the mesh of every device; potrs, lu_solve, syevd and the gradient of a
  log-determinant, eagerly and under jit.
- ``one_gpu``: two processes on one GPU. On the H100 (issue 24) jax's own NCCL collectives
  refused the job ("Duplicate GPU detected") before any jaxmg call ran; cuSolverMg itself
  accepts a GPU listed twice. Every process reports which happened: its solve checked against
  numpy on its own copy of ``x`` (no collective), or the error. On CPU devices the same
  scenario solves.

Survivors of a killed peer leave with os._exit (jax.distributed.shutdown would wait for the
dead peer); ``one_gpu`` gives jax.distributed.shutdown a minute (a peer that failed in NCCL may
never reach it); every other scenario shuts jax.distributed down first, so the processes leave
together.
"""

import functools
import json
import os
import signal
import sys
import time

scenario, process_id, processes, port = sys.argv[1], *map(int, sys.argv[2:5])
local_devices = int(sys.argv[5]) if len(sys.argv) > 5 else 1

gpus = int(os.environ.get("JAXMG_WORKER_GPUS", "0"))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
if gpus:
    mine = [(process_id * local_devices + k) % gpus for k in range(local_devices)]
    jax.distributed.initialize(
        f"127.0.0.1:{port}", processes, process_id, local_device_ids=mine, initialization_timeout=60
    )
else:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", local_devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{port}", processes, process_id, initialization_timeout=60
    )

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxmg  # noqa: E402

# Appended to and flushed line by line: a process killed later keeps the checks it reported.
# Run by hand without JAXMG_WORKER_RESULTS, the checks go to stdout only.
results_path = os.environ.get("JAXMG_WORKER_RESULTS")
results = open(results_path, "a") if results_path else None  # open for the process's life


def report(check, ok, **extra):
    line = json.dumps(
        {"check": check, "ok": bool(ok), "process": process_id, **extra}, default=float
    )
    print(line, flush=True)
    if results is not None:
        results.write(line + "\n")
        results.flush()


def hermitian_pd(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.issubdtype(dtype, np.complexfloating):
        m = m + 1j * rng.standard_normal((n, n))
    return (m @ m.conj().T / n + np.eye(n)).astype(dtype)


def place(a, mesh, spec):
    return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda i: a[i])


def fetch(x):
    """The whole of a global array on every process."""
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def eps(dtype):
    return np.finfo(np.dtype(dtype)).eps


def scaled_residual(A, x, b):
    n = A.shape[0]
    num = np.linalg.norm(A @ x - b)
    return num / (np.linalg.norm(A) * np.linalg.norm(x) * n * eps(A.dtype))


def solve(mesh, n, tile):
    for dtype in (np.float64, np.complex64):
        A = hermitian_pd(n, dtype, seed=n)
        b = np.arange(1, 2 * n + 1, dtype=dtype).reshape(n, 2) / n
        for name, spec in (("cols", P(None, "x")), ("rows", P("x", None))):
            a = place(A, mesh, spec)
            case = {"dtype": np.dtype(dtype).name, "form": name, "n": n, "T_A": tile}
            x, status = jaxmg.potrs(a, place(b, mesh, P()), tile, return_status=True)
            res = scaled_residual(A, fetch(x), b)
            report("potrs", res < 30 and int(fetch(status)) == 0, residual=res, **case)
            inv, status = jaxmg.potri(a, tile, return_status=True)
            err = np.linalg.norm(fetch(inv) @ A - np.eye(n)) / (n * eps(dtype) * 1e3)
            report("potri", err < 1 and int(fetch(status)) == 0, error=err, **case)
            w, V = jaxmg.syevd(a, tile)
            V = fetch(V)
            w = fetch(w)
            ortho = np.linalg.norm(V.conj().T @ V - np.eye(n)) / (n * eps(dtype))
            res = np.linalg.norm(A @ V - V * w) / (np.linalg.norm(A) * n * eps(dtype))
            ref = np.linalg.eigvalsh(A)
            close = np.allclose(w, ref, rtol=0, atol=1e3 * eps(dtype) * np.abs(ref).max())
            report("syevd", ortho < 30 and res < 30 and close, ortho=ortho, residual=res, **case)
            w_only = fetch(jaxmg.syevd(a, tile, return_eigenvectors=False))
            report("syevd_values", np.allclose(w_only, w, rtol=0, atol=1e3 * eps(dtype)), **case)
            # A factor (and LU's pivots) that the processes keep between calls.
            factor = jaxmg.cho_factor(a, tile)
            x = fetch(jaxmg.cho_solve(factor, place(b, mesh, P())))
            logdet = float(fetch(factor.logdet))
            ok = abs(logdet - np.linalg.slogdet(A)[1]) < 1e3 * eps(dtype) * n
            report("cho_solve", scaled_residual(A, x, b) < 30 and ok, **case)
            G = (A + np.triu(A, 1)).astype(dtype)  # not Hermitian
            lu = jaxmg.lu_factor(place(G, mesh, spec), tile)
            x = fetch(jaxmg.lu_solve(lu, place(b, mesh, P()), trans=1))
            report("lu_solve", scaled_residual(G.T, x, b) < 30, **case)
    bad = hermitian_pd(n, np.float64)
    bad[3, 3] = -1.0  # leading minor of order 4 not positive definite
    x, status = jaxmg.potrs(place(bad, mesh, P(None, "x")), jnp.ones(n), tile, return_status=True)
    status = int(fetch(status))
    report("not_pd", status > 0 and np.isnan(fetch(x)).all(), status=status)
    # Inside a user's shard_map only the abstract mesh is known: the axis spans every process
    # of the job with one device each, so jaxmg knows the mode (the leader's process id comes
    # from the leader itself).
    A = hermitian_pd(n, np.complex64, seed=2)
    b = np.arange(1, n + 1, dtype=np.complex64) / n

    def body(a, b):
        x, s1 = jaxmg.potrs_no_shardmap(a, b, tile, sharded_by="rows")
        inv, s2 = jaxmg.potri_no_shardmap(a, tile, sharded_by="rows")
        w, v, s3 = jaxmg.syevd_no_shardmap(a, sharded_by="rows")  # T_A chosen by jaxmg
        return x, inv, w, v, s1 + s2 + s3

    rows = P("x", None)
    run = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(rows, P()), out_specs=(P(), rows, P(), rows, P()))
    )
    x, inv, w, v, status = (fetch(o) for o in run(place(A, mesh, rows), place(b, mesh, P())))
    tol = 1e3 * n * eps(np.complex64)
    report(
        "no_shardmap",
        int(status[0]) == 0
        and np.allclose(x, np.linalg.solve(A, b), rtol=tol, atol=tol)
        and np.allclose(inv, np.linalg.inv(A), rtol=tol, atol=tol)
        and np.allclose(A @ v, v * w, atol=tol * np.abs(w).max()),
        n=n,
    )
    # The same solve as NetKet calls it: under jit on an Auto-axis mesh set with jax.set_mesh,
    # mesh=get_abstract_mesh(), in_specs deciding where the replicated A goes.
    auto = jax.sharding.Mesh(mesh.devices, ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(auto):
        x = jax.jit(
            lambda a, b: jaxmg.potrs(
                a, b, T_A=tile, mesh=jax.sharding.get_abstract_mesh(), in_specs=P("x", None)
            )
        )(place(A, auto, P()), place(b, auto, P()))
    report("netket_style", scaled_residual(A, fetch(x), b) < 30, n=n)


def first_call_under_jit(mesh):
    """The first jaxmg call of the job is traced (as every runner of jaxmg 0.0.x's test suite
    makes it): jaxmg learns the job's processes while the call is being traced."""
    n = 4 * mesh.size
    A = hermitian_pd(n, np.float64, seed=3)
    b = np.ones((n, 1))
    x = jax.jit(lambda a, b: jaxmg.potrs(a, b, 1, mesh=mesh))(
        place(A, mesh, P(None, "x")), place(b, mesh, P())
    )
    report("first_call_jit", scaled_residual(A, fetch(x), b) < 30)


def dies(mesh, n, tile, victim, abstract=False):
    """A good call, then ``victim`` is killed before its next call; others must fail fast.

    ``abstract``: the calls run inside a user's shard_map, where jaxmg does not know which
    process holds which mesh position."""
    a_np = hermitian_pd(n, np.float64)
    a = jaxmg.cyclic_1d_layout(place(a_np, mesh, P(None, "x")), tile)
    b = place(np.ones(n), mesh, P())
    if abstract:
        solve = jax.jit(
            jax.shard_map(
                lambda a, b: jaxmg.potrs_no_shardmap(a, b, tile, cyclic_1d=True)[0],
                mesh=mesh,
                in_specs=(P(None, "x"), P()),
                out_specs=P(),
            )
        )
    else:
        solve = functools.partial(jaxmg.potrs, T_A=tile, cyclic_1d=True)
    x = solve(a, b)
    report("first_call", scaled_residual(a_np, fetch(x), np.ones(n)) < 30)
    if process_id == victim:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        # No collective runs before the native call (cyclic input, replicated b): the survivors
        # reach the rendezvous while the victim is still alive, then see it die.
        jax.block_until_ready(solve(a, b))
        report("survivor_error", False, error="the call succeeded without the dead process")
    except Exception as err:  # noqa: BLE001 - the test reads the message
        report("survivor_error", True, error=str(err), seconds=time.monotonic() - start)
    sys.stdout.flush()
    os._exit(0)


def multinode(n, tile):
    mesh = jaxmg.host_mesh()
    A = hermitian_pd(n, np.float64, seed=1)
    a = place(A, mesh, P(None, ("host", "x")))
    local = jaxmg.gather_to_hosts(a, mesh)
    report("gathered_spec", local.sharding.spec == P(None, "x"), spec=str(local.sharding.spec))
    b = np.ones((n, 1))
    x = jaxmg.potrs(local, place(b, mesh, P()), tile)
    report("multinode_potrs", scaled_residual(A, fetch(x), b) < 30)
    backend = jaxmg.engines.resolve(local).backend
    call = functools.partial(jaxmg.potrs, T_A=tile, mesh=mesh, in_specs=P(None, "x"))
    compiled = jax.jit(lambda a: call(a, jnp.ones(n))).lower(local).compile()
    calls = compiled.as_text().count('custom_call_target="jaxmg_')
    one = jax.local_device_count() == 1
    report("multinode_engine", (backend, calls > 0) == (("jax", False) if one else ("mg", True)),
           backend=backend, jaxmg_calls=calls)  # fmt: skip
    w = jaxmg.syevd(local, tile, return_eigenvectors=False)
    ref = np.linalg.eigvalsh(A)
    report("multinode_syevd", np.allclose(fetch(w), ref, rtol=0, atol=1e-10 * np.abs(ref).max()))


def default_several_devices_per_process(n):
    """The default backend where each process holds several devices of the solver axis."""
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    A = hermitian_pd(n, np.float64, seed=5)
    G = A + np.triu(A, 1)  # not Hermitian
    b = np.arange(1, n + 1, dtype=np.float64) / n
    rows = P("x", None)
    a, g, bb = place(A, mesh, rows), place(G, mesh, rows), place(b, mesh, P())
    backend = jaxmg.engines.resolve(a).backend
    report("default_engine", backend == "jax", backend=backend)

    def solves(a, g, b):
        x = jaxmg.potrs(a, b)
        y = jaxmg.lu_solve(jaxmg.lu_factor(g), b)
        return x, y, jaxmg.syevd(a, return_eigenvectors=False)

    def dlogdet(a, b):
        return jax.grad(lambda s: jaxmg.potrs(s, b, return_logdet=True)[1])(a)

    def eager(a, g, b):
        # jax.grad run eagerly on several processes needs the mesh set: JAX's own first step
        # (the cotangent of the scalar output, placed on the Explicit mesh) asks for it.
        with jax.set_mesh(mesh):
            gradient = dlogdet(a, b)
        return (*solves(a, g, b), gradient)

    tol = 1e-9
    jitted = jax.jit(lambda a, g, b: (*solves(a, g, b), dlogdet(a, b)))
    for how, run in (("eager", eager), ("jit", jitted)):
        x, y, w, grad = (fetch(o) for o in run(a, g, bb))
        report("default_potrs", scaled_residual(A, x, b) < 30, how=how)
        report("default_lu_solve", scaled_residual(G, y, b) < 30, how=how)
        ref = np.linalg.eigvalsh(A)
        report("default_syevd", np.allclose(w, ref, rtol=0, atol=tol * np.abs(ref).max()), how=how)
        err = np.abs(grad - np.linalg.inv(A)).max()
        report("default_logdet_grad", err < tol, how=how, error=err)


def one_gpu(n, tile):
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    A = hermitian_pd(n, np.float64)
    b = np.ones(n)
    try:
        # T_A >= N / ndev and a replicated b: no relayout, so jaxmg runs no collective of its
        # own before the native call.
        x = jaxmg.potrs(place(A, mesh, P(None, "x")), place(b, mesh, P()), tile)
        mine = np.asarray(x.addressable_data(0))  # this process's copy: no collective
        residual = scaled_residual(A, mine, b)
        report("one_gpu", residual < 30, outcome="solved", residual=residual)
    except Exception as err:  # noqa: BLE001 - the test reads the message
        report("one_gpu", False, outcome="error", error=str(err)[-2000:])


def leave_within(seconds):
    """Leaves with jax.distributed.shutdown, unless it has not returned within ``seconds`` (a
    peer that failed inside a collective may never reach it): then without."""
    import threading

    done = threading.Thread(target=jax.distributed.shutdown, daemon=True)
    done.start()
    done.join(seconds)
    sys.stdout.flush()
    os._exit(0)


def mp_gpu(n, tile):
    """Backend "mp" on GPUs (cuSOLVERMp over NCCL), one GPU per process: what it solves against
    numpy, and what cuSOLVERMp lacks refused at trace time."""
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    for dtype in (np.float64, np.complex64):
        A = hermitian_pd(n, dtype, seed=n)
        b = np.arange(1, 2 * n + 1, dtype=dtype).reshape(n, 2) / n
        case = {"dtype": np.dtype(dtype).name, "n": n, "T_A": tile}
        for name, spec in (("cols", P(None, "x")), ("rows", P("x", None))):
            a = place(A, mesh, spec)
            x, logdet = jaxmg.potrs(a, place(b, mesh, P()), tile, backend="mp", return_logdet=True)
            ok = abs(float(fetch(logdet)) - np.linalg.slogdet(A)[1]) < 1e3 * eps(dtype) * n
            report("mp_potrs", scaled_residual(A, fetch(x), b) < 30 and ok, form=name, **case)
            w = fetch(jaxmg.syevd(a, tile, backend="mp", return_eigenvectors=False))
            ref = np.linalg.eigvalsh(A)
            close = np.allclose(w, ref, rtol=0, atol=1e3 * eps(dtype) * np.abs(ref).max())
            report("mp_syevd", close, form=name, **case)
        G = (A + np.triu(A, 1)).astype(dtype)
        lu = jaxmg.lu_factor(place(G, mesh, P(None, "x")), tile, backend="mp")
        x = fetch(jaxmg.lu_solve(lu, place(b, mesh, P())))
        report("mp_lu_solve", scaled_residual(G, x, b) < 30, **case)
    try:
        jaxmg.potri(place(A, mesh, P(None, "x")), tile, backend="mp")
        report("mp_potri_refused", False, error="potri ran")
    except NotImplementedError as err:
        report("mp_potri_refused", "has no inverse" in str(err), error=str(err))


if scenario == "solve":
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    first_call_under_jit(mesh)
    solve(mesh, n=6 * jax.device_count(), tile=2)
    solve(mesh, n=5 * jax.device_count(), tile=3)
elif scenario in ("leader_dies", "member_dies", "leader_dies_abstract"):
    devices = sorted(jax.devices(), key=lambda d: d.process_index)
    if scenario.startswith("leader_dies"):
        devices = devices[1:2] + devices[:1] + devices[2:]  # process 1 at mesh position 0
    mesh = jax.sharding.Mesh(np.array(devices), ("x",))
    dies(mesh, n=4 * len(devices), tile=2, victim=1, abstract=scenario.endswith("abstract"))
elif scenario == "multinode":
    multinode(n=8 * jax.device_count(), tile=4)
elif scenario == "default_2x2":
    default_several_devices_per_process(n=8 * jax.device_count())
elif scenario == "one_gpu":
    one_gpu(n=512, tile=512)
    report("done", True)
    leave_within(60)
elif scenario == "mp_gpu":
    mp_gpu(n=6 * jax.device_count(), tile=2)
else:
    raise SystemExit(f"unknown scenario {scenario!r}")
report("done", True)
sys.stdout.flush()
# Leave together: process 0 hosts the coordination service, and a process that still polls it
# when it goes away aborts (seen as a rare exit code -6 of the last process).
jax.distributed.shutdown()
os._exit(0)
