"""Third-party start-up noise kept off the user's terminal and the app's log (HEARTH_DEBUG=1 shows
it), and torchao (which gptqmodel, the `[awq]` extra, brings) left unimported on a plain load."""

from __future__ import annotations

import logging
import sys

from engine.config import overrides

# loggers whose warnings are notes to library developers, not to a Hearth user: torchao's
# "Failed to load _C_mxfp8..." (kernels for GPUs this build has no code for), torch's pytree
# "Enum subclass ... register_constant()" notices (torchao registers enums), bitsandbytes'
# "MatMul8bitLt: inputs will be cast from ..." and its missing-GPU-library notes, and Hugging
# Face's `kernels` (a transformers dependency since 5.2x): "Skipping publisher trust check for
# 'kernels-community/quantization-bitsandbytes' because Hugging Face Hub is in offline mode"
NOISY_LOGGERS = ("torchao", "torch.utils._pytree", "bitsandbytes", "kernels")


def is_debug() -> bool:
    return overrides.debug()


def hush() -> None:
    """Raise the noisy loggers to ERROR, unless HEARTH_DEBUG is on. Idempotent."""
    if is_debug():
        return
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def skip_torchao() -> None:
    """Tell transformers that torchao is not installed, so a load does not import it (seconds on
    a small CPU, and its noise): Hearth reads no torchao checkpoint. transformers' quantizer
    registry imports torchao whenever it is installed; this runs before that registry loads.
    A process that has imported torchao already (gptqmodel in use) is left as it is."""
    if "torchao" in sys.modules or "transformers.quantizers.auto" in sys.modules:
        return
    import transformers.utils
    import transformers.utils.import_utils as import_utils

    def unavailable(*args, **kwargs) -> bool:
        return False

    for module in (import_utils, transformers.utils):
        if hasattr(module, "is_torchao_available"):
            module.is_torchao_available = unavailable
