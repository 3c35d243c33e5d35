"""pytest setup for the client tests: libraries that call jaxmg, run as their users run them.

These tests run only when tests/clients is named on the command line, in a pytest process of
their own (``nox -s clients``; by hand ``NETKET_EXPERIMENTAL_SHARDING_CPU=K pytest tests/clients
--num-cpu-devices=K``). ``pytest tests`` leaves them out: importing NetKet installs a
process-wide mesh (``jax.sharding.set_mesh``), which must not reach jaxmg's own suite.

NetKet reads its simulated CPU device count from NETKET_EXPERIMENTAL_SHARDING_CPU when it is
imported; where that variable is set it must equal ``--num-cpu-devices``, the count the top-level
conftest gives JAX.
"""

import os
import pathlib

import pytest

HERE = pathlib.Path(__file__).parent.resolve()


def _named_paths(config):
    """The paths named on the command line (``path::test`` ids cut at ``::``), resolved."""
    base = pathlib.Path(config.invocation_params.dir)
    return [(base / arg.split("::")[0]).resolve() for arg in config.args]


def _inside(path):
    return path == HERE or HERE in path.parents


def pytest_configure(config):
    named = _named_paths(config)
    if not any(_inside(p) for p in named):
        return  # loaded while collecting a wider run, which leaves this folder out
    if not all(_inside(p) for p in named):
        raise pytest.UsageError(
            "tests/clients runs in a pytest process of its own (importing NetKet sets a "
            f"process-wide JAX mesh); got paths {config.args}"
        )
    count = config.getoption("--num-cpu-devices")
    netket_count = os.environ.get("NETKET_EXPERIMENTAL_SHARDING_CPU")
    if netket_count is not None and int(netket_count) != count:
        raise pytest.UsageError(
            f"NETKET_EXPERIMENTAL_SHARDING_CPU={netket_count} but --num-cpu-devices={count}; "
            "set both to the same count"
        )


#: The NetKet release each test file was written for: only the installed one's is collected.
NETKET_FILES = {"test_netket_3_22.py": "3.22.4", "test_netket_3_23.py": "3.23.0"}


def pytest_ignore_collect(collection_path, config):
    if not any(_inside(p) for p in _named_paths(config)):
        return True
    wanted = NETKET_FILES.get(collection_path.name)
    if wanted is not None:
        import importlib.metadata

        return importlib.metadata.version("netket") != wanted
    return None


def pytest_collection_finish(session):
    """A client run that collected none of its tests has not tested the client."""
    if any(_inside(p) for p in _named_paths(session.config)) and not session.items:
        raise pytest.UsageError(
            f"tests/clients collected no test: no file here is for the installed NetKet "
            f"({NETKET_FILES})"
        )


@pytest.fixture(scope="session", autouse=True)
def netket_promotion_rules():
    """JAX's default promotion rules while the client tests run.

    The top-level conftest makes dtype promotion strict and rank promotion raise, for jaxmg's
    own code. NetKet 3.22.4 relies on the defaults inside its own functions (sampling a Spin
    Hilbert space multiplies int8 by int64; IsingJax broadcasts a (7, 6) array against a
    (64, 1, 6) one), so under the strict rules no VMC run starts. x64 stays on.
    """
    import jax

    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        yield
