"""Tests of `hearth serve`, the OpenAI-compatible server (engine/server)."""
