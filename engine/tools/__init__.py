"""Commands over the engine: bench, eval, quantize, doctor, plan reports, desktop entry."""
