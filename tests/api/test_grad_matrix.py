"""Every differentiable routine, forward and differentiated, in every way a user can call it.

The matrix: {eager, jit} x {Explicit, Auto axes} x {``mesh=``, ``jax.set_mesh``, inferred from
``A``'s sharding} x {column, row sharding}. In each cell every differentiable routine (potrs
with its logdet, cho_factor + cho_solve + logdet, lu_factor + lu_solve with ``trans`` 0 and 1,
lu_solve on the matrix itself, potri, syevd's values alone and with vectors) is called as a
function of ``(H, G, b)``, and its values, ``jvp``, ``vjp`` and ``value_and_grad`` are compared
with those of the same function written with JAX's single-device functions (``jnp.linalg``) on
the gathered matrices. Hermitian routines are differentiated as functions of ``(A + A^H) / 2``,
the meaning jaxmg documents, so the reference symmetrises; eigenvectors enter through the
phase-invariant ``|V|^2``.

How ``A`` reaches jaxmg in each cell: ``mesh=`` passes it as a plain (unsharded) array with
``mesh=`` and ``in_specs=``; ``jax.set_mesh`` passes it plain with ``in_specs=`` only, under
``with jax.set_mesh(mesh)``; inferred passes it sharded, with neither.

In ``jit`` on Auto axes, inferred, an array's sharding over Auto axes is not part of its type:
jaxmg then takes jaxmg 1.x's default, rows of the mesh's one axis (XLA moves a column-sharded
``A`` there), and the cell is checked like the others.

One kind of cell cannot work, and the test asserts the error the user gets instead:

- eager ``jax.grad``/``value_and_grad`` (and ``jacrev``) on Explicit axes without
  ``jax.set_mesh``, on more than one device: JAX's own limitation, for every function of a
  sharded array (``jax.grad(jnp.sum)`` fails alike). After the function returned, ``grad``
  builds the output's cotangent ``1.0`` with the output's type, whose sharding names only the
  abstract mesh, and outside ``jax.set_mesh`` an eager array cannot be placed on an abstract
  mesh. The test takes the expectation from JAX itself: jaxmg must fail exactly as
  ``jax.grad(jnp.sum)`` does on the same mesh, and work where that works (one device, or a JAX
  that lifts the limitation). ``jvp``, ``vjp`` (with the user's own cotangent) and
  ``jax.jit(jax.grad(...))`` work in those cells, and are checked there.

Cost: double precision only (test_autodiff.py covers complex dtypes and the routes), ``N = 4``
per device; under ``jit`` each derivative of each routine is a program of its own (one program
holding all of them is tests/api/test_repeated_calls.py's concern). Runs with 1 device (JAX's
own solvers inside jaxmg's programs) and 4 (the distributed engines); the cells take the same
paths on 2 devices as on 4, and test_autodiff.py runs the routes on 2. The row-sharded cells
run with 4 devices in ``nox -s tests`` only (``grid_sweep``): the jax calls they make are the
column cells', which every run has.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxmg


@pytest.fixture(autouse=True, scope="module")
def _device_counts(request):
    if request.config.getoption("--num-cpu-devices") not in (1, 4):
        pytest.skip("the call matrix runs with 1 and 4 devices")


MODES = ("eager", "jit")
TYPES = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}
HOWS = ("mesh", "set_mesh", "inferred")
FORMS = {"cols": P(None, "x"), "rows": P("x", None)}


def size():
    return 4 * jax.device_count()


def data(n):
    """``(H, G, b)``: a Hermitian positive definite H with eigenvalues 1..n (gaps of 1: the
    eigenvector derivatives are well conditioned), a well-conditioned general G, b ``[n, 2]``."""
    rng = np.random.default_rng(25)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    h = (q * np.arange(1.0, n + 1)) @ q.T
    g = rng.standard_normal((n, n)) + n * np.eye(n)
    return h, g, rng.standard_normal((n, 2))


def herm(s):
    return (s + jnp.conj(s).T) / 2


def routines(kw):
    """Every differentiable routine: ``name -> (its matrix, H or G, with b or not, fn)``, ``fn``
    a function of the matrix (and ``b``); ``kw``: the cell's mesh arguments. A function of
    exactly what it reads: a ``vjp`` eagerly on Explicit axes cannot make the zero cotangent of
    an unused sharded argument outside ``jax.set_mesh`` (JAX's own, as for ``grad`` below)."""

    def potrs(h, b):
        return jaxmg.potrs(h, b, return_logdet=True, **kw)

    def cho(h, b):
        factor = jaxmg.cho_factor(h, **kw)
        return jaxmg.cho_solve(factor, b), factor.logdet

    def lu(g, b):
        factor = jaxmg.lu_factor(g, **kw)
        return jaxmg.lu_solve(factor, b, trans=0), jaxmg.lu_solve(factor, b, trans=1)

    def lu_direct(g, b):
        return (jaxmg.lu_solve(g, b, **kw),)  # factors G itself

    def potri(h):
        return (jaxmg.potri(h, **kw),)

    def eigvals(h):
        return (jaxmg.syevd(h, return_eigenvectors=False, **kw),)

    def eigh(h):
        w, v = jaxmg.syevd(h, **kw)
        return w, jnp.abs(v) ** 2

    return dict(
        potrs=("H", True, potrs),
        cho=("H", True, cho),
        lu=("G", True, lu),
        lu_direct=("G", True, lu_direct),
        potri=("H", False, potri),
        eigvals=("H", False, eigvals),
        eigh=("H", False, eigh),
    )


def references():
    """The same with JAX's single-device functions."""

    def solve(h, b):
        s = herm(h)
        return jnp.linalg.solve(s, b), jnp.linalg.slogdet(s)[1]

    def eigh(h):
        w, v = jnp.linalg.eigh(herm(h))
        return w, jnp.abs(v) ** 2

    return dict(
        potrs=solve,
        cho=solve,
        lu=lambda g, b: (jnp.linalg.solve(g, b), jnp.linalg.solve(g.T, b)),
        lu_direct=lambda g, b: (jnp.linalg.solve(g, b),),
        potri=lambda h: (jnp.linalg.inv(herm(h)),),
        eigvals=lambda h: (jnp.linalg.eigvalsh(herm(h)),),
        eigh=eigh,
    )


def operands(args, matrix, with_b):
    """The arguments of a routine from the cell's ``(H, G, b)``."""
    h, g, b = args
    return ((h if matrix == "H" else g),) + ((b,) if with_b else ())


def like(x, value):
    """``value`` (numpy) with the type, sharding included, of ``x``: tangents and cotangents
    must match their primals' types on Explicit axes."""
    return jnp.zeros_like(x) + value


def loss(fn, weights):
    def scalar(*args):
        return sum(jnp.sum(w * o) for w, o in zip(weights, fn(*args), strict=True))

    return scalar


def values_and_derivatives(fn, tangents, weights, grad=True, only=None):
    """``args -> (values, jvp tangents, vjp cotangents[, (loss, its gradient)])``; ``only``:
    the one of them named (in a tuple)."""

    def run(*args):
        out = ()
        if only in (None, "values"):
            out += (fn(*args),)
        if only in (None, "jvp"):
            tangents_in = tuple(like(a, t) for a, t in zip(args, tangents, strict=True))
            out += (jax.jvp(fn, args, tangents_in)[1],)
        if only in (None, "vjp"):
            outputs, pullback = jax.vjp(fn, *args)
            out += (pullback(tuple(like(o, w) for o, w in zip(outputs, weights, strict=True))),)
        if only == "value_and_grad" or (only is None and grad):
            out += (gradient(fn, weights, len(args))(*args),)
        return out

    return run


KINDS = ("values", "jvp", "vjp", "value_and_grad")


def derivative_kinds(fn, tangents, weights):
    """The four parts of :func:`values_and_derivatives`, one function each."""

    def part(kind):
        def run(*args):
            return values_and_derivatives(fn, tangents, weights, only=kind)(*args)[0]

        return run

    return [part(kind) for kind in KINDS]


def gradient(fn, weights, count):
    return jax.value_and_grad(loss(fn, weights), argnums=tuple(range(count)))


@pytest.fixture(scope="module")
def problem():
    """The data and, per routine, fixed tangents and cotangents (the loss's weights) and JAX's
    answers (one device, no mesh), once per run: ``(H, G, b), {routine: (tangents, weights,
    answers)}``."""
    n = size()
    args = data(n)
    rng = np.random.default_rng(7)
    tangents = tuple(rng.standard_normal(np.shape(a)) for a in args)
    cases = {}
    for name, fn in references().items():
        matrix, with_b, _ = routines({})[name]
        mine = operands(args, matrix, with_b)
        directions = operands(tangents, matrix, with_b)
        weights = tuple(rng.standard_normal(np.shape(o)) for o in fn(*mine))
        want = jax.jit(values_and_derivatives(fn, directions, weights))(*mine)
        cases[name] = directions, weights, jax.tree.map(np.asarray, want)
    return args, cases


@pytest.fixture(scope="module")
def meshes():
    """One mesh per axis type for the whole run: the cells share jaxmg's compiled programs."""
    return {
        name: jax.make_mesh((jax.device_count(),), ("x",), axis_types=(t,))
        for name, t in TYPES.items()
    }


def close(got, want, what):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want), what
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-9, atol=1e-9 * scale, err_msg=what)


def jax_own_grad_error(mesh, spec):
    """The error of ``jax.grad(jnp.sum)`` eagerly on an array sharded over ``mesh``, outside
    ``jax.set_mesh`` (``None`` where JAX runs it)."""
    a = jax.device_put(np.eye(size()), NamedSharding(mesh, spec))
    try:
        jax.grad(lambda s: jnp.sum(s))(a)
    except ValueError as error:
        return str(error)
    return None


def cell_inputs(args, how, mesh, spec):
    """The arguments and jaxmg keyword arguments of a cell."""
    h, g, b = args
    if how == "inferred":
        placed = NamedSharding(mesh, spec)
        return (jax.device_put(h, placed), jax.device_put(g, placed), b), {}
    kw = dict(in_specs=spec) if how == "set_mesh" else dict(mesh=mesh, in_specs=spec)
    return (jnp.asarray(h), jnp.asarray(g), b), kw


# Row sharding is jaxmg's other path through the same jax calls: its cells run whole with 4
# devices on the oldest jax (grid_sweep), the column cells everywhere (1 device, newest jax).
@pytest.mark.parametrize("form", ["cols", pytest.param("rows", marks=pytest.mark.grid_sweep)])
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("types", TYPES)
@pytest.mark.parametrize("mode", MODES)
def test_cell(problem, meshes, mode, types, how, form):
    args, cases = problem
    mesh, spec = meshes[types], FORMS[form]
    args, kw = cell_inputs(args, how, mesh, spec)
    refusal = None
    if mode == "eager" and types == "explicit" and how != "set_mesh":
        refusal = jax_own_grad_error(mesh, spec)
    context = jax.set_mesh(mesh) if how == "set_mesh" else contextlib.nullcontext()
    with context:
        for name, (matrix, with_b, fn) in routines(kw).items():
            tangents, weights, want = cases[name]
            mine = operands(args, matrix, with_b)
            if mode == "jit":
                for kind, run in enumerate(derivative_kinds(fn, tangents, weights)):
                    close(jax.jit(run)(*mine), want[kind], f"{name}, {KINDS[kind]}")
                continue
            got = values_and_derivatives(fn, tangents, weights, grad=False)(*mine)
            close(got, want[:3], name)
            grad = gradient(fn, weights, len(mine))
            if refusal is None:
                close(grad(*mine), want[3], name)
                continue
            # JAX's own limitation (module docstring): the same error as for jnp.sum, and
            # under jit none.
            with pytest.raises(ValueError) as error:
                grad(*mine)
            assert str(error.value) == refusal, name
            close(jax.jit(grad)(*mine), want[3], name)


@pytest.mark.parametrize(("mode", "types"), [("eager", "explicit"), ("jit", "auto")])
def test_jacobians_and_second_order(meshes, mode, types):
    """``jacfwd``, ``jacrev`` and a Hessian-vector product (forward over reverse) of potrs and
    its logdet, and of lu_solve with ``A^T``, against JAX's; under ``jax.set_mesh`` (eager
    ``jacrev`` on Explicit axes needs it, as for any JAX function: the note above), with
    ``in_specs=`` (jit on Auto axes has nothing else to go by)."""
    n = size()
    h0, g0, b0 = data(n)
    b0 = b0[:, 0]
    mesh = meshes[types]
    spec = FORMS["cols"]

    def ours(h, g, b):
        x, logdet = jaxmg.potrs(h, b, return_logdet=True, in_specs=spec)
        return x, logdet, jaxmg.lu_solve(g, b, trans=1, in_specs=spec)

    def theirs(h, g, b):
        s = herm(h)
        return jnp.linalg.solve(s, b), jnp.linalg.slogdet(s)[1], jnp.linalg.solve(g.T, b)

    def derivatives(fn):
        def scalar(h, g, b):
            x, logdet, y = fn(h, g, b)
            return jnp.sum(x**2) + logdet + jnp.sum(jnp.sin(y))

        def hvp(h, g, b, dh, dg):
            return jax.jvp(
                lambda h, g: jax.grad(scalar, argnums=(0, 1, 2))(h, g, b), (h, g), (dh, dg)
            )[1]

        return (
            lambda h, g, b, dh, dg: jax.jacfwd(fn, argnums=2)(h, g, b),
            lambda h, g, b, dh, dg: jax.jacrev(fn, argnums=(0, 1, 2))(h, g, b),
            hvp,
        )

    rng = np.random.default_rng(3)
    dh0, dg0 = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    want = [jax.jit(run)(h0, g0, b0, dh0, dg0) for run in derivatives(theirs)]
    placed = NamedSharding(mesh, spec)
    h, g, dh, dg = (jax.device_put(m, placed) for m in (h0, g0, dh0, dg0))
    # One program per derivative under jit (the module docstring: deadlocks otherwise).
    with jax.set_mesh(mesh):
        got = [
            (jax.jit(run) if mode == "jit" else run)(h, g, jnp.asarray(b0), dh, dg)
            for run in derivatives(ours)
        ]
    close(got, want, "jacobians")
