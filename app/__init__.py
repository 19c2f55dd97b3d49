"""Hearth's desktop front end (PySide6), one package per concern. It talks to the engine only
through the worker process and the torch-free engine modules (events, plan, platform.gpu, remote,
files): what a model needs and may run is the planner's answer, asked, never restated."""
