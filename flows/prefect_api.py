"""The Prefect server this process reports to: its address, whether it answers, and a refusal explained."""

from __future__ import annotations

from mygpt.errors import UserError


def prefect_api_url() -> str | None:
    """The Prefect server this process reports to (``PREFECT_API_URL`` or the profile's); None = none set."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def shown_api_url() -> str:
    """``PREFECT_API_URL`` as messages show it: without its user info and query values (a team server's
    ``http://user:password@host/api`` must not reach a terminal or a log)."""
    from tasks.core.urls import redact_url

    return redact_url(prefect_api_url() or "")


def check_prefect_server() -> None:
    """Where ``PREFECT_API_URL`` is set: ``UserError`` unless a Prefect server answers there (its ``/hello``),
    before anything is started against it (else a closed port or another program's port ends in a traceback)."""
    url = prefect_api_url()
    if not url:
        return
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            response = client.hello()
            ok = response.status_code == 200 and response.json() == "👋"
            problem = "" if ok else f"HTTP {response.status_code}, not a Prefect server's answer"
    except Exception as e:  # refused, timed out, not HTTP, not JSON
        if unauthorized(e):
            raise
        from tasks.core.urls import redact_text

        problem = redact_text(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", url)
    if problem:
        raise UserError(
            f"PREFECT_API_URL={shown_api_url()} does not answer as a Prefect server ({problem}); start one there "
            "(scripts/pipeline starts one on 127.0.0.1:4200), fix PREFECT_API_URL, or unset it to let "
            "`wiki-pipeline run` start a server of its own"
        )


def unauthorized(exc: BaseException) -> str | None:
    """What to tell the user when the Prefect server refused our credentials (HTTP 401), else None."""
    response = getattr(exc, "response", None)
    if getattr(response, "status_code", None) != 401:
        return None
    return (
        f"the Prefect server at {shown_api_url()} refused this request (401 Unauthorized): it has basic auth on; "
        "set PREFECT_API_AUTH_STRING to its user:password (the server's PREFECT_SERVER_API_AUTH_STRING)"
    )
