"""`prefect server start` with a Host check in front: Starlette's TrustedHostMiddleware (Prefect 3.9 has no setting
for it), so that a page on another origin whose name resolves to 127.0.0.1 (DNS rebinding) cannot reach the API:
its requests carry its own name as Host and are refused (400). Otherwise as Prefect runs its server with one worker
(`prefect.cli._server_utils._run_in_foreground`): the app of `create_app(final=True)` under uvicorn, its settings
from the environment.

    python -m flows.prefect_server --host 127.0.0.1 --port 4200 [--allowed-hosts name,name]
"""

from __future__ import annotations

import argparse


def allowed_hosts(host: str, extra: str | None) -> list[str]:
    """The Host names the server answers: loopback, the address it binds (unless a wildcard), and `extra`."""
    from infra.local_stack import LOOPBACK

    names = [*LOOPBACK, *(h.strip() for h in (extra or "").split(",") if h.strip())]
    if host not in ("0.0.0.0", "::", ""):
        names.append(host)
    return list(dict.fromkeys(names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4200)
    parser.add_argument("--allowed-hosts", default=None, help="comma-separated names besides loopback and --host")
    args = parser.parse_args()

    import prefect
    import uvicorn
    from prefect.server.api.server import create_app
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    app = TrustedHostMiddleware(create_app(final=True), allowed_hosts=allowed_hosts(args.host, args.allowed_hosts))
    uvicorn.run(app, app_dir=str(prefect.__module_path__.parent), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
