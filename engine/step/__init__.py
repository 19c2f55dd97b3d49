"""The runner under the batch loop: a step's rows (decode rows, verify rows, prefill chunks)
through the batched decoder (batched.py: CUDA graphs per rows and KV bucket; one row runs the
Decoder's own step, decode.py, with its graphs per bucket), prefill chunks as graphs
(prefill_graphs.py), and what turns logits into tokens: sampling, a batch's rows sampled at once,
penalties, logprobs."""
