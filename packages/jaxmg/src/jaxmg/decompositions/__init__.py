"""The rectangular routines, composed in JAX of the solvers: ``svd``, ``polar``, ``lstsq`` and
``qr`` (:mod:`.api`), by QDWH (:mod:`.qdwh`), CholeskyQR (:mod:`.qr`) and the Jordan-Wielandt
eigenproblem (:mod:`.svd`), on sharded products (:mod:`.products`) and the glue between solver
calls (:mod:`.glue`); and backend ``"mp"``'s own routines (:mod:`.engine_routines`)."""
