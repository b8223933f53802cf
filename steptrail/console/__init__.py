"""The operator console: a web page over the reporting views and the log (ADR 0025).

Install with `pip install 'steptrail[console]'` and run `steptrail console`. Importing this
package needs the extra; `import steptrail` never imports it.
"""

from __future__ import annotations

from steptrail.console.app import ConsoleConfig, create_app
from steptrail.console.security import TOKEN_ENV, ConsoleRefused, check_bind, is_loopback
from steptrail.runtime import Runtime

__all__ = [
    "TOKEN_ENV",
    "ConsoleConfig",
    "ConsoleRefused",
    "check_bind",
    "create_app",
    "is_loopback",
    "serve",
]


def serve(rt: Runtime, config: ConsoleConfig) -> None:
    """Check the bind, then serve the console with uvicorn until interrupted.

    Raises:
        ConsoleRefused: a non-loopback host without a token.
    """
    import uvicorn

    check_bind(config.host, config.token)
    uvicorn.run(
        create_app(rt, config),
        host=config.host,
        port=config.port,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
    )
