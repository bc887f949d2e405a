"""The server's guards for crafted callback requests (issue 56 item 3): an envelope posted to
/_dash-update-component that is not a callback request of this app gets 400 with a message
before Dash reads it, and an error that a callback did not turn into a message of its own page
is shown in the app's error box (`APP_ERROR`) instead of answering 500.

Pages still check their values and say what is wrong in their own boxes
(`attnlens.dashboards.figures`); this is the net under them.
"""

from __future__ import annotations

import json
import logging

from dash import set_props

APP_ERROR = "app-error"       # the app-wide error box (dashboards/app.py's layout)
log = logging.getLogger(__name__)


def _props(items, what: str, spec: list) -> str | None:
    """Why `items` (a request's inputs or state) do not match the callback's `spec`, or None."""
    if not isinstance(items, list):
        return f"{what} must be a list of {{id, property, value}}, got {type(items).__name__}"
    if len(items) != len(spec):
        return f"{what} has {len(items)} entries; this callback takes {len(spec)}"
    for item, want in zip(items, spec, strict=True):
        if not isinstance(item, dict) or item.get("id") != want["id"] \
                or item.get("property") != want["property"]:
            return f"{what} entry {item!r:.80} is not {want['id']}.{want['property']}"
    return None


def envelope_problem(callback_map: dict, body) -> str | None:
    """Why `body` (a parsed /_dash-update-component request) is not a request for one of the
    callbacks in `callback_map` (Dash's `app.callback_map`), or None when it is one."""
    if not isinstance(body, dict):
        return f"the request must be a JSON object, got {type(body).__name__}"
    output = body.get("output")
    if not isinstance(output, str) or output not in callback_map:
        return f"'output' {output!r:.80} names no callback of this app"
    spec = callback_map[output]
    if "callback" not in spec:
        return f"'output' {output[:80]!r} is a callback the browser runs, not the server"
    # the browser leaves "state" out when the callback has none
    for key, given in (("inputs", body.get("inputs")), ("state", body.get("state", []))):
        problem = _props(given, key, spec[key])
        if problem:
            return problem
    outputs = body.get("outputs")
    n_outputs = len(output.strip(".").split("...")) if output.startswith("..") else 1
    listed = outputs if isinstance(outputs, list) else [outputs]
    if (isinstance(outputs, list) != output.startswith("..")) or len(listed) != n_outputs \
            or not all(isinstance(o, dict) and isinstance(o.get("id"), str)
                       and isinstance(o.get("property"), str) for o in listed):
        return f"'outputs' must name the callback's {n_outputs} output(s) as {{id, property}}"
    changed = body.get("changedPropIds", [])
    known = {f"{i['id']}.{i['property']}" for i in spec["inputs"]}
    if not isinstance(changed, list) or not all(isinstance(c, str) and c in known
                                                for c in changed):
        return f"'changedPropIds' must list inputs of this callback ({', '.join(sorted(known))})"
    return None


def guard_envelopes(app) -> None:
    """Answer 400 with a message to a malformed callback request (null, [], no inputs, an
    unknown output, inputs that are not the callback's), instead of Dash's 500."""
    from flask import Response, request

    @app.server.before_request
    def _check_envelope():
        if request.method != "POST" or not request.path.endswith("/_dash-update-component"):
            return None
        body = request.get_json(silent=True)
        if body is None and request.get_data(cache=True).strip() != b"null":
            problem = "the request body is not JSON"
        else:
            problem = envelope_problem(app.callback_map, body)
        if problem is None:
            return None
        return Response(json.dumps({"error": f"malformed callback request: {problem}"}),
                        status=400, mimetype="application/json")


def on_callback_error(err: Exception):
    """Dash's `on_error`: a callback raised instead of showing a message in its page. The
    outputs are left as they are and the app's error box says what went wrong."""
    log.warning("callback error: %r", err, exc_info=err)
    text = str(err) or type(err).__name__
    set_props(APP_ERROR, {"children": f"this request could not be answered "
                                      f"({type(err).__name__}: {text[:300]})"})
