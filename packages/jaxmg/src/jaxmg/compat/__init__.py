"""The names written for the original jaxmg: 0.0.x's layout helpers (:mod:`.v0`), the names
only 1.x has (:mod:`.v1`), and the ``*_shardmap_ctx`` names of both generations
(:mod:`.shardmap_ctx`)."""
