"""`hearth bench`: batch-1 decode against its references, speculative decoding, many requests
at once."""
