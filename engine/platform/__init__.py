"""The machine: GPU detection (NVML), memory readings, child-process environment, library noise."""
