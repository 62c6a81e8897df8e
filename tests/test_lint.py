"""ruff over the code, with the rules chosen in pyproject.toml ([tool.ruff]): CI runs pytest, so it runs ruff."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["sparkflow_exchange", "pyspark_pipelined", "tests", "scripts", "benchmarks", "setup.py"]


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    try:
        import ruff  # noqa: F401 - installed by the test extras (scripts/setup.sh)
    except ImportError:
        raise AssertionError("ruff is not installed: pip install -e '.[test]' (scripts/setup.sh does)") from None
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_ruff_passes_over_the_package_tests_scripts_and_benchmarks():
    done = _ruff("check", "--no-cache", "--output-format", "concise", *CHECKED)
    assert done.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix`):\n{done.stdout}{done.stderr}"


def test_the_rules_in_force_catch_an_undefined_name_and_unsorted_imports(tmp_path):
    # the project's settings, applied to a file that breaks them: a configuration that selects nothing fails here
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\n\ndef f():\n    return undefined_name, os, sys\n")
    done = _ruff("check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), "--output-format", "concise",
                 str(bad))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "F821" in done.stdout and "I001" in done.stdout, done.stdout
