"""Installers and desktop integration: the .desktop entry passes desktop-file-validate, the
installer picks torch by driver, and one real install.sh run in a fresh folder answers with the
default model (Hearth itself built and installed; its requirements, torch among them, already
there from this session's environment; the slowest test here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import cli
from engine.platform import display
from engine.tools import desktop_entry, doctor
from tests.engine.helpers import REPO
from tests.fixtures.smollm2 import wheel_path as smollm2_wheel

INSTALL_SH = REPO / "packaging" / "install.sh"
VALIDATE = shutil.which("desktop-file-validate")
needs_validator = pytest.mark.skipif(
    VALIDATE is None,
    reason="desktop-file-validate is missing (apt-get install desktop-file-utils)")


def validate(path: Path) -> None:
    proc = subprocess.run([VALIDATE, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def entry_values(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@needs_validator
def test_desktop_template_is_valid():
    validate(desktop_entry.TEMPLATE)


@needs_validator
def test_install_desktop_into_xdg_data_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    assert cli.main(["install-desktop"]) == 0
    entry = tmp_path / "share" / "applications" / "hearth.desktop"
    icon = tmp_path / "share" / "icons" / "hicolor" / "scalable" / "apps" / "hearth.svg"
    assert icon.read_bytes() == desktop_entry.ICON.read_bytes()
    validate(entry)
    values = entry_values(entry)
    command = desktop_entry.hearth_command()
    assert values["Exec"] == " ".join([*command, "gui"])
    assert values["TryExec"] == command[0] and values["Icon"] == "hearth"
    assert str(entry) in capsys.readouterr().out


@needs_validator
@pytest.mark.parametrize("folder", ["my apps", "50%off", "cost$", 'quote"d', "back\\slash"])
def test_exec_paths_that_need_quoting(tmp_path, folder):
    script = str(tmp_path / folder / "hearth")
    entry, _ = desktop_entry.install(tmp_path / "share", command=[script])
    validate(entry)
    exec_line = entry_values(entry)["Exec"]
    assert exec_line.endswith(" gui")
    # undo the two escape levels (string, then Exec quoting) and the %% field-code doubling
    arg = exec_line.removesuffix(" gui").replace("\\\\", "\\")
    if arg.startswith('"'):
        arg = re.sub(r'\\(["`$\\])', r"\1", arg[1:-1])
    assert arg.replace("%%", "%") == script


def test_relative_xdg_data_home_is_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", "relative/share")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert desktop_entry.data_home() == tmp_path / ".local" / "share"


def test_console_script_beside_the_interpreter_is_preferred(tmp_path, monkeypatch):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.touch()
    monkeypatch.setattr(sys, "executable", str(python))
    assert desktop_entry.hearth_command() == [str(python), "-m", "engine.cli.cli"]
    script = python.with_name("hearth")
    script.touch(mode=0o755)
    assert desktop_entry.hearth_command() == [str(script)]


def _dry_run(tmp_path: Path, smi_output: str | None, **env: str) -> str:
    """install.sh's plan with a fake nvidia-smi first on PATH (None: one that fails, as without a
    driver); returns what it prints."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{smi_output}'\n" if smi_output else "#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
    full_env.update(PATH=f"{bin_dir}:/usr/bin:/bin", HEARTH_DRY_RUN="1",
                    HEARTH_PYTHON=sys.executable, **env)
    proc = subprocess.run(["bash", str(INSTALL_SH), str(tmp_path / "venv")], env=full_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dry run: nothing changed" in proc.stdout
    assert not (tmp_path / "venv").exists()
    return proc.stdout


SMI = "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: {} |"


@pytest.mark.parametrize("cuda", [None, "11.4", "12.2", "12.8", "13.0"])
def test_install_sh_picks_torch_like_doctor(tmp_path, cuda):
    out = _dry_run(tmp_path, SMI.format(cuda) if cuda else None)
    version = tuple(int(x) for x in cuda.split(".")) if cuda else None
    assert f"torch:        torch from {doctor.torch_index_url(version)} " in out


def test_install_sh_torch_spec_uses_pips_own_index(tmp_path):
    out = _dry_run(tmp_path, SMI.format("12.8"), HEARTH_TORCH_SPEC="torch==2.13.0")
    assert "torch:        torch==2.13.0 (HEARTH_TORCH_SPEC" in out
    assert "download.pytorch.org" not in out


def test_install_sh_is_valid_bash():
    subprocess.run(["bash", "-n", str(INSTALL_SH)], check=True)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", str(INSTALL_SH)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


@pytest.mark.skipif(shutil.which("pwsh") is None, reason="PowerShell (pwsh) is not installed")
def test_install_ps1_parses():
    script = REPO / "packaging" / "install.ps1"
    check = (f"$e = $null; [System.Management.Automation.Language.Parser]::ParseFile("
             f"'{script}', [ref]$null, [ref]$e) | Out-Null; exit $e.Count")
    subprocess.run(["pwsh", "-NoProfile", "-Command", check], check=True)


def _requirements_of(name: str, extras: set[str]) -> list:
    """The installed distributions that `name[extras]` needs, itself excluded, all the way
    down (as this session's interpreter has them)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, seen, todo = {}, set(), [(name, frozenset(extras))]
    while todo:
        wanted, wanted_extras = todo.pop()
        if (canonicalize_name(wanted), wanted_extras) in seen:
            continue
        seen.add((canonicalize_name(wanted), wanted_extras))
        try:
            dist = metadata.distribution(wanted)
        except metadata.PackageNotFoundError:
            continue  # not here (another platform's): pip fetches it as for any fresh venv
        if canonicalize_name(wanted) != canonicalize_name(name):
            found[canonicalize_name(wanted)] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in (*wanted_extras, "")):
                todo.append((req.name, frozenset(req.extras)))
    return list(found.values())


def _hearths_requirements_after_the_venvs_own(tmp_path: Path) -> str:
    """A folder for PYTHONPATH: links to exactly the distributions hearth[awq,server] needs,
    taken from this session's environment (which .ci/run resolves afresh from the same
    requirements), and a sitecustomize that appends them to sys.path after the fresh venv's
    own. pip in the venv then finds torch and every dependency already satisfied and installs
    Hearth alone, built from this clone and not editable; a package Hearth uses without
    requiring it is still missing there, as on a fresh machine. The links' folder is appended,
    not a site folder, so no .pth there runs: `engine` and its package data come from the venv
    (checked below)."""
    folder = tmp_path / "hearth-requirements"
    links = folder / "site"
    links.mkdir(parents=True)
    for dist in _requirements_of("hearth", {"awq", "server"}):
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "")}:
            if not (links / top).exists() and Path(dist.locate_file(top)).exists():
                (links / top).symlink_to(Path(dist.locate_file(top)))
    (folder / "sitecustomize.py").write_text(f"import sys\nsys.path.append({str(links)!r})\n")
    return str(folder)


@pytest.mark.skipif(os.environ.get("HEARTH_SKIP_INSTALL_TEST") == "1",
                    reason="HEARTH_SKIP_INSTALL_TEST=1 (CI runs it)")
def test_install_sh_in_a_fresh_folder_answers_with_the_default_model(tmp_path):
    """One install.sh run, pip building and installing Hearth itself; everything else about it
    is checked here too."""
    # the fresh machine's own folders: not the test session's models folder (conftest), which
    # would take the starter away from XDG_DATA_HOME
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HEARTH_MODELS_DIR", "HEARTH_DATA_DIR")}
    env.update(HEARTH_TORCH_SPEC="torch==2.13.0",  # the CPU build on local disk, never CUDA
               HEARTH_PYTHON=sys.executable, XDG_DATA_HOME=str(tmp_path / "share"),
               HEARTH_BIN_DIR=str(tmp_path / "bin"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = _hearths_requirements_after_the_venvs_own(tmp_path)
    wheel = smollm2_wheel()  # the starter is imported by default: from the wheel on disk
    if wheel is None:
        env["HEARTH_NO_STARTER"] = "1"
    else:
        env["HEARTH_STARTER_WHEEL"] = str(wheel)
    venv = tmp_path / "hearth venv"  # a space, as in many home folders
    proc = subprocess.run(["bash", str(INSTALL_SH), str(venv)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Everything Hearth needs is here." in proc.stdout, proc.stdout[-4000:]
    hearth = venv / "bin" / "hearth"
    assert (tmp_path / "bin" / "hearth").resolve() == hearth.resolve()

    run = subprocess.run([str(hearth), "run", "--prompt", "hi", "--max-new-tokens", "8",
                          "--temperature", "0"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip(), run.stderr
    # the default model is the starter once imported (SmolLM2, a Llama), else the demo (Qwen2)
    default_arch = "LlamaForCausalLM" if wheel is not None else "Qwen2ForCausalLM"
    assert f"loaded {default_arch}" in run.stderr, run.stderr
    assert re.search(r"\[(eos|max_tokens|stop_string)\] [1-8] tokens", run.stderr), run.stderr

    if wheel is not None:
        starter = tmp_path / "share" / "hearth" / "models" / "SmolLM2-135M-Instruct"
        assert (starter / "config.json").is_file(), proc.stdout[-4000:]
        assert "imported the starter model" in proc.stdout

    entry = tmp_path / "share" / "applications" / "hearth.desktop"
    assert entry_values(entry)["TryExec"] == str(hearth)
    if VALIDATE:
        validate(entry)

    # the installed copy stands alone: its code, style sheet and icon come from the venv, not
    # from this clone (a file missing from the package would be read from the clone otherwise)
    python = str(venv / "bin" / "python")
    alone = subprocess.run([python, "-c", "import engine, sys; print(engine.__file__.startswith("
                            "sys.prefix))"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
    assert alone.stdout.strip() == "True", alone.stderr
    check = subprocess.run([python, "-m", "app", "--startup-check"], cwd=tmp_path,
                           env={**env, "QT_QPA_PLATFORM": "offscreen",
                                "XDG_CONFIG_HOME": str(tmp_path / "config")}, capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-2000:]
    assert re.search(r"^style sheet: loaded", check.stdout, re.M), check.stdout
    assert re.search(rf"^icon: loaded \({re.escape(str(venv))}/", check.stdout, re.M), check.stdout


def _readme_apt_packages() -> list[str]:
    """The packages of the README's install line, read as .ci/run reads them."""
    line = re.search(r"apt-get install -y ([^&]*)&&", (REPO / "README.md").read_text())
    assert line, "the README's install line has no apt-get install"
    return line.group(1).split()


def test_readme_apt_line_names_every_library_qt_needs_for_the_window():
    assert sorted(_readme_apt_packages()) == sorted(["python3-venv", *display.QT_PACKAGES])
    ci = (REPO / ".ci" / "run").read_text()
    assert "grep -m 1 -o 'apt-get install -y [^&]*' README.md" in ci
    assert "packaging/window_check.sh" in ci


def test_the_x11_plugin_links_no_system_library_outside_the_apt_line():
    """Every library Qt's xcb plugin and the Qt libraries under it link (ELF NEEDED) is either
    bundled with PySide6, part of any Linux (libc, libstdc++, zlib) or in the table the
    README's apt line and doctor's fix are made from."""
    plugin, readelf = display.plugin_path("xcb"), shutil.which("readelf")
    if plugin is None or readelf is None:
        pytest.skip("no PySide6 xcb plugin or no readelf (binutils) here")
    qt_lib = plugin.parents[2] / "lib"
    base = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libz.so.1",
            "libzstd.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1",
            "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
    files = [plugin, *(qt_lib / f"libQt6{name}.so.6"
                       for name in ("XcbQpa", "Gui", "Core", "DBus", "Widgets", "OpenGL"))]
    unknown = set()
    for path in files:
        out = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True,
                             check=True).stdout
        for name in re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out):
            if not (qt_lib / name).exists() and name not in base:
                unknown.add(name)
    assert unknown - set(display.XCB_LIBRARY_PACKAGES) == set()


def test_window_check_is_valid_bash():
    script = REPO / "packaging" / "window_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert os.access(script, os.X_OK)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_every_resource_folder_is_a_package_of_the_wheel():
    """setuptools treats each folder of files as a package and warns (three times in
    `python -m build`) about any its configuration leaves out."""
    import tomllib

    from setuptools import find_namespace_packages

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(find_namespace_packages(where=str(REPO),
                                        include=config["packages"]["find"]["include"]))
    resources = REPO / "hearth_resources"
    folders = {".".join(d.relative_to(REPO).parts) for d in [resources, *resources.rglob("*")]
               if d.is_dir() and "__pycache__" not in d.parts
               and any(f.is_file() for f in d.iterdir())}
    assert folders <= found
    assert folders <= set(config["package-data"])
