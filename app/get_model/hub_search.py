"""Hub search by keyword: the models whose id holds the words, most downloaded first, with their
downloads and the size of their safetensors weights per dtype, before anything is fetched. The
same query as huggingface_hub's `list_models(search=..., sort="downloads")`, read through
hub_listing's bounded GET (a hostile or broken answer never fills memory), and checked here.
Blocking: model_download.py runs it off the GUI thread."""

from __future__ import annotations

from dataclasses import dataclass

from engine.files.hub_listing import (
    REPO_ID,
    HubError,
    _host,
    _json,
    endpoint,
    explain,
    get_bounded,
)

MAX_RESULTS = 20
MAX_QUERY_CHARS = 100
MAX_SEARCH_BYTES = 4 << 20  # 20 models' info is some kB
# bytes per parameter of the dtypes the Hub counts in "safetensors.parameters"
DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
               "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class HubModel:
    repo_id: str
    downloads: int
    likes: int
    num_params: int  # 0 where the Hub did not count them
    weights_bytes: int  # the safetensors weights' size from the parameter counts; 0: unknown
    dtypes: tuple[str, ...]  # the stored dtypes, most parameters first ("BF16", ...)


def search_models(query: str, limit: int = MAX_RESULTS) -> tuple[HubModel, ...]:
    """Raises HubError with one sentence."""
    query = " ".join(query.split())
    if not query:
        raise HubError("type a few words of a model's name to search the Hub")
    if len(query) > MAX_QUERY_CHARS:
        raise HubError(f"a search is at most {MAX_QUERY_CHARS} characters")
    params = {"search": query, "sort": "downloads", "direction": "-1", "limit": str(limit),
              "filter": "safetensors", "expand[]": ["downloads", "likes", "safetensors"]}
    try:
        raw = get_bounded(f"{endpoint() or 'https://huggingface.co'}/api/models",
                          MAX_SEARCH_BYTES, f"the search for {query!r}", params=params)
    except HubError:
        raise
    except Exception as e:
        raise HubError(explain(e, query)) from e
    found = _json(raw, f"the search for {query!r}")
    if not isinstance(found, list):
        raise HubError(f"{_host()} answered the search with something that is not a list")
    return tuple(m for m in (_model(item) for item in found[:limit]) if m is not None)


def _model(item) -> HubModel | None:
    """One search result, or None for an entry of the wrong shape (skipped, not trusted)."""
    if not isinstance(item, dict):
        return None
    repo_id = item.get("id") or item.get("modelId")
    if not isinstance(repo_id, str) or not REPO_ID.fullmatch(repo_id) or "--" in repo_id:
        return None
    safetensors = item.get("safetensors") if isinstance(item.get("safetensors"), dict) else {}
    counts = safetensors.get("parameters") if isinstance(safetensors.get("parameters"),
                                                         dict) else {}
    counts = {k: v for k, v in counts.items() if isinstance(k, str) and _count(v)}
    dtypes = tuple(sorted(counts, key=lambda k: -counts[k]))
    return HubModel(repo_id, _count(item.get("downloads")), _count(item.get("likes")),
                    sum(counts.values()),
                    sum(n * DTYPE_BYTES.get(k.upper(), 2) for k, n in counts.items()), dtypes)


def _count(v) -> int:
    return v if type(v) is int and 0 <= v < 2**53 else 0
