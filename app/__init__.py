"""Hearth's desktop front end (PySide6). It talks to the engine only through the worker process
and the torch-free engine modules `engine.events`, `engine.plan.memory` and
`engine.platform.gpu`."""
