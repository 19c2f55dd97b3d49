"""The OpenAI-compatible server as the window shows it: the Server panel over the worker."""
