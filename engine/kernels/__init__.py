"""Triton kernels, which one runs here, and the PyTorch math they match bit for bit."""
