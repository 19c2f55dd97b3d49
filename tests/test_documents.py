"""The documents cite what is there: every repository path BENCHMARKS.md, the README, docs/ and
bench/README.md name exists in the tree, every `hearth ...` command in BENCHMARKS.md parses with
the current argument parser, and the benchmark lab's README lists every script in bench/.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from engine.cli.arguments import build_parser
from engine.events import BadRequest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("BENCHMARKS.md", "README.md", "bench/README.md",
             *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))

# A path from the repository root, or a root document; `[\w./*{},-]` keeps globs and brace lists
# whole so they can be let through.
ROOTED = re.compile(
    r"(?<![\w./$-])((?:engine|app|tests|bench|packaging|docs|hearth_resources|resources|\.ci)"
    r"/[\w./*{},-]*|[A-Z]+\.md|pyproject\.toml)")
# A script named alone in backticks: it must be somewhere in the tree (bench/ or engine/ first).
SCRIPT = re.compile(r"`([\w./-]+\.(?:py|sh))`")
# gpt-fast's own files, which the peer benchmark copies in from outside the project.
OUTSIDE_FILES = {"model.py", "quantize.py", "generate.py"}


def tracked_paths() -> set[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = set(out.split())
    for path in list(paths):  # every folder above a file, too
        while "/" in path:
            path = path.rsplit("/", 1)[0]
            paths.add(path)
    return paths


def engine_packages() -> list[str]:
    return sorted(p.name for p in (ROOT / "engine").iterdir()
                  if p.is_dir() and not p.name.startswith("__"))


def missing_citations(text: str, paths: set[str]) -> list[str]:
    """The cited repository paths in `text` that are not in `paths`, one 'line N: path' each."""
    names = {p.rsplit("/", 1)[-1] for p in paths}
    packages = "|".join(engine_packages())
    inside_engine = re.compile(rf"(?<![\w./-])((?:{packages})/[\w/]+\.py)\b")

    def present(path: str) -> bool:
        return "*" in path or "{" in path or path.rstrip("/") in paths

    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in ROOTED.finditer(line):
            path = match[1].rstrip(".,:;)")
            if not present(path):
                missing.append(f"line {number}: {path}")
        for match in inside_engine.finditer(line):
            if not present(match[1]) and not present(f"engine/{match[1]}"):
                missing.append(f"line {number}: {match[1]}")
        for match in SCRIPT.finditer(line):
            name = match[1]
            if any(present(p) for p in (name, f"bench/{name}", f"engine/{name}")):
                continue
            if "/" not in name and (name in names or name in OUTSIDE_FILES):
                continue
            missing.append(f"line {number}: {name}")
    return missing


def hearth_commands(text: str) -> list[str]:
    """Every `hearth ...` command in backticks, environment assignments before it included."""
    spans = re.findall(r"`([^`]+)`", text)
    return [s for s in spans if re.match(r"^(?:[A-Z_]+=\S+ )*hearth \w", s)]


def parse_error(command: str) -> str | None:
    """None when `command` parses with the current `hearth` parser, else argparse's sentence."""
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    assert words[0] == "hearth", command
    parser = build_parser()
    if len(words) == 2:  # a command named, not run: `hearth eval`
        subcommands = parser._subparsers._group_actions[0].choices
        return None if words[1] in subcommands else f"no command {words[1]!r}"
    try:
        parser.parse_args(words[1:])
    except BadRequest as error:
        return str(error)
    return None


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_cited_path_exists(document):
    text = (ROOT / document).read_text(encoding="utf-8")
    assert missing_citations(text, tracked_paths()) == []


def test_a_cited_path_that_is_not_there_is_found():
    paths = tracked_paths()
    text = ("Run `bash bench/speculative.sh`, then `python3 bench/int4_blocked.py`;\n"
            "see engine/events.py, kernels/decode_attention_kernel.py, kernels/gone_kernel.py,\n"
            "DESIGN.md and `h200_next.sh`.\n")
    assert missing_citations(text, paths) == [
        "line 1: bench/int4_blocked.py", "line 2: engine/events.py",
        "line 2: kernels/gone_kernel.py", "line 3: DESIGN.md", "line 3: h200_next.sh"]


def test_the_results_cite_their_commands():
    commands = hearth_commands((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert len(commands) >= 10  # the results tables' rows, not an empty match


def test_every_hearth_command_in_the_results_parses():
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    errors = {c: parse_error(c) for c in hearth_commands(text)}
    assert {c: e for c, e in errors.items() if e} == {}


def test_a_command_the_parser_refuses_is_found():
    text = ("| 7B | `hearth bench --model bench/qwen2.5-7b --no-such-flag` |\n"
            "| 7B | `HEARTH_PDL=off hearth bench --model bench/qwen2.5-7b --concurrency 0` |\n"
            "| 7B | `HEARTH_PDL=off hearth bench --model bench/qwen2.5-7b --quant awq` |\n"
            "(`hearth eval`, `hearth evaluate`)\n")
    commands = hearth_commands(text)
    assert len(commands) == 5
    assert [parse_error(c) is None for c in commands] == [False, False, True, True, False]


def test_the_lab_readme_lists_every_script():
    readme = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    scripts = [p.name for p in (ROOT / "bench").iterdir()
               if p.suffix in (".py", ".sh") or p.is_dir() and not p.name.startswith("__")]
    unlisted = [s for s in scripts if f"`{s}" not in readme and f"bench/{s}" not in readme]
    assert scripts and unlisted == []
