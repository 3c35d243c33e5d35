"""What an engine provides: the one interface the layers above ask instead of its name.

An engine is what runs a routine on the devices of a solver axis: its wrappers (``potrs``,
``getrf``, ... under neutral names, with the operand contract of packages/jaxmg-cuda/README.md),
and the facts that differ between engines. Each engine is one module of this folder holding one
instance of a subclass of :class:`Engine` (``ENGINE``), registered in :mod:`jaxmg.engines`.
A fact that depends on the platform is a method taking it; the others are attributes.
"""

from __future__ import annotations

import importlib
import types

#: ``jaxmg_cuda`` once imported, or the ImportError its import raised.
_native = None


def _imported():
    global _native
    if _native is None:
        try:
            _native = importlib.import_module("jaxmg_cuda")
        except ImportError as error:
            _native = error
    return _native


def native_installed() -> bool:
    """Whether ``jaxmg_cuda`` (the native engines' handlers) imports in this environment."""
    return not isinstance(_imported(), ImportError)


def install_command(extra: str | None = None) -> str:
    """What installs the native engines: this repository's three packages, from a clone of it
    (the package index's ``jaxmg`` is another project), with jaxmg's optional dependencies
    ``extra`` (e.g. ``"mpi"``)."""
    jaxmg = "./packages/jaxmg" if extra is None else f"'./packages/jaxmg[{extra}]'"
    return f"pip install ./packages/jaxmg-layout ./packages/jaxmg-cuda {jaxmg}"


def native_module(backend: str, extra: str | None = None, caller: str | None = None):
    """The ``jaxmg_cuda`` module, imported on first use; else an ImportError that says how to
    install it. ``backend``: the ``backend=`` value that needs it, ``extra`` the optional
    dependencies of jaxmg it needs besides, and ``caller`` the public function, for the
    message."""
    module = _imported()
    if isinstance(module, ImportError):
        missing = isinstance(module, ModuleNotFoundError) and module.name == "jaxmg_cuda"
        what = "which are not installed" if missing else f"which do not import ({module})"
        raise ImportError(
            ("" if caller is None else f"{caller}: ")
            + f"backend={backend!r} needs jaxmg's native engines (the package jaxmg-cuda), {what}. "
            "Install them from a clone of this repository (a C++ compiler and CMake build "
            f"them): {install_command(extra)}. backend='jax' runs without them."
        ) from module
    return module


class Engine:
    """One engine. The defaults are those of an engine that asks nothing special."""

    #: The ``backend=`` value that names it.
    name: str = ""
    #: Whether a caller may ask for it by name (else it is only chosen automatically).
    public: bool = True
    #: The platforms it runs on (``None``: any platform JAX runs on).
    platforms: tuple[str, ...] | None = ("cpu", "gpu")
    #: What it is, for messages.
    summary: str = ""
    #: Runs in jaxmg-cuda's native handlers (an optional install: :meth:`handlers`).
    native: bool = False
    #: The optional dependencies of jaxmg it needs besides (``jaxmg[extra]``), for messages.
    extra: str | None = None
    #: Takes ``A`` sharded over a process grid ``P(r, c)``.
    takes_grid: bool = False
    #: Takes the whole matrix as one tile, on a solver axis of one device: nothing to relay,
    #: and the decompositions run JAX's own dense ones there.
    whole: bool = False
    #: Its leader moves whole tiles between the devices' buffers in place (``relayout="native"``).
    moves_in_place: bool = False
    #: Solves with ``A^T`` by building the LU factor of ``A^T`` from ``A``'s (its ``getrs``
    #: takes ``trans = N`` alone); an engine that neither solves with ``A^T`` nor builds that
    #: factor refuses such solves itself.
    transposes_factor: bool = False
    #: With ``A`` donated, potrs keeps its factor in ``A``'s buffer.
    factors_in_a: bool = True
    #: Has its own QR and least squares of full rank.
    own_qr: bool = False
    #: The engine of the same backend that runs a call on one device, where another does
    #: (backend ``"jax"``: JAX's dense solvers there, collectives on several); ``None``: this.
    alone: Engine | None = None

    def routines(self, platform: str, caller: str) -> types.SimpleNamespace:
        """Its wrappers on ``platform``; raises, with a way out, where it cannot run there."""
        raise NotImplementedError

    def solves_transposed(self, platform: str) -> bool:
        """Whether its ``getrs`` solves with ``A^T`` and ``A^H`` (``trans`` ``T`` and ``C``)."""
        return True

    def relays_blocks(self, platform: str) -> bool:
        """Whether it takes a block of ``A`` as JAX holds it and relays it to its tiles itself;
        such an engine's own rectangular routines (SVD, QR, least squares) run too."""
        return False

    def inverts(self, platform: str) -> bool:
        """Whether it has ``potri``."""
        return True

    def tile(self, T_A, n: int, ndev: int, routine: str, platform: str, caller: str, pad) -> int:
        """The tile a call of ``routine`` runs with: ``T_A``, or its choice for ``None``."""
        raise NotImplementedError

    def triangular_tile(self, n: int, ndev: int) -> int:
        """The widest layout tile with which its Cholesky factor is triangular in ``A``'s own
        order (the composed routines read the factor itself, as ``R``)."""
        return n // ndev

    def load(self, caller: str, platform: str) -> None:
        """Opens its libraries in this process before a call, or raises saying why not."""

    def available(self) -> bool:
        """Whether what it runs in is installed in this environment."""
        return not self.native or native_installed()

    def handlers(self, caller: str | None = None):
        """The ``jaxmg_cuda`` module of a native engine; an ImportError saying how to install it
        where it is not installed (``caller``: the public function, for the message)."""
        return native_module(self.name, self.extra, caller)

    def can_run(self, mesh, axes: tuple[str, ...], platform: str, caller: str) -> str | None:
        """Why it cannot run a call on the mesh ``axes`` (one, or ``P(r, c)``'s two) of
        ``mesh`` from this process, as a message, or ``None`` when it can: its platforms, its
        installation, then :meth:`refusal`. The automatic choice takes a native engine only where
        this is ``None``; an engine asked for by name is refused with the message
        (:func:`jaxmg.engines.geometry`)."""
        if self.platforms is not None and platform not in self.platforms:
            return (
                f"{caller}: backend={self.name!r} ({self.summary}) runs on "
                f"{' and '.join(self.platforms)} devices, not on {platform!r} ones"
            )
        if not self.available():
            try:
                self.handlers(caller)
            except ImportError as error:
                return str(error)
        return self.refusal(mesh, axes, platform, caller)

    def refusal(self, mesh, axes: tuple[str, ...], platform: str, caller: str) -> str | None:
        """Why the mesh ``axes`` and the processes holding them are not ones it solves on (the
        message :meth:`participants` would raise), or ``None``."""
        return None

    def participants(self, mesh, axes: tuple[str, ...], platform: str, caller: str):
        """``(ndev, device_ids, job, pids)`` of a call on the mesh ``axes`` (one, or ``P(r,
        c)``'s two), after checking it can run there (:class:`jaxmg.describe.Geometry`
        says what each is)."""
        raise NotImplementedError

    def job_attributes(self, geometry) -> dict:
        """Its own attributes of a native call, beyond the layout's."""
        return {}

    def max_devices(self, platform: str) -> int | None:
        """The most devices one call takes on ``platform`` (``None``: no limit)."""
        return None

    def __repr__(self) -> str:
        return f"<jaxmg engine {self.name!r}>"
