"""Gather the demo corpus once: Python standard-library docstrings, split and saved compressed.

Run by hand (not by the recipe) with a CPython that ships its .py sources:
    python3 packaging/demo_model/gather.py
It writes corpus/{train,valid,heldout}.jsonl.xz and heldout.txt, which are committed, so training
never depends on the Python it runs under. Everything gathered is under the PSF license
(PSF-LICENSE.txt beside this file).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import lzma
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import shape  # noqa: E402

MIN_DOC_CHARS, MAX_DOC_CHARS = 40, 6000
HELDOUT_FRACTION, VALID_FRACTION = 0.025, 0.02
# test suites, GUI demos and vendored wheels are not documentation
SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "turtledemo",
              "__phello__", "_bundled", "__pycache__"}
# public modules implemented (partly) in C: their docstrings live in the objects, not in .py files
C_MODULES = ("builtins", "math", "cmath", "itertools", "sys", "time", "os", "array", "select",
             "zlib", "binascii", "struct", "unicodedata", "gc", "marshal", "atexit", "fcntl",
             "grp", "pwd", "resource", "termios", "mmap", "io", "functools", "collections",
             "operator", "heapq", "bisect", "signal", "socket", "datetime", "decimal", "hashlib",
             "pickle", "csv", "re", "sqlite3", "json", "random", "errno", "_thread", "codecs",
             "weakref", "contextvars", "queue", "statistics", "zoneinfo", "lzma", "bz2")


# pure-Python twins of public modules: named as users import them
MODULE_ALIASES = {"_pydecimal": "decimal", "_pyio": "io", "_collections_abc": "collections.abc",
                  "posixpath": "os.path"}


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    parts[0] = MODULE_ALIASES.get(parts[0], parts[0])
    return ".".join(parts)


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> str:
    args = node.args
    if is_method and args.posonlyargs + args.args:
        first = (args.posonlyargs + args.args)[0].arg
        if first in ("self", "cls", "mcs", "metacls"):
            args = ast.arguments(**{**args.__dict__})
            if args.posonlyargs:
                args.posonlyargs = args.posonlyargs[1:]
            else:
                args.args = args.args[1:]
    return f"({ast.unparse(args)})"


def _walk(tree: ast.Module, module: str):
    """(name, kind, signature, doc) for the module, its classes, functions and methods."""
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        yield module, "module", "", doc

    def visit(body, prefix: str, in_class: bool):
        for node in body:
            if isinstance(node, ast.ClassDef):
                name = f"{prefix}.{node.name}"
                doc = ast.get_docstring(node, clean=True)
                if doc:
                    yield name, "class", "", doc
                yield from visit(node.body, name, True)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc:
                    kind = "method" if in_class else "function"
                    yield f"{prefix}.{node.name}", kind, _signature(node, in_class), doc

    yield from visit(tree.body, module, False)


def python_docstrings(stdlib: Path):
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if SKIP_PARTS & set(rel.parts) or rel.name.startswith("test_"):
            continue
        if rel.parts[0].startswith("config-"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        yield from _walk(tree, _module_name(rel))


def _is_c(obj) -> bool:
    try:
        inspect.getsourcefile(obj)
    except TypeError:  # "is a built-in ...": no Python source, so the AST pass missed it
        return True
    return False


def _c_signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def c_docstrings():
    for module_name in C_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        shown = module_name.lstrip("_")
        for attr in sorted(dir(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr)
            if not callable(obj) or not _is_c(obj):
                continue
            doc = inspect.getdoc(obj)
            if doc:
                kind = "class" if isinstance(obj, type) else "function"
                yield f"{shown}.{attr}", kind, _c_signature(obj), doc
            if isinstance(obj, type):
                for meth in sorted(vars(obj)):
                    m = getattr(obj, meth, None)
                    if meth.startswith("_") or not callable(m) or not _is_c(m):
                        continue
                    doc = inspect.getdoc(m)
                    if doc:
                        yield f"{shown}.{attr}.{meth}", "method", _c_signature(m), doc


def reference_topics():
    """The language reference sections that `help('for')` shows (pydoc_data.topics)."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield key, "topic", "", inspect.cleandoc(topics[key])


def split_of(doc: str) -> str:
    """Docstrings that share a first line (copies across io/_pyio, say) land in one split."""
    first = doc.strip().splitlines()[0].strip().lower()
    u = int.from_bytes(hashlib.sha256(first.encode()).digest()[:8], "big") / 2**64
    if u < HELDOUT_FRACTION:
        return "heldout"
    return "valid" if u < HELDOUT_FRACTION + VALID_FRACTION else "train"


def main() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    splits: dict[str, list[dict]] = {"train": [], "valid": [], "heldout": []}
    sources = (reference_topics(), python_docstrings(stdlib), c_docstrings())
    for source in sources:
        for name, kind, signature, doc in source:
            if not MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS or doc in seen:
                continue
            seen.add(doc)
            splits[split_of(doc)].append(
                {"name": name, "kind": kind, "signature": signature, "doc": doc})
    out = HERE / "corpus"
    out.mkdir(exist_ok=True)
    for split, records in splits.items():
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        # fixed preset and no timestamp-dependent header: the same input gives the same bytes
        (out / f"{split}.jsonl.xz").write_bytes(lzma.compress(lines.encode(), preset=9))
        print(f"{split}: {len(records)} records, {sum(len(r['doc']) for r in records)} chars")
    text = shape.join(shape.documents(splits["heldout"], seed=0))
    (HERE / "heldout.txt").write_text(text, encoding="utf-8")
    print(f"heldout.txt: {len(text)} chars; gathered from Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
