"""`hearth list` and `hearth pull REPO_ID`: the models on this machine with their size, format
and fit (the planner's answer for the first GPU, as the window's picker gives it), and a
download from the Hugging Face Hub with the window's "Get a model" checks and code
(engine/files/hub_listing.py, hub_download.py), its progress on stderr. No torch here."""

from __future__ import annotations

import argparse
import json
import sys

from engine.events import BadRequest
from engine.files.model_catalog import ModelEntry

PROGRESS_STEP = 5  # a progress line every 5% of the download, and at each new file


def add_parsers(sub) -> None:
    ls = sub.add_parser("list", help="the models on this machine: size, format and fit")
    ls.add_argument("--json", action="store_true", help="one JSON object")
    pull = sub.add_parser("pull", help="download a model from the Hugging Face Hub into the "
                          "local cache (safetensors only, checked as the window checks them)")
    pull.add_argument("repo", metavar="REPO_ID", help="org/name, or its huggingface.co address")


def run_list(args: argparse.Namespace) -> int:
    from engine.files.model_catalog import local_entries
    from engine.files.model_home import default_model, models_dir
    from engine.platform.gpu import detect_gpus

    report = detect_gpus()
    gpu = report.gpus[0] if report.gpus else None  # the engine loads on the first GPU
    default = default_model()
    rows = [_row(entry, gpu, entry.load_name == default) for entry in local_entries()]
    if args.json:
        print(json.dumps({"models_dir": str(models_dir()), "gpu": gpu.name if gpu else None,
                          "models": rows}))
        return 0
    table = [("NAME", "SOURCE", "SIZE", "PARAMS", "FORMAT", "FIT")]
    table += [(r["name"] + (" *" if r["default"] else ""), r["source"], r["size"],
               r["params"] or "?", r["format"] or "?", r["fit"]) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    for line in table:
        cells = [cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True)]
        print("  ".join([*cells, line[-1]]))
    where = f"fit on GPU 0 ({gpu.name})" if gpu else "no GPU: the fit is the CPU's"
    print(f"* loads when no --model is given; --model takes a NAME. {where}.\n"
          f"Hearth's models folder: {models_dir()}; `hearth pull ORG/NAME` downloads a model.",
          file=sys.stderr)
    return 0


def _row(entry: ModelEntry, gpu, is_default: bool) -> dict:
    """One model: what --model takes, its size on disk, format, parameters and fit."""
    from engine.files.model_catalog import count_text, formats_present, size_on_disk, size_text
    from engine.plan import memory as planner

    size = size_on_disk(entry.folder)
    row = {"name": entry.load_name or str(entry.folder), "source": entry.source,
           "folder": str(entry.folder), "size_bytes": size, "size": size_text(size),
           "default": is_default, "architecture": None, "num_params": None, "params": None,
           "format": None, "fits": None, "quant": None, "context": None}
    if entry.source == "imported":
        row["name"] = entry.label  # a name in the models folder: what --model takes
    try:
        shape = planner.ModelShape.from_folder(entry.folder)
        rec = planner.recommend(shape, gpu.free_bytes if gpu else None,
                                gpu.compute_capability if gpu else None)
    except (planner.PlanError, ValueError, OSError) as e:
        row["fit"] = f"unreadable: {' '.join(str(e).split())}"
        return row
    row.update(architecture=shape.model_type, num_params=shape.total_params,
               params=count_text(shape.total_params),
               format="+".join(formats_present(entry.folder, shape)), fits=rec.fits,
               quant=rec.quant, context=rec.context)
    if shape.refusal:  # the planner sizes it, the loader refuses it
        row["fit"] = f"does not load: {shape.refusal}"
    elif rec.fits is None:
        row["fit"] = f"CPU: {rec.quant}, {rec.context:,} tokens"
    elif rec.fits:
        row["fit"] = f"fits: {rec.quant}, {rec.context:,} tokens"
    else:
        row["fit"] = f"does not fit (needs {rec.min_vram_bytes / planner.GiB:.1f} GiB)"
    return row


def run_pull(args: argparse.Namespace) -> int:
    from engine.files import hub_download
    from engine.files.hub_listing import HubError, RepoRefused, fetch_listing, parse_repo_id
    from engine.files.model_catalog import size_text
    from engine.files.model_home import hub_cache_dir

    try:
        repo_id = parse_repo_id(args.repo)
        print(f"asking the Hub about {repo_id}", file=sys.stderr, flush=True)
        listing = fetch_listing(repo_id)
        if not listing.is_supported:
            raise RepoRefused(f"{listing.architecture} is not an architecture Hearth runs, so "
                              f"{repo_id} was not downloaded")
        print(f"{repo_id}: {size_text(listing.total_bytes)} in {len(listing.files)} files"
              + (f" ({listing.num_skipped_files} others, in other formats, left out)"
                 if listing.num_skipped_files else ""), file=sys.stderr, flush=True)
        snapshot = hub_download.download(listing, hub_cache_dir(), _Progress(),
                                         lambda: False)
    except RepoRefused as e:
        raise BadRequest(str(e)) from None
    except HubError as e:
        print(f"hearth: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nstopped; what arrived is kept, and `hearth pull {args.repo}` continues it",
              file=sys.stderr)
        return 130
    print(f"downloaded {repo_id} into {snapshot}; chat with it: hearth chat --model {repo_id}",
          file=sys.stderr)
    return 0


class _Progress:
    """A line on stderr at each new file and every PROGRESS_STEP percent of the bytes."""

    def __init__(self) -> None:
        self.shown: tuple[int, int] | None = None  # (file, percent step) last printed

    def __call__(self, p) -> None:
        from engine.files.model_catalog import size_text

        percent = 100 * p.done_bytes // max(p.total_bytes, 1)
        at = (p.num_files_done, percent // PROGRESS_STEP)
        if at == self.shown or p.num_files_done >= p.num_files:
            return
        self.shown = at
        print(f"[{p.num_files_done + 1}/{p.num_files}] {p.file_name}: "
              f"{size_text(p.done_bytes)} of {size_text(p.total_bytes)} ({percent}%)",
              file=sys.stderr, flush=True)
