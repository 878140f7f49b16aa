"""`python -m observatory.dashboard.serve run app.py ...`: `streamlit run`, with what a public visitor does not need shut.

Streamlit has no setting for these, so `observatory dashboard` starts it through here, and
`harden()` changes them before the server starts:

- `/_stcore/metrics` (the server's session and cache figures, for anyone) is not served;
- each session's first message (`new_session`) names the script `app.py`, not its absolute
  path on the server, and carries no installation ids, Python version or server OS.

The rest is Streamlit's own settings (`observatory/.streamlit/config.toml`).
tests/test_public_server.py starts a real server this way and reads what a browser gets.
"""

from __future__ import annotations

import os
import sys

__all__ = ["harden", "main"]

SCRIPT_NAME = "app.py"  # what a visitor is told the script is


def harden() -> None:
    """Patch the Streamlit server of this process (call before it starts; again is harmless)."""
    from streamlit.runtime import app_session
    from streamlit.web.server.starlette import starlette_app

    starlette_app.create_metrics_routes = _no_routes
    if not getattr(app_session.AppSession._create_new_session_message, "_observatory", False):
        original = app_session.AppSession._create_new_session_message

        def new_session_message(self, *args, **kwargs):
            msg = original(self, *args, **kwargs)
            ns = msg.new_session
            ns.main_script_path = os.path.basename(ns.main_script_path) or SCRIPT_NAME
            info = ns.initialize
            info.user_info.installation_id = ""
            info.user_info.installation_id_v3 = ""
            info.user_info.installation_id_v4 = ""
            info.environment_info.python_version = ""
            info.environment_info.server_os = ""
            return msg

        new_session_message._observatory = True
        app_session.AppSession._create_new_session_message = new_session_message


def _no_routes(*args, **kwargs) -> list:
    return []


def main() -> None:
    """`streamlit` with this process hardened: the arguments are `streamlit`'s (`run app.py --server.port ...`)."""
    harden()
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
