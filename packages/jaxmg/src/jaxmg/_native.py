"""The one place the facade reaches the native package.

``jaxmg_cuda`` registers its targets for the CPU (LAPACK twin) and, when built with CUDA, for
NVIDIA GPUs under the same names, so XLA picks the implementation by the platform it lowers
for. The only decision left here is to refuse a GPU call early, with a way out, when the native
package was built without CUDA.
"""

from __future__ import annotations

import jaxmg_cuda


def backend_for(platform: str, fn: str):
    """The native wrappers (``mg_potrs``, ``mg_potri``, ``mg_syevd``) for ``platform``."""
    if platform == "gpu" and not jaxmg_cuda.has_cuda_support():
        raise RuntimeError(
            f"{fn}: A lives on GPUs but the installed jaxmg-cuda was built without CUDA "
            "support. Reinstall it with CUDA on (the default): "
            "pip install --force-reinstall ./packages/jaxmg-cuda"
        )
    return jaxmg_cuda
