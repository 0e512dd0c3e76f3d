"""One web app process of the end-to-end test: python e2e_app.py KIND PORT STORAGE_URI LIMIT STRATEGY.

KIND ``flask``: Flask with Flask-Limiter (served by werkzeug); ``fastapi``: FastAPI with SlowAPI
(served by uvicorn). Both limit ``GET /`` by the client's address with LIMIT ("10/minute") in
the `limits` storage STORAGE_URI (``ratemesh://…``) and STRATEGY."""

import sys

import ratemesh  # noqa: F401  registers ratemesh:// with limits


def flask_app(uri: str, limit: str, strategy: str) -> object:
    from flask import Flask
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    app = Flask(__name__)
    limiter = Limiter(get_remote_address, app=app, storage_uri=uri, strategy=strategy, headers_enabled=True)

    @app.get("/")
    @limiter.limit(limit)
    def index() -> str:
        return "ok"

    @app.get("/healthz")
    def healthz() -> str:
        return "ok"

    return app


def fastapi_app(uri: str, limit: str, strategy: str) -> object:
    from fastapi import FastAPI, Request
    from fastapi.responses import PlainTextResponse
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address

    limiter = Limiter(key_func=get_remote_address, storage_uri=uri, strategy=strategy)
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]

    @app.get("/", response_class=PlainTextResponse)
    @limiter.limit(limit)
    async def index(request: Request) -> str:
        return "ok"

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    return app


def main() -> None:
    kind, port, uri, limit, strategy = sys.argv[1:6]
    if kind == "flask":
        from werkzeug.serving import make_server

        make_server("127.0.0.1", int(port), flask_app(uri, limit, strategy), threaded=True).serve_forever()
    else:
        import uvicorn

        uvicorn.run(fastapi_app(uri, limit, strategy), host="127.0.0.1", port=int(port), log_level="warning")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
