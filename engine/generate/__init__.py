"""The batch loop every generation runs in (BatchRun; a single chat is a batch of one), the
Session over a loaded model, prompts and chat templates, the detokenizer and the loop guard."""
