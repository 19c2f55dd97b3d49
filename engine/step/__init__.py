"""One decode step: the decoder, CUDA graph capture, sampling."""
