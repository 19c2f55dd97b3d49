"""What `hearth serve` answers under its base URL, by protocol: the window's Server tab lists
them, and the server's tests check that each is served. Pure data, for the app and the engine."""

SERVER_ROUTES = (("OpenAI", ("/v1/chat/completions", "/v1/completions", "/v1/responses",
                             "/v1/models")),
                 ("Anthropic", ("/v1/messages", "/v1/messages/count_tokens")))
