"""What runs on the devices: the local bodies inside ``jax.shard_map`` (:mod:`.local`), the
jitted ``shard_map`` programs, one per engine routine (:mod:`.routines`), and every derivative
rule with the factor objects (:mod:`.derivatives`)."""
