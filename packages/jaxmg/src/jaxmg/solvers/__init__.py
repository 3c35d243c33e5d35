"""The public functions of one square matrix: ``potrs``, ``potri``, ``syevd``
(:mod:`.hermitian`), the factor objects (:mod:`.factors`), the functions called inside a user's
``shard_map`` (:mod:`.in_shard_map`), and the multi-node helpers (:mod:`.multinode`)."""
