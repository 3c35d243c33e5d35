"""LAPACK-backed calls that ``jax.vmap`` runs one matrix at a time on CPUs.

jaxlib's CPU LAPACK kernels (jaxlib 0.10.0 to 0.11.0; later open-source builds no longer do)
split a batch of matrices into chunks on XLA:CPU's intra-op thread pool and wait for them on the
calling thread. Inside a program of several devices that thread is often itself one of the
pool's (a program resumes there after a collective or a matmul), and the pool has
``max(cores, devices)`` threads: when every one of them waits, in a rendezvous or for chunks
nobody runs, the program hangs (until XLA's rendezvous aborts the process, where a collective
waits). A kernel splits its batch where it holds at least two matrices and about ``2e5`` flops
in all (``[3, 512, 32]`` triangular solves do; ``[3, 256, 16]`` do not).

:func:`unbatched` leaves a call as it is on other platforms (one batched call: cuSOLVER's on
GPUs) and, batched on CPUs, loops over the batch (``jax.custom_batching.sequential_vmap``): each
kernel then holds one matrix, which it factors on its own thread. The platform is the one the
program is lowered for (``lax.platform_dependent``), so a CPU program and a GPU program of the
same trace each get their own form.
"""

from __future__ import annotations

import functools

import jax
from jax import lax


def unbatched(f, *args, **options):
    """``f(*args, **options)``; under ``jax.vmap`` on CPUs one batch element at a time.

    ``args`` are the arrays ``f`` takes (the ones ``jax.vmap`` may batch), ``options`` its
    static keyword arguments. Not reverse-differentiable (``sequential_vmap`` has no transpose):
    for the engines' own steps, whose derivatives jaxmg defines above them."""
    call = functools.partial(f, **options)
    return lax.platform_dependent(
        *args, cpu=jax.custom_batching.sequential_vmap(call), default=call
    )
