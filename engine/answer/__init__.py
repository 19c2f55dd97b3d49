"""A chat answer's text read as OpenAI's message parts: reasoning apart from content, and the
model family's own tool-call syntax parsed into calls, incrementally (streams) or whole."""
