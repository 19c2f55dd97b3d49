"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and on Anthropic's
routes (/v1/messages) in Anthropic's, `{"type": "error", "error": {"type", "message"}}`, with the
status codes each SDK maps to its exception classes; bad input is never a 500.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
         404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
         503: "server_error"}
# Anthropic's error types by status (its SDK reads the status; clients show the type)
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 499: "api_error", 503: "overloaded_error"}
ANTHROPIC_PATHS = ("/v1/messages",)


class APIError(Exception):
    """An answer that is not a completion: raised anywhere below a route, sent as is."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self, path: str = "") -> dict:
        return shaped_body(path, self.status, self.message, self.param, self.code)

    def response(self, path: str = "") -> JSONResponse:
        return JSONResponse(self.body(path), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    kind = TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def anthropic_error_body(status: int, message: str) -> dict:
    kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_anthropic(path: str) -> bool:
    return path.startswith(ANTHROPIC_PATHS)


def shaped_body(path: str, status: int, message: str, param: str | None = None,
                code: str | None = None) -> dict:
    """The error body in the shape of the protocol that `path` speaks."""
    if is_anthropic(path):
        return anthropic_error_body(status, message)
    return error_body(status, message, param, code)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "the request body is not valid", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if not loc:  # the body itself: not an object, or not sent as JSON
        return ("the request body must be a JSON object, sent with Content-Type: "
                "application/json"), None
    param = ".".join(loc) or None
    msg = " ".join(str(first.get("msg", "is not valid")).split())
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return (f"{param}: {msg}{more}" if param else f"{msg}{more}"), param


def install(app: FastAPI) -> None:
    """Every error the app can raise, answered in the shape of the route's protocol."""

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError):
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return JSONResponse(shaped_body(request.url.path, 400, message, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(
            exc.status_code, str(exc.detail))
        return JSONResponse(shaped_body(request.url.path, exc.status_code, message),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):  # a bug here, never the client's
        message = f"internal error: {type(exc).__name__}"
        return JSONResponse(shaped_body(request.url.path, 500, message), status_code=500)
