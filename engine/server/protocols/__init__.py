"""The other protocols `hearth serve` speaks besides chat completions: Anthropic's Messages API
and OpenAI's Responses API. Each converts its request to a chat-completions request and its
answer back, so the engine, batching, limits, prompts and tools are the chat route's own.
"""
