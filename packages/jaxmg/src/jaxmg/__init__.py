"""jaxmg: dense linear algebra on sharded jax.Arrays through NVIDIA cuSolverMg.

``potrs`` (solve with a Hermitian positive definite matrix, optionally with its log
determinant), ``potri`` (its inverse), ``syevd`` (Hermitian eigendecomposition),
``cho_factor``/``cho_solve`` (a Cholesky factor reused over many solves) and
``lu_factor``/``lu_solve`` (general square systems, LU with partial pivoting), and ``svd``,
``polar``, ``lstsq`` and ``qr`` composed of them, on a matrix sharded
over the devices of one node, from eagerly executed code, ``jax.jit`` and ``jax.shard_map``, all
differentiable (``jax.grad``, ``jvp``, ``vjp``). On GPUs the work is done by cuSolverMg; on CPU
devices by a LAPACK twin that runs the same multi-device machinery; on a mesh axis of one device,
by JAX's own dense solvers with the same semantics (``backend="mg"`` forces cuSolverMg or the
twin there). One process may drive every
device, or each process one device of the node; for several nodes, ``host_mesh`` and
``gather_to_hosts`` gather the matrix onto every node.

Programs written for jaxmg 1.x (cuSOLVERMp; NetKet 3.23 calls it) run too: its names
(``gesvd``, ``least_squares``, the ``*_shardmap_ctx`` functions on global arrays,
``device_supports_vmm``) and its argument order (``qr(A, T_A)``, ``polar(A, T_A)``,
``matrix_specs=``) mean here what they mean there; docs/migration.md says where they differ.
jaxmg has no module ``__version__``: NetKet 3.22 accepts only 0.0.x versions and NetKet 3.23
only 1.x ones, and both skip the check without it; ``importlib.metadata.version("jaxmg")``
gives the installed version.

jaxmg 0.0.x's layout helpers (``cyclic_1d``, ``verify_cyclic``, ``manual_cyclic_1d_layout``,
``plot_block_to_cyclic``) and ``jaxmg.utils`` (``random_psd``, ``JaxMgWarning``, the category
of jaxmg's warnings) remain for programs and tests written for it.

Importing jaxmg changes no global JAX setting.

How the package is built, module by module: docs/architecture.md.
"""

from jaxmg_layout import (
    calculate_all_valid_T_A as calculate_all_valid_T_A,
    calculate_padding as calculate_padding,
    calculate_valid_T_A as calculate_valid_T_A,
    cyclic_1d_layout as cyclic_1d_layout,
    plot_layout as plot_layout,
    undo_cyclic_1d_layout as undo_cyclic_1d_layout,
)

from . import utils as utils
from .compat.shardmap_ctx import (
    potri_shardmap_ctx as potri_shardmap_ctx,
    potrs_shardmap_ctx as potrs_shardmap_ctx,
    syevd_shardmap_ctx as syevd_shardmap_ctx,
)
from .compat.v0 import (
    cyclic_1d as cyclic_1d,
    manual_cyclic_1d_layout as manual_cyclic_1d_layout,
    plot_block_to_cyclic as plot_block_to_cyclic,
    verify_cyclic as verify_cyclic,
)
from .compat.v1 import (
    device_supports_vmm as device_supports_vmm,
    gesvd as gesvd,
    gesvd_shardmap_ctx as gesvd_shardmap_ctx,
    least_squares as least_squares,
    least_squares_shardmap_ctx as least_squares_shardmap_ctx,
    lu_solve_shardmap_ctx as lu_solve_shardmap_ctx,
    polar_shardmap_ctx as polar_shardmap_ctx,
    qr_shardmap_ctx as qr_shardmap_ctx,
)
from .decompositions.api import (
    lstsq as lstsq,
    polar as polar,
    qr as qr,
    svd as svd,
)
from .programs.derivatives import (
    CholeskyFactor as CholeskyFactor,
    LUFactor as LUFactor,
)
from .solvers.factors import (
    cho_factor as cho_factor,
    cho_solve as cho_solve,
    lu_factor as lu_factor,
    lu_solve as lu_solve,
)
from .solvers.hermitian import (
    potri as potri,
    potri_symmetrize as potri_symmetrize,
    potrs as potrs,
    syevd as syevd,
)
from .solvers.in_shard_map import (
    potri_no_shardmap as potri_no_shardmap,
    potrs_no_shardmap as potrs_no_shardmap,
    syevd_no_shardmap as syevd_no_shardmap,
)
from .solvers.multinode import (
    gather_to_hosts as gather_to_hosts,
    host_mesh as host_mesh,
)
