"""Continuous batching: sequences in one shared paged arena, the scheduler that fills a step,
a step's tokens while they are still on the device, and the speculative requests' verify rows
beside the plain ones."""
