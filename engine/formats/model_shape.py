"""A model's shape from config.json, refined by its safetensors headers: what the planner counts.

Pure stdlib (no torch): the Qt app imports it through the planner.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from engine.formats import families, loadable, weights
from engine.formats.families import gemma

AWQ_GROUP = weights.AWQ_GROUP
# bits per element of every safetensors dtype (F4 and F6 pack below a byte)
_ST_BITS = {"F64": 64, "F32": 32, "F16": 16, "BF16": 16, "I64": 64, "U64": 64, "I32": 32,
            "U32": 32, "I16": 16, "U16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8,
            "F8_E5M2": 8, "F8_E8M0": 8, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4, "C64": 64}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
MAX_JSON_BYTES = 64 * 2**20  # a config or tokenizer file larger than this is not one
# far above any real model: a config past these is broken, and would allocate absurd tensors
MAX_SIZES = {"hidden_size": 1 << 18, "num_hidden_layers": 1 << 12,
             "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14, "head_dim": 1 << 14,
             "intermediate_size": 1 << 21, "vocab_size": 1 << 24,
             "max_position_embeddings": 1 << 30}
# a float dtype as config.json ("bfloat16"), safetensors ("BF16") or Hearth ("bf16") spells it
_DTYPES = {alias: f.name for f in weights.floats()
           for alias in (f.torch_dtype, f.safetensors_dtype, f.name)}
# a model_type no family names is sized like Llama: gated MLP, untied, no hidden biases or norms
_LLAMA_LIKE = families.Family("", "")


class PlanError(ValueError):
    """Bad input (folder, config, settings): one sentence for the user."""


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    sliding_window: int | None  # only when in force (shorter than the native context)
    native_dtype: str  # "bf16" | "fp16" | "fp32"
    linears: tuple[tuple[int, int, int], ...]  # (out, in, count) of the quantizable Linear layers
    embed_params: int
    lm_head_params: int  # 0 when tied to the embedding: counted once
    other_params: int  # norms and biases: 16-bit in every format
    quant_method: str | None = None  # the checkpoint's own format: "awq", "nf4" or "int8"
    quant_group_size: int | None = None
    double_quant: bool | None = None
    param_source: str = "config"  # or "safetensors"
    checkpoint_bytes: int | None = None
    refusal: str | None = None  # why the loader refuses it (formats/loadable); None: it loads
    # a mixture of experts: routed experts a layer, how many a token reads, and their linears
    # (out, in, count over every expert and layer; also in `linears`)
    num_experts: int = 0
    experts_per_token: int = 0
    expert_linears: tuple[tuple[int, int, int], ...] = ()
    # a family that masks its local layers (Gemma 2, 3): how many attend within a window, and
    # the window (the cache keeps only a ring of blocks for them: cache/sliding_pool.py)
    local_layers: int = 0
    local_window: int | None = None

    @property
    def total_params(self) -> int:
        return self.embed_params + self.lm_head_params + self.other_params + sum(
            o * i * n for o, i, n in self.linears)

    @property
    def context_limit(self) -> int:
        return min(self.max_position_embeddings, self.sliding_window or math.inf)

    @classmethod
    def from_config(cls, cfg: dict) -> ModelShape:
        if not isinstance(cfg, dict):
            raise PlanError("config.json does not hold a JSON object")
        text = cfg.get("text_config")
        c = {**cfg, **text} if isinstance(text, dict) else cfg  # multimodal wrappers

        def num(*keys, default=None) -> int:
            for k in keys:
                v = c.get(k)
                if v is None:
                    continue
                if not isinstance(v, int) or isinstance(v, bool):  # "64", 64.5, true: broken
                    raise PlanError(f"config.json has {k} = {json.dumps(v)[:40]}; it must be a "
                                    "whole number")
                if v <= 0:
                    raise PlanError(f"config.json has {k} = {v}; it must be positive")
                limit = MAX_SIZES.get(keys[0])
                if limit is not None and v > limit:
                    raise PlanError(f"config.json has {k} = {v:,}, more than any model has "
                                    f"(at most {limit:,})")
                return v
            if default is None:
                raise PlanError(f"config.json has no {keys[0]}, so the model's size is unknown")
            return default

        mt = str(c.get("model_type") or "unknown")
        fam = families.planned_as(mt) or _LLAMA_LIKE
        hidden = num("hidden_size", "n_embd", "d_model")
        layers = num("num_hidden_layers", "n_layer", "num_layers")
        heads = num("num_attention_heads", "n_head")
        kv = num("num_key_value_heads", "num_kv_heads",
                 default=1 if c.get("multi_query") else heads)
        if c.get("head_dim") is None and hidden % heads:
            raise PlanError(f"config.json has hidden_size {hidden}, which {heads} attention "
                            "heads do not divide (and no head_dim)")
        hd = num("head_dim", default=hidden // heads)  # explicit head_dim wins (Qwen3, Gemma)
        if kv > heads or heads % kv:
            raise PlanError(f"config.json has {heads} attention heads and {kv} KV heads; the KV "
                            "heads must divide the attention heads")
        inter = num("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
        vocab = num("vocab_size")
        max_pos = num("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                      default=2048)
        window = c.get("sliding_window")
        on = c.get("use_sliding_window") is not False  # Qwen2.5 ships a window switched off
        if on and window is not None and (not isinstance(window, int) or isinstance(
                window, bool) or window <= 0):  # the cache would be capped at it
            raise PlanError(f"config.json has sliding_window = {json.dumps(window)[:40]}; it "
                            "must be a positive whole number (or null, or use_sliding_window "
                            "false)")
        # a family that masks its local layers (sliding_layers) runs past the window
        in_force = on and isinstance(window, int) and window < max_pos and not fam.sliding_layers
        q, k = heads * hd, kv * hd
        mlp = ((inter, hidden, 2), (hidden, inter, 1)) if fam.gated_mlp else (
            (inter, hidden, 1), (hidden, inter, 1))
        spec, n_exp, top_k, router = fam.experts, 0, 0, 0
        if spec is not None:  # every expert's gate, up and down; the router stays 16-bit
            n_exp, top_k, width = (num(*spec.count_keys), num(spec.top_k_key),
                                   num(spec.intermediate_key))
            mlp, router = ((width, hidden, 2 * n_exp), (hidden, width, n_exp)), n_exp * hidden
        lin: dict[tuple[int, int], int] = {}
        for o, i, n in ((q, hidden, 1), (k, hidden, 2), (hidden, q, 1), *mlp):
            lin[(o, i)] = lin.get((o, i), 0) + n * layers
        # a family's unstated q/k/v biases (Qwen2); Llama-style attention_bias covers o too
        bias = q + 2 * k if fam.qkv_bias else (q + 2 * k + hidden) * bool(c.get("attention_bias"))
        bias += sum(o * n for o, _, n in mlp) if c.get("mlp_bias") else 0
        norms = fam.layer_norms * hidden + (2 * hd if fam.qk_norm else 0) + router  # a layer's
        local = gemma.local_layers(c, layers) if fam.sliding_layers and isinstance(
            window, int) and not isinstance(window, bool) and window > 0 else 0
        tied = bool(c.get("tie_word_embeddings", cfg.get("tie_word_embeddings",
                                                          fam.tied_by_default)))
        qc = cfg.get("quantization_config") or c.get("quantization_config") or {}
        method, group, dq = _quant_method(qc)
        return cls(mt, hidden, layers, heads, kv, hd, inter, vocab, tied, max_pos,
                   window if in_force else None,
                   _DTYPES.get(str(c.get("dtype") or c.get("torch_dtype") or cfg.get("dtype")
                                   or cfg.get("torch_dtype")), "fp32"),  # HF's default: fp32
                   tuple((o, i, n) for (o, i), n in lin.items()), vocab * hidden,
                   0 if tied else vocab * hidden, layers * (norms + bias) + hidden,
                   method, group, dq, refusal=loadable.refusal(cfg), num_experts=n_exp,
                   experts_per_token=top_k,
                   expert_linears=tuple((o, i, n * layers) for o, i, n in mlp) if n_exp else (),
                   local_layers=local, local_window=window if local else None)

    @classmethod
    def from_folder(cls, path: str | Path) -> ModelShape:
        p = Path(path).expanduser()
        if not p.is_dir():
            raise PlanError(f"{p} is not a model folder" if p.exists() else f"{p} does not exist")
        cfg_path = p / "config.json"
        if not os.path.lexists(cfg_path):
            raise PlanError(f"{p} has no config.json, so it is not a Hugging Face model folder")
        shape = cls.from_config(read_json_file(cfg_path))
        tensors: dict[str, tuple[str, list[int]]] = {}
        for f in sorted(p.glob("*.safetensors")):
            tensors.update(read_safetensors_header(f, whole_file=False)[0])
        return shape._refined(tensors) if tensors else shape

    def _refined(self, tensors: dict[str, tuple[str, list[int]]]) -> ModelShape:
        """Exact counts from the checkpoint's own tensors (bnb-packed shapes are not readable)."""
        nbytes = {dt: 0 for dt in _ST_BITS}
        for dt, shp in tensors.values():
            nbytes[dt] = nbytes.get(dt, 0) + math.prod(shp) * _ST_BITS.get(dt, 0) // 8
        ckpt = replace(self, checkpoint_bytes=sum(nbytes.values()))
        if self.quant_method and weights.get(self.quant_method).packed_shapes:
            return ckpt
        embed = lm = other = 0
        lin: dict[tuple[int, int], int] = {}
        moe: dict[tuple[int, int], int] = {}  # the experts' (one linear a projection an expert)
        for name, (_, shp) in tensors.items():
            n = math.prod(shp)
            if ".experts." in name and len(shp) == 2 and name.endswith(".weight"):
                moe[(shp[0], shp[1])] = moe.get((shp[0], shp[1]), 0) + 1
            if name.endswith((".scales", ".qzeros", ".g_idx")):
                continue  # AWQ side tensors: the format arithmetic counts them
            if name.endswith(".qweight") and len(shp) == 2:  # AWQ: [in, out / 8] int32
                lin[(shp[1] * 8, shp[0])] = lin.get((shp[1] * 8, shp[0]), 0) + 1
            elif name.endswith(("embed_tokens.weight", "wte.weight", "word_embeddings.weight")):
                embed += n
            elif name.split(".")[-2:-1] == ["lm_head"]:
                lm += n
            elif len(shp) == 2 and name.endswith(".weight") and not any(
                    s in name for s in ("norm", "vision", "visual", ".gate.weight")):
                lin[(shp[0], shp[1])] = lin.get((shp[0], shp[1]), 0) + 1
            else:
                other += n
        if not embed or not lin:
            return ckpt  # names we do not know: keep the config's arithmetic
        tied = self.tie_word_embeddings or lm == 0
        floats = {d: nbytes[d] for d in ("BF16", "F16", "F32")}
        native = self.native_dtype if self.quant_method else _DTYPES[max(floats, key=floats.get)]
        return replace(ckpt, linears=tuple((o, i, n) for (o, i), n in lin.items()),
                       embed_params=embed, lm_head_params=0 if tied else lm, other_params=other,
                       tie_word_embeddings=tied, native_dtype=native, param_source="safetensors",
                       expert_linears=tuple((o, i, n) for (o, i), n in moe.items()))


def _quant_method(qc: dict) -> tuple[str | None, int | None, bool | None]:
    method = str(qc.get("quant_method", "")).lower() if isinstance(qc, dict) else ""
    if not method:
        return None, None, None
    if method == "awq":
        if (qc.get("bits") or qc.get("w_bit") or 4) != 4:
            raise PlanError("this AWQ checkpoint is not 4-bit; Hearth plans 4-bit AWQ only")
        return "awq", int(qc.get("group_size") or qc.get("q_group_size") or AWQ_GROUP), None
    if method == "bitsandbytes":
        if qc.get("load_in_4bit"):
            return "nf4", None, bool(qc.get("bnb_4bit_use_double_quant", False))
        return "int8", None, None
    raise PlanError(f"the checkpoint is quantized with {method}; Hearth loads bf16/fp16/fp32, "
                    "bitsandbytes and AWQ checkpoints")


def regular_file(path: Path) -> os.stat_result:
    """stat before open: a folder or a FIFO named like a model file must fail, never block."""
    try:
        st = path.stat()
    except OSError as e:
        raise PlanError(f"{path} cannot be read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise PlanError(f"{path} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise PlanError(f"{path} is not a regular file (a pipe or a device?)")
    return st


def read_json_file(path: Path, max_bytes: int = MAX_JSON_BYTES) -> object:
    """A model folder's JSON file (config, tokenizer, generation config); PlanError names it."""
    st = regular_file(path)
    if st.st_size > max_bytes:
        raise PlanError(f"{path} is {st.st_size:,} bytes, too large for a {path.name}")
    try:
        with path.open("rb") as f:
            text = f.read(max_bytes + 1).decode("utf-8")
        return json.loads(text)
    except OSError as e:
        raise PlanError(f"{path} cannot be read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise PlanError(f"{path} is not valid UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{path} is not valid JSON ({e})") from None
    except RecursionError:
        raise PlanError(f"{path} is not valid JSON (nested too deeply)") from None


def read_safetensors_header(path: Path, whole_file: bool = True
                            ) -> tuple[dict[str, tuple[str, list[int]]], int]:
    """8-byte little-endian header length, then a JSON header: {name: {dtype, shape,
    data_offsets}}. Every entry is checked without reading the data, and (`whole_file`) against
    the file's size; the planner reads headers only, so it plans from a header alone.
    -> ({name: (dtype, shape)}, bytes of tensor data); a PlanError names the file."""
    name = path.name
    size = regular_file(path).st_size
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise PlanError(f"{name} is truncated (shorter than a safetensors header)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_HEADER_BYTES):  # a header is never past the end
                raise PlanError(f"{name} is corrupt or truncated (its safetensors header runs "
                                "past the end)")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise PlanError(f"{path} cannot be read ({e.strerror})") from None
    except (ValueError, RecursionError):  # JSON and UTF-8 errors
        raise PlanError(f"{name} is corrupt (its safetensors header is not JSON)") from None
    if not isinstance(header, dict):
        raise PlanError(f"{name} is corrupt (its safetensors header is not an object)")
    tensors, end, data = {}, 0, size - 8 - n
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        dtype, shape, offsets = _tensor_entry(name, key, meta)
        begin, stop = offsets
        need = math.prod(shape) * _ST_BITS[dtype]
        if need != 8 * (stop - begin):
            raise PlanError(f"{name} is corrupt: tensor {key} of shape {shape} needs "
                            f"{-(-need // 8):,} bytes but its offsets hold {stop - begin:,}")
        tensors[key] = (dtype, shape)
        end = max(end, stop)
    if whole_file and end > data:
        raise PlanError(f"{name} is truncated: its header promises {8 + n + end} bytes but the "
                        f"file has {size}; download it again")
    return tensors, end


def _tensor_entry(name: str, key: str, meta) -> tuple[str, list[int], list[int]]:
    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(meta, dict):
        raise PlanError(f"{name} is corrupt (tensor {key} has no dtype, shape and offsets)")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if dtype not in _ST_BITS:
        raise PlanError(f"{name} is corrupt: tensor {key} has an unknown dtype "
                        f"{json.dumps(dtype)[:40]}")
    if not isinstance(shape, list) or not all(whole(d) for d in shape):
        raise PlanError(f"{name} is corrupt: tensor {key} has a shape that is not a list of "
                        "whole numbers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(whole(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise PlanError(f"{name} is corrupt: tensor {key} has data offsets "
                        f"{json.dumps(offsets)[:60]}; they must be two increasing byte offsets")
    return dtype, shape, offsets
