"""ratemesh for Python: a client of ratemeshd's HTTP API (sync and asyncio), ASGI and WSGI
middleware, and a `limits` storage (``ratemesh://`` and ``async+ratemesh://``, registered on
import when `limits` is installed)."""

from ._model import (
    Check,
    Decision,
    GroupDecision,
    Limit,
    RatemeshError,
    RequestError,
    ServerError,
    UnavailableError,
)
from .client import AsyncClient, Client
from .middleware import RateLimitMiddleware, WSGIRateLimitMiddleware

try:  # registers ratemesh:// and async+ratemesh:// with limits' storage registry
    from .limits_storage import AsyncRatemeshStorage, RatemeshStorage
except ImportError:  # limits is not installed: the client and middleware work without it
    pass

__version__ = "0.1.0"
__all__ = [
    "AsyncClient",
    "Check",
    "Client",
    "Decision",
    "GroupDecision",
    "Limit",
    "RateLimitMiddleware",
    "RatemeshError",
    "RequestError",
    "ServerError",
    "UnavailableError",
    "WSGIRateLimitMiddleware",
]
