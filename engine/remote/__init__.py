"""Remote engines: any OpenAI-compatible endpoint (vLLM, SGLang, Ollama, another Hearth) as a
source of answers, for `hearth run --endpoint`, `hearth chat --endpoint` and the window. No
torch, no Qt: the standard library's HTTP client and Hearth's own events.

    for event in stream_chat("http://gpu-box:8000/v1", "Qwen/Qwen2.5-7B-Instruct",
                             GenerateRequest(messages=({"role": "user", "content": "hi"},)),
                             api_key=None, cancel=CancelToken()):
        ...  # Token, Stats, then exactly one Finished or Failed
"""

from engine.remote.base_url import BaseUrl, parse_base_url
from engine.remote.cancel import CancelToken
from engine.remote.client import (
    RemoteModel,
    chat_body,
    check_api_key,
    check_model,
    list_models,
    stream_chat,
)
from engine.remote.failures import RemoteError, mask

__all__ = ["BaseUrl", "CancelToken", "RemoteError", "RemoteModel", "chat_body", "check_api_key",
           "check_model", "list_models", "mask", "parse_base_url", "stream_chat"]
