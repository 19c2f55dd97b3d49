"""Remote OpenAI-compatible endpoints: the saved list, their keys, listing models and the client."""
