"""The browser page: type text, pick a model and voice, and hear it segment by segment as it is made."""

from __future__ import annotations

from flask import Blueprint, Response

bp = Blueprint("web", __name__, static_folder="static", static_url_path="/static")


@bp.get("/")
def index() -> Response:
    """Serve the player page."""
    response = bp.send_static_file("index.html")
    response.headers["Cache-Control"] = "no-cache"  # revalidate, so a new page and script are seen at once
    return response
