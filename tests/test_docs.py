"""The documentation stays true to the code: the configuration page is generated from the key table,
every key is documented, the README stays short and starts with what the project is, links between the
documents resolve, and no project file tells the project's development history (that is what git
history and CHANGELOG.md are for)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkflow_exchange import config_docs
from sparkflow_exchange.config import GROUPS, known_keys

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SETUP_RUN = "bash scripts/setup.sh && .venv/bin/python examples/quickstart.py"
SETUP_TEST = "bash scripts/setup.sh && .venv/bin/python -m pytest -q"

# Phrases of a lab notebook: who worked when, on which ticket, and which goal was or was not reached.
HISTORY = re.compile(
    r"\bsessions? \d+|\bissues? #?\d+|\btargets? (?:met|missed)\b|\b(?:met|missed) (?:the|its) target\b"
    r"|\btargets? (?:<=|>=|≤|≥)\s*\d|\bacceptance (?:test|target|criteria)|\bDESIGN\.md\b|\.\./shared/",
    re.IGNORECASE)
# CHANGELOG.md is where history belongs; this file names the phrases it looks for.
HISTORY_ALLOWED = {"CHANGELOG.md", "tests/test_docs.py"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".conf", ".java", ".sh", ".txt", ".cfg", ".in", ".json", ".yml", ".yaml"}


def project_files() -> list[str]:
    """The files git would commit (tracked or new, nothing ignored), relative to the root."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return sorted(name for name in out.split("\0") if name and (ROOT / name).is_file())


def test_configuration_page_is_generated_from_the_key_table():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == config_docs.render(), (
        "docs/configuration.md is out of date: run `python -m sparkflow_exchange.config_docs --write`")


def test_spark_defaults_example_is_generated_from_the_key_table():
    conf = (ROOT / "conf" / "spark-defaults.conf").read_text()
    assert conf == config_docs.render_conf(), (
        "conf/spark-defaults.conf is out of date: run `python -m sparkflow_exchange.config_docs --write`")


def test_every_key_is_documented_once_in_a_group():
    grouped = [k for members in GROUPS.values() for k in members]
    assert sorted(grouped) == sorted(known_keys()), "config.GROUPS must name every key exactly once"
    assert set(GROUPS) == {"required", "common", "tuning", "service", "security", "streaming"}
    page = (ROOT / "docs" / "configuration.md").read_text()
    undocumented = [k for k, (_, meaning) in known_keys().items() if f"| `{k}` |" not in page or not meaning.strip()]
    assert not undocumented, f"keys without a row and meaning in docs/configuration.md: {undocumented}"


def test_a_key_without_a_group_is_refused(monkeypatch):
    monkeypatch.setitem(GROUPS, "common", tuple(k for k in GROUPS["common"] if k != "ttl"))
    with pytest.raises(ValueError, match=r"without a group \['ttl'\]"):
        config_docs.render()


def test_readme_is_short_and_starts_with_what_the_project_is():
    text = README.read_text()
    assert len(text) <= 10_000, f"README.md has {len(text)} characters; keep it at most 10,000 (details go to docs/)"
    lines = text.splitlines()
    assert lines[0] == "# sparkflow-exchange"
    opening = " ".join(lines[1:6])
    assert "Flink" in opening and "PySpark" in opening and 'format("pipelined")' in opening


def test_readme_gives_the_two_commands_and_ci_runs_the_test_command():
    text = README.read_text()
    assert SETUP_RUN in text and SETUP_TEST in text
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert SETUP_TEST in ci, ".ci/run must run exactly the README's test command"


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", markdown, re.MULTILINE)}


def test_links_between_documents_resolve():
    broken = []
    for name in project_files():
        if not name.endswith(".md"):
            continue
        path = ROOT / name
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, f"broken links: {broken}"


def test_no_development_history_in_project_files():
    found = []
    for name in project_files():
        if name in HISTORY_ALLOWED or Path(name).suffix not in TEXT_SUFFIXES:
            continue
        for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            match = HISTORY.search(line)
            if match:
                found.append(f"{name}:{number}: {match.group(0)!r}")
    assert not found, "development history belongs in git and CHANGELOG.md, not in:\n" + "\n".join(found)


def test_operations_guide_lists_every_metric_and_command():
    """Every metric the service exports and every command of the CLI has its entry in docs/operations.md."""
    ops = (ROOT / "docs" / "operations.md").read_text()
    source = (ROOT / "sparkflow_exchange" / "service" / "metrics.py").read_text()
    metrics = re.findall(r'metric\(\s*"(\w+)"', source)
    assert len(metrics) >= 10, "metric names are no longer found in service/metrics.py; update this test"
    missing = [f"sparkflow_{m}" for m in metrics if f"`sparkflow_{m}`" not in ops]
    assert not missing, f"metrics missing from the table in docs/operations.md: {missing}"
    usage = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "--help"], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    commands = re.search(r"\{([\w,-]+)\}", usage).group(1).split(",")
    assert "serve" in commands
    undocumented = [c for c in commands if f"sparkflow-exchange {c}" not in ops]
    assert not undocumented, f"commands missing from docs/operations.md: {undocumented}"
