"""The text side of a model folder checked before loading: tokenizer.json, tokenizer_config.json,
the chat templates and generation_config.json. Stdlib and jinja2 only (no torch, no tokenizers:
the app imports model_folder); a problem is a PlanError naming the file, one sentence.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from engine.formats.model_shape import PlanError, read_json_file, regular_file

TOKENIZER_MODELS = ("BPE", "WordPiece", "WordLevel", "Unigram")
# the largest real chat templates are tens of KiB, and parsing costs seconds per few hundred:
# a longer one (characters in a JSON file, bytes in a .jinja file) is refused before any work
MAX_TEMPLATE_CHARS = 256 * 2**10


def check_text_files(folder: Path) -> None:
    if (folder / "tokenizer.json").exists():
        _check_tokenizer_json(folder / "tokenizer.json")
    tok_config = {}
    if (folder / "tokenizer_config.json").exists():
        tok_config = _json_object(folder / "tokenizer_config.json")
        if tok_config.get("auto_map"):
            raise PlanError(f"{folder / 'tokenizer_config.json'} asks for remote code (an "
                            "auto_map to the tokenizer's own Python); Hearth never runs code "
                            "from a model folder")
    for source, template in _chat_templates(folder, tok_config):
        check_template(template, source)
    if (folder / "generation_config.json").exists():
        check_generation_config(_json_object(folder / "generation_config.json"),
                                folder / "generation_config.json")


def _json_object(path: Path) -> dict:
    obj = read_json_file(path)
    if not isinstance(obj, dict):
        raise PlanError(f"{path} does not hold a JSON object")
    return obj


def _check_tokenizer_json(path: Path) -> None:
    """The structure the tokenizers library needs; what it alone can judge fails in the loader."""
    tok = _json_object(path)
    model = tok.get("model")
    if not isinstance(model, dict):
        raise PlanError(f"{path} is not a tokenizer: it has no model object")
    kind = model.get("type")
    if kind is not None and kind not in TOKENIZER_MODELS:
        raise PlanError(f"{path} has an unknown tokenizer model type {json.dumps(kind)[:40]}")
    vocab = model.get("vocab")
    if kind == "Unigram" and not isinstance(vocab, list) or kind != "Unigram" and not (
            isinstance(vocab, dict) and all(type(v) is int for v in vocab.values())):
        raise PlanError(f"{path} is malformed: its vocabulary is not a table of token ids")
    added = tok.get("added_tokens", [])
    if not isinstance(added, list) or not all(
            isinstance(t, dict) and type(t.get("id")) is int and isinstance(t.get("content"), str)
            for t in added):
        raise PlanError(f"{path} is malformed: added_tokens is not a list of tokens")


def _chat_templates(folder: Path, tok_config: dict) -> list[tuple[str, str]]:
    """(where it came from, template) for every template transformers would read."""
    found = []
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        found.append((str(jinja), _read_text(jinja)))
    if (folder / "chat_template.json").exists():
        obj = _json_object(folder / "chat_template.json").get("chat_template")
        found += _named(obj, str(folder / "chat_template.json"))
    found += _named(tok_config.get("chat_template"), str(folder / "tokenizer_config.json"))
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        found += [(str(p), _read_text(p)) for p in sorted(extra.glob("*.jinja"))]
    return found


def _named(obj, source: str) -> list[tuple[str, str]]:
    if obj is None:
        return []
    if isinstance(obj, str):
        return [(source, _short(obj, source))]
    if isinstance(obj, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str)
                                     for t in obj):
        return [(f"{source} ({t.get('name')})", _short(t["template"], source)) for t in obj]
    raise PlanError(f"{source} has a chat_template that is neither text nor a list of templates")


def _short(template: str, source: str) -> str:
    if len(template) > MAX_TEMPLATE_CHARS:
        raise PlanError(f"{source} has a chat template of {len(template):,} characters, more "
                        f"than the {MAX_TEMPLATE_CHARS:,} a chat template may have")
    return template


def _read_text(path: Path) -> str:
    try:
        size = regular_file(path).st_size  # stat first: a FIFO must not block
        if size > MAX_TEMPLATE_CHARS:
            raise PlanError(f"{path} is {size:,} bytes, more than the {MAX_TEMPLATE_CHARS:,} a "
                            "chat template may have")
        with path.open("rb") as f:  # no more than the bound, should it grow meanwhile
            return f.read(MAX_TEMPLATE_CHARS + 1).decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"{path} is not valid UTF-8 text") from None
    except OSError as e:
        raise PlanError(f"{path} cannot be read ({e.strerror})") from None


def check_template(template: str, source: str) -> None:
    """Parse as transformers compiles it (sandboxed, loopcontrols, the {% generation %} tag)."""
    from jinja2 import TemplateError, nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):  # transformers' assistant-mask tag: parse only
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, "jinja2.ext.loopcontrols"])
    try:
        env.parse(template)
    except TemplateError as e:
        raise PlanError(f"the chat template in {source} does not parse: "
                        f"{' '.join(str(e).split())}") from None
    except RecursionError:
        raise PlanError(f"the chat template in {source} is nested too deeply to parse") from None


def check_generation_config(gen: dict, path: Path) -> None:
    """Sampling defaults a generation would apply: each must be a value the sampler can take."""
    def number(key: str, ok, rule: str) -> None:
        v = gen.get(key)
        if v is None:
            return
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or (
                not ok(v)):
            raise PlanError(f"{path} has {key} = {json.dumps(v)[:40]}; it must be {rule}")

    number("temperature", lambda v: v >= 0, "a number, 0 or more")
    number("top_p", lambda v: 0 < v <= 1, "a number in (0, 1]")
    number("top_k", lambda v: v >= 0 and v == int(v), "a whole number, 0 or more")
    number("repetition_penalty", lambda v: v > 0, "a number above 0")
    if gen.get("do_sample") is not None and not isinstance(gen["do_sample"], bool):
        raise PlanError(f"{path} has do_sample = {json.dumps(gen['do_sample'])[:40]}; it must be "
                        "true or false")
    eos = gen.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    if eos is not None and not all(type(i) is int and i >= 0 for i in ids):
        raise PlanError(f"{path} has eos_token_id = {json.dumps(eos)[:40]}; it must be a token "
                        "id or a list of them")
