"""The session loop: prompts and chat templates, the detokenizer and the loop guard, one
conversation's turns."""
