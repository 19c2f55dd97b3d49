"""Speculative decoding: draft model and prompt-lookup proposers, verify (under a request's
grammar too: constrained_verify.py), the controller."""
