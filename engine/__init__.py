"""Hearth's engine: loading, planning, decoding; no Qt (the app talks to it in JSON lines)."""

import os

# torch's CUDA allocator, unless the user chose its settings: expandable segments can hand freed
# pages back (fusing q/k/v and gate/up frees the unfused weights' blocks), and the VRAM planner
# was validated with them (BENCHMARKS.md). Set here, before any engine module imports torch;
# the worker and the tensor-parallel processes inherit it.
if "PYTORCH_ALLOC_CONF" not in os.environ:
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

# torch's CPU threads: one per physical core, waiting passively (child_env.thread_policy), for
# this process where torch is not imported yet and for every process it starts (the app's worker)
from engine.platform.child_env import apply_thread_policy  # noqa: E402 (after the settings above)
from engine.platform.library_noise import hush  # noqa: E402

apply_thread_policy()
hush()  # third-party notes stay off the terminal and the app's log unless HEARTH_DEBUG=1
