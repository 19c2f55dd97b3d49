"""The engine's configuration: backend settings (backends.py), the developer overrides read from
the environment in one place (overrides.py), and the EngineConfig a load resolves once."""
