"""Speculative decoding: draft model and prompt-lookup proposers, verify, the controller."""
