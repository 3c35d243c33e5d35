"""jaxmg-cuda: the native XLA FFI targets of jaxmg.

``jaxmg_potrs``, ``jaxmg_potri``, ``jaxmg_syevd``, ``jaxmg_potrf``, ``jaxmg_potrs_factored``,
``jaxmg_potri_factored``, ``jaxmg_getrf`` and ``jaxmg_getrs`` are registered at import for the CPU
(the LAPACK twin) and, when built with CUDA support, for CUDA (cuSolverMg, loaded at first
GPU use). ``jaxmg_mp_<routine>`` (backend "mp": ScaLAPACK over MPI, one process per device)
are registered for the CPU by :mod:`jaxmg_cuda.mp`. The wrappers below are meant to be called
on local shards inside ``jax.shard_map``; the operand contract is in this package's README.
"""

import importlib.metadata

from . import mp as mp
from ._ops import (
    has_cuda_support as has_cuda_support,
    load_cuda_libraries as load_cuda_libraries,
    mg_getrf as mg_getrf,
    mg_getrs as mg_getrs,
    mg_potrf as mg_potrf,
    mg_potri as mg_potri,
    mg_potri_factored as mg_potri_factored,
    mg_potrs as mg_potrs,
    mg_potrs_factored as mg_potrs_factored,
    mg_syevd as mg_syevd,
    open_meetings as open_meetings,
    rendezvous_probe as rendezvous_probe,
)

__version__ = importlib.metadata.version("jaxmg-cuda")  # its pyproject.toml, the one source
