"""The benchmark lab (bench/) finds the repository from where it stands: a script that climbs
from its own file to import `engine` or read the demo models climbs to the repository root,
and every file it then names there exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
CLIMB = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d)\]((?:\s*/\s*\"[^\"]+\")*)")


def test_scripts_climb_to_the_repository_root():
    climbs = []
    for script in sorted(BENCH.glob("*.py")):
        for match in CLIMB.finditer(script.read_text(encoding="utf-8")):
            top = script.resolve().parents[int(match[1])]
            climbs.append((script.name, top))
            parts = re.findall(r"\"([^\"]+)\"", match[2])
            assert top.joinpath(*parts).exists(), (script.name, parts)
    assert climbs, "no script climbs: the pattern no longer matches"
    assert [(name, top) for name, top in climbs if top != ROOT] == []


def test_shell_scripts_run_from_the_repository_root():
    for script in sorted(BENCH.glob("*.sh")):
        text = script.read_text(encoding="utf-8")
        for up in re.findall(r'cd "\$\(dirname "\$0"\)/([./]*)"', text):
            assert (BENCH / up).resolve() == ROOT, (script.name, up)
        for sourced in re.findall(r"^\s*source (\S+)", text, flags=re.M):
            assert (ROOT / sourced).exists(), (script.name, sourced)
