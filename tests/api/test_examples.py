"""The examples (the README's, and the original README's adapted only in their device list) run
and print True.

Each runs in its own process: an example configures JAX for itself (2 simulated CPU devices),
so they run once, in the 4-device pytest process, not once per simulated device count.
"""

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("once_per_suite")

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


def run(name):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    "name",
    [
        "potrs.py",
        "potri.py",
        "syevd.py",
        "gaussian_process.py",
        "largest_potrs.py",
        "jaxmg1_api.py",
    ],
)
def test_example_prints_true(name):
    lines = [line for line in run(name).splitlines() if line in ("True", "False")]
    assert lines and all(line == "True" for line in lines)


def test_potrs_no_shardmap_example():
    out = run("potrs_no_shardmap.py")
    assert "Status: [0]" in out
    assert out.strip().splitlines()[-1] == "True"
    assert "dev0:_a=" in out and "1.1+0.j" in out


def test_layout_example_matches_original_readme():
    out = run("layout.py")
    # device 0 holds columns 0,1,4,5,8,9 of diag(1..12): its diagonal entries are 1,2,5,6,9,10
    first, second = out.split("dev ")[1:3]
    for value in ("1.", "2.", "5.", "6.", "9.", "10."):
        assert f" {value}" in first
    for value in ("3.", "4.", "7.", "8.", "11.", "12."):
        assert f" {value}" in second


DOCUMENTS = [EXAMPLES.parent / "README.md", *sorted((EXAMPLES.parent / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_documented_python_blocks_run(document):
    """Every ```python block of the README and of docs/ runs and prints only True verdicts."""
    blocks = [part.split("```", 1)[0] for part in document.read_text().split("```python\n")[1:]]
    for block in blocks:
        done = subprocess.run(
            [sys.executable, "-c", block], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        verdicts = [line for line in done.stdout.splitlines() if line in ("True", "False")]
        assert verdicts and all(v == "True" for v in verdicts), done.stdout


def test_the_readme_has_an_example():
    assert "```python\n" in DOCUMENTS[0].read_text()


def test_the_readmes_first_example_is_examples_potrs():
    """The README's first example is examples/potrs.py's code (its imports after the JAX
    configuration carry ruff's ``noqa`` there), and the modern call: ``potrs(A, b)`` alone."""
    readme = DOCUMENTS[0].read_text().split("```python\n")[1].split("```", 1)[0]
    program = (EXAMPLES / "potrs.py").read_text().replace("  # noqa: E402", "")
    assert readme.strip() and readme in program
    assert "jaxmg.potrs(A, b)" in readme and "T_A" not in readme and "in_specs" not in readme


def test_demo_solves_and_passes_its_residual_check():
    """``python -m jaxmg demo`` (the README's first command runs it): exit code 0 means the
    scaled residual was under 30 and the status 0; JAX's own time on one device is printed
    beside jaxmg's, and the engine that solved is named."""
    done = subprocess.run(
        [sys.executable, "-m", "jaxmg", "demo", "--n", "256", "--cpu-devices", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "T_A = automatic" in done.stdout and "status = 0" in done.stdout
    assert "JAX on one device (cho_factor + cho_solve): " in done.stdout, done.stdout
    assert "jaxmg / JAX = " in done.stdout and 'backend "' in done.stdout, done.stdout
