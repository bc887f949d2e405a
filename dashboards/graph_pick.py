"""The Attribution graph page's picked node, marked in the figure (issue 56 item 6).

A node picked from the list under the plot (or clicked: a click also sets the list) showed its
details, but nothing in the figure said which of a crowded cell's dots it was. This browser-side
callback marks it: plotly's `selectedpoints` on the node traces (each point's `customdata` is
its node index, `attnlens.interp.plots.attribution_graph`) keeps the picked node at full
strength and larger, and fades the others; no pick, no marking. Nothing goes to the server.
It lives apart from pages/graph.py, which builds the graph and its list.
"""

from __future__ import annotations

from dash import Input

MARK_JS = """function(picked, figure) {
    const want = (figure && figure.data) ? figure.data.length : 0;
    let tries = 0;
    function mark() {
        const g = document.querySelector('#graph-figure .js-plotly-plot');
        if (!window.Plotly || !g || !g.data || g.data.length !== want || !want) {
            if (++tries < 100) { setTimeout(mark, 50); }
            return;
        }
        const traces = [], chosen = [];
        g.data.forEach((t, i) => {
            if (!t.customdata || !String(t.mode || '').includes('markers')) { return; }
            traces.push(i);
            const hits = [];
            if (picked !== null && picked !== undefined) {
                Array.from(t.customdata).forEach((c, j) => { if (c === picked) { hits.push(j); } });
            }
            chosen.push(picked === null || picked === undefined ? null : hits);
        });
        if (!traces.length) { return; }
        window.Plotly.restyle(g, {
            selectedpoints: chosen,
            'selected.marker.size': traces.map(() => 22),
            'selected.marker.opacity': traces.map(() => 1),
            'unselected.marker.opacity': traces.map(() => 0.25)}, traces);
    }
    setTimeout(mark, 0);
}"""


def register(app) -> None:
    """Mark the picked node whenever the pick or the drawn graph changes."""
    app.clientside_callback(MARK_JS, Input("graph-pick", "value"),
                            Input("graph-figure", "figure"), prevent_initial_call=True)
