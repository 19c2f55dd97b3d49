"""`hearth serve`: a local OpenAI-compatible HTTP server (FastAPI, uvicorn, SSE) over one
service.Engine. Needs the `server` extra; nothing below this package imports it.
"""
