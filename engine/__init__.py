"""Hearth's engine: loading, planning, decoding; no Qt (the app talks to it in JSON lines)."""

# torch's CPU threads: one per physical core (child_env.thread_policy), for
# this process where torch is not imported yet and for every process it starts (the app's worker).
# torch's CUDA allocator settings are not set here: child_env puts them into every process the
# engine or the app starts, and a load sets them in its own process before CUDA starts
# (platform/allocator.py)
from engine.platform.child_env import apply_thread_policy
from engine.platform.library_noise import hush

apply_thread_policy()
hush()  # third-party notes stay off the terminal and the app's log unless HEARTH_DEBUG=1
