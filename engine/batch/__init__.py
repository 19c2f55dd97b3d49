"""Continuous batching: sequences in one shared paged arena and the scheduler that fills a step."""
