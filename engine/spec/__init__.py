"""Speculative decoding: draft model and prompt-lookup proposers (a draft drafts for a batch's
rows at once: draft_rows.py), verify (under a request's grammar too: constrained_verify.py), the
controller."""
