"""Continuous batching: sequences in one shared paged arena, the scheduler that fills a step, and
a step's tokens while they are still on the device."""
