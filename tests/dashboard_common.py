"""Shared by the dashboard tests: the tokenizer alphabet of their tiny models, and a caller of
one Dash callback through Dash's own HTTP endpoint (as the browser, or a crafted request,
calls it)."""

from __future__ import annotations

ALPHABET = "abcdefghijklmnopqrstuvwxyz ."


def layout_props(layout, values: dict | None = None) -> dict:
    """Every property of every component with a string id in `layout`, by "id.property"
    (added to `values` when given)."""
    values = {} if values is None else values

    def walk(node):
        if isinstance(node, (list, tuple)):
            for child in node:
                walk(child)
        elif hasattr(node, "to_plotly_json"):
            props = node.to_plotly_json()["props"]
            if isinstance(props.get("id"), str):
                values.update({f"{props['id']}.{k}": v for k, v in props.items()})
            walk(props.get("children"))

    walk(layout)
    return values


def call(app, output_prefix: str, values: dict, changed: str | None = None):
    """POST one callback to /_dash-update-component; returns (status, response dict). The tab
    shown is the callback's page (the first word of `output_prefix`) unless `values` names
    one: hidden pages compute nothing (dashboards/visible.py)."""
    values = {"tabs.value": output_prefix.split("-")[0], **values}
    key = next(k for k in app.callback_map if k.lstrip(".").startswith(output_prefix))
    spec = app.callback_map[key]

    def props(items):
        return [{"id": i["id"], "property": i["property"],
                 "value": values.get(f"{i['id']}.{i['property']}")} for i in items]

    outputs = [{"id": o.split(".")[0], "property": o.split(".")[1].split("@")[0]}
               for o in key.strip(".").split("...")]
    body = {"output": key, "outputs": outputs if key.startswith("..") else outputs[0],
            "inputs": props(spec["inputs"]), "state": props(spec["state"]),
            "changedPropIds": [changed] if changed else []}
    resp = app.server.test_client().post("/_dash-update-component", json=body)
    return resp.status_code, (resp.get_json() if resp.status_code == 200 else None)


def shared(models, layer=0, head=0, stage="pattern", prompt=""):
    """The shared controls' values (model list, prompt, layer, head, stage) of a callback."""
    return {"ctl-models.value": models, "ctl-applied-prompt.data": prompt,
            "ctl-layer.value": layer, "ctl-head.value": head, "ctl-stage.value": stage,
            "explorer-format.value": "png"}


def view_link(app, values: dict, changed: str):
    """POST the controls -> URL callback (`_view_link`, issue 56 item 3) for a change of control
    `changed`: (status, response dict), the view's query string also at
    response["response"]["url"]["search"] (where the URL callback answered it before)."""
    status, resp = call(app, "link-wanted", values, changed=changed)
    if status == 200 and "link-wanted" in resp["response"]:
        resp["response"]["url"] = {"search": resp["response"]["link-wanted"]["data"]["search"]}
    return status, resp
