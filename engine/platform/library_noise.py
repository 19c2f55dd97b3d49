"""Third-party start-up noise kept off the user's terminal and the app's log (HEARTH_DEBUG=1 shows
it), and torchao (which gptqmodel, the `[awq]` extra, brings) left unimported on a plain load."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from engine.config import overrides

# loggers whose warnings are notes to library developers, not to a Hearth user: torchao's
# "Failed to load _C_mxfp8..." (kernels for GPUs this build has no code for), torch's pytree
# "Enum subclass ... register_constant()" notices (torchao registers enums), bitsandbytes'
# "MatMul8bitLt: inputs will be cast from ..." and its missing-GPU-library notes, and Hugging
# Face's `kernels` (a transformers dependency since 5.2x): "Skipping publisher trust check for
# 'kernels-community/quantization-bitsandbytes' because Hugging Face Hub is in offline mode"
NOISY_LOGGERS = ("torchao", "torch.utils._pytree", "bitsandbytes", "kernels")
# transformers' warning, given once a tokenizer, that a text is longer than model_max_length:
# Hearth measures every prompt against the context it loaded and refuses one in its own sentence
LONG_TEXT_WARNING = "sequence-length-is-longer-than-the-specified-maximum"
# where transformers prints a load's report (a table of missing and unexpected weights)
LOAD_REPORT_LOGGER = "transformers.modeling_utils"
LOAD_REPORT = "LOAD REPORT"  # in the report's first line
# report lines that come before transformers' own error ("look at the above report"): kept
LOAD_REPORT_ERRORS = ("MISMATCH", "CONVERSION")


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


def quiet_tokenizer(tokenizer) -> None:
    """Mark transformers' over-long-text warning as given on this tokenizer (HEARTH_DEBUG=1
    leaves it on), so it never comes before Hearth's sentence about a prompt too long."""
    given = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(given, dict) and not is_debug():
        given[LONG_TEXT_WARNING] = True


@contextmanager
def quiet_load_report() -> Iterator[None]:
    """transformers' load report held back during a load: the loader reads the same report
    (output_loading_info) and refuses a missing weight in one sentence of its own; unexpected
    weights are notes. A report that transformers' own error points to stays. A filter, not a
    level: transformers runs extra checks, with warnings of their own, when its logger's level
    is raised."""
    logger = logging.getLogger(LOAD_REPORT_LOGGER)
    report = _LoadReport()
    if not is_debug():
        logger.addFilter(report)
    try:
        yield
    finally:
        logger.removeFilter(report)


class _LoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return LOAD_REPORT not in text or any(word in text for word in LOAD_REPORT_ERRORS)
