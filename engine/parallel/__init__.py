"""Tensor parallelism across GPUs of one host."""
