"""Importing jaxmg changes no global JAX setting (in a fresh process: once, with 4 devices)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("once_per_suite")


def test_import_leaves_jax_config_alone():
    code = (
        "import jax; before = (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision,"
        " jax.config.jax_numpy_dtype_promotion); import jaxmg;"
        " after = (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision,"
        " jax.config.jax_numpy_dtype_promotion); assert before == after, (before, after);"
        " assert not jax.config.jax_enable_x64; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
