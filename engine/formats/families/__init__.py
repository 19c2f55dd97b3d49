"""The model families, one registry entry each (one file where a family has quirks): what
config.json and GGUF call it, its transformers classes, the module names the fast path, tensor
parallelism and AWQ read, and what the planner must know. No torch: the app may import it."""

from engine.formats.families import gemma, generic, llama, phi, planned, qwen
from engine.formats.families.registry import (
    ARCHITECTURES,
    GGUF_ARCHITECTURES,
    Family,
    ModuleNames,
    SamplingPreset,
    awq_types,
    by_architecture,
    fast_path_types,
    get,
    listing,
    planned_as,
    register,
    registered,
    tensor_parallel_types,
    unregister,
)

# in the order messages list them; a test registers its own family beside them
for _module in (llama, qwen, gemma, phi, generic, planned):
    for _family in _module.FAMILIES:
        register(_family)

__all__ = ["ARCHITECTURES", "GGUF_ARCHITECTURES", "Family", "ModuleNames", "SamplingPreset",
           "awq_types", "by_architecture", "fast_path_types", "get", "listing", "planned_as",
           "register", "registered", "tensor_parallel_types", "unregister"]
