"""What one call is and where it runs, worked out in Python at trace time, before any device
work: the argument checks (:mod:`.checks`), the processes that drive the devices
(:mod:`.processes`), where ``A`` lives (:mod:`.sharding`), the call's description and the route
of its blocks (:mod:`.call`), and jaxmg 1.x's status vector (:mod:`.v1_status`)."""
