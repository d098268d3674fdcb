"""Optional OIDC login for the dashboard through streamlit's `st.login` (needs Authlib).

Login is off unless the app's secrets (`.streamlit/secrets.toml`) hold an `[auth]` section (`redirect_uri`,
`cookie_secret`, `client_id`, `client_secret`, `server_metadata_url`; see the README). With it, everything that
changes something (annotation editing on the Runs page, the New run page) needs `st.user.is_logged_in`; reading
stays open. SPECLENS_REQUIRE_LOGIN=1 makes those parts refuse outright when no `[auth]` section is configured
(fail closed instead of open).

Pages call `require_login("submit jobs")` at the top of a page that only a logged-in user may use (it stops the
page with a login button otherwise), or `allowed("edit tags")` around a section (False: the section is replaced
by a login button and the rest of the page still renders).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import streamlit as st


def configured() -> bool:
    """Whether the app's secrets hold an `[auth]` section (login on)."""
    try:
        section = st.secrets.get("auth")                # st.secrets read at call time: AppTest replaces it
    except Exception:  # noqa: BLE001 - no secrets.toml at all (StreamlitSecretNotFoundError) or an unreadable one
        return False
    return isinstance(section, Mapping) and bool(section)


def required() -> bool:
    """SPECLENS_REQUIRE_LOGIN=1: changing anything needs a login, and is refused when login is not configured."""
    return os.environ.get("SPECLENS_REQUIRE_LOGIN", "").strip().lower() in ("1", "true", "yes", "on")


def logged_in() -> bool:
    try:
        return bool(st.user.get("is_logged_in", False))
    except Exception:  # noqa: BLE001 - outside a session: nobody is logged in
        return False


def user_label() -> str:
    """Who is logged in (email, else name, else 'logged in')."""
    return str(st.user.get("email") or st.user.get("name") or "logged in")


def allowed(what: str, *, where=st) -> bool:
    """May the current session `what` (e.g. "edit tags, notes and the baseline")? True without login configured
    (and not required) or when logged in; otherwise shows why, with a login button when login is configured, and
    returns False."""
    if not configured():
        if required():
            where.error(f"Login is required to {what}, but no [auth] section is configured in the app's secrets "
                        "(.streamlit/secrets.toml).", icon=":material/lock:")
            return False
        return True
    if logged_in():
        return True
    where.info(f"Log in to {what}.", icon=":material/lock:")
    if where.button("Log in", key=f"login_{abs(hash(what))}", icon=":material/login:"):
        try:
            st.login()
        except Exception as e:  # noqa: BLE001 - e.g. Authlib missing: one line, not a traceback
            where.error(f"Login failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return False


def require_login(what: str = "use this page") -> None:
    """Stop the page unless the current session may `what` (see `allowed`); shows who is logged in otherwise."""
    if not allowed(what):
        st.stop()
    if configured() and logged_in():
        st.caption(f"Logged in as {user_label()}.")
