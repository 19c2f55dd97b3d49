"""The routes of Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) and OpenAI's
Responses API (/v1/responses) on the app: each request converted to the chat route's, submitted
and answered through it (chat_path.py), whole or streamed, in its own protocol's shape.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.server.protocols import messages, messages_stream, responses_api, responses_stream
from engine.server.protocols.chat_path import checked, submit, whole
from engine.server.protocols.conversations import Conversations

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _streamed(lines) -> StreamingResponse:
    return StreamingResponse(lines, media_type="text/event-stream", headers=STREAM_HEADERS)


def install(app: FastAPI) -> None:
    conversations = app.state.conversations = Conversations()

    @app.post("/v1/messages")
    async def create_message(body: messages.MessagesRequest, request: Request):
        shape = await submit(request, messages.to_chat(body), "msg", messages.RENAMED)
        if body.stream:
            return _streamed(messages_stream.events(shape, request, body))
        answer = await whole(shape, request)
        choice, reason = answer["choices"][0], shape.gen.reasons.get(0)
        return JSONResponse(messages.message(
            shape.gen.id, body.model, messages.from_chat(choice["message"]),
            messages.stop_reason(choice["finish_reason"], reason),
            messages.stop_sequence(reason, body), shape.prompt_tokens,
            shape.completion_tokens))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: messages.CountTokensRequest, request: Request):
        # the prompt as a generation would see it (template, tools), generating nothing
        choices = await checked(request, messages.to_chat(body), messages.RENAMED)
        return {"input_tokens": choices[0].prompt_tokens}

    @app.post("/v1/responses")
    async def create_response(body: responses_api.ResponsesRequest, request: Request):
        chat, conversation = responses_api.to_chat(
            body, conversations.history(body.previous_response_id))
        shape = await submit(request, chat, "resp", responses_api.RENAMED)

        def keep(message: dict) -> None:
            if body.store:
                conversations.keep(shape.gen.id, [*conversation,
                                                  responses_api.answer_message(message)])

        if body.stream:
            return _streamed(responses_stream.events(shape, request, body, keep))
        answer = await whole(shape, request)
        choice = answer["choices"][0]
        keep(choice["message"])
        output = responses_api.from_chat(choice["message"], shape.gen.id)
        return JSONResponse(responses_api.response(
            shape.gen.id, body, output, responses_api.status_of(choice["finish_reason"]),
            answer["usage"]))
