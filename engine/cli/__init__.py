"""The entry points: the `hearth` command line, the worker process, the terminal chat, the
model list and downloads."""
