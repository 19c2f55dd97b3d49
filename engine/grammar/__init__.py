"""Constrained decoding: a grammar (events/grammar_spec.py) compiled against a model's tokenizer
(compiled.py, cached), and a request's matcher (matcher.py) whose next-token mask the sampler
applies before it draws (step/sampling.py, step/batch_sampling.py). The engine underneath is
llguidance, chosen by measurement against XGrammar (bench/grammar_engines.py,
docs/benchmark-log.md); nothing outside this package names it."""
