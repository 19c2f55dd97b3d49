"""The chat window's contents: the controller that drives a reply, the message views and their
Markdown, and the conversation list."""
