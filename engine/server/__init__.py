"""`hearth serve`: a local HTTP server (FastAPI, uvicorn, SSE) over one service.Engine that
speaks OpenAI's API, and Anthropic's Messages and OpenAI's Responses APIs (protocols/). Needs the
`server` extra; nothing below this package imports it.
"""
