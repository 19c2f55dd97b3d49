"""The engine as a service: one thread owns the model; every front end queues requests on it."""
