"""The engine worker process: the client that talks to it, and what it costs (GPU and CPU usage)."""
