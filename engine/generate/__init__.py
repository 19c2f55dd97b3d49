"""The session loop: prompts and chat templates, the detokenizer, one conversation's turns."""
