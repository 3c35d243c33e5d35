"""Command line: ``python -m jaxmg demo [--n N] [--tile T_A] [--dtype float64] [--backend jax]
[--repeat 5]``."""

import sys

from ._demo import main

sys.exit(main())
